"""`argus server` never prints a store password."""

from __future__ import annotations

from argus.server import _without_password


def test_the_printed_store_url_has_no_password() -> None:
    assert _without_password("clickhouse://argus:s3cret@ch.example:8123/argus") == (
        "clickhouse://argus:***@ch.example:8123/argus"
    )
    assert (
        _without_password("clickhouses://argus:s3cret@ch.example/db")
        == "clickhouses://argus:***@ch.example/db"
    )
    assert (
        _without_password("clickhouse://argus@ch.example:8123/db") == "clickhouse://argus@ch.example:8123/db"
    )
    assert _without_password("chdb://./argus-data") == "chdb://./argus-data"

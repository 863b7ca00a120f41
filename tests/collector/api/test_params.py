"""Query parameter parsing: epoch ns / RFC 3339 times, rank sets, cursors."""

from __future__ import annotations

import pytest

from argus.collector.api.params import (
    BadParameter,
    decode_cursor,
    encode_cursor,
    parse_ranks,
    parse_time_ns,
)


def test_time_epoch_ns_and_rfc3339_agree() -> None:
    assert parse_time_ns("start", "1718000000123456789") == 1718000000123456789
    assert parse_time_ns("start", "2024-06-10T06:13:20.123456789Z") == 1718000000123456789
    assert parse_time_ns("start", "2024-06-10T08:13:20.5+02:00") == 1718000000500000000
    assert parse_time_ns("start", "1970-01-01T00:00:00Z") == 0


@pytest.mark.parametrize(
    "value",
    [
        "",
        "yesterday",
        "2024-06-10",
        "2024-06-10T06:13:20",
        "-5",
        "99999999999999999999",
        "2024-13-01T00:00:00Z",
    ],
)
def test_time_rejects(value: str) -> None:
    with pytest.raises(BadParameter, match="start"):
        parse_time_ns("start", value)


def test_ranks_ranges_merge() -> None:
    ranks = parse_ranks("ranks", "5-7,0,1,6,9-9")
    assert ranks.ranges == ((0, 1), (5, 7), (9, 9))
    assert 6 in ranks and 8 not in ranks


@pytest.mark.parametrize("value", ["", "a", "3-1", "1,,2", "-1", "5-", "4294967296", ",".join(["1"] * 1001)])
def test_ranks_rejects(value: str) -> None:
    with pytest.raises(BadParameter, match="ranks"):
        parse_ranks("ranks", value)


def test_cursor_round_trip_and_tampering() -> None:
    cursor = encode_cursor([1718000000123456789, "job-7"])
    assert decode_cursor(cursor, (int, str)) == [1718000000123456789, "job-7"]
    for bad in ["", "!!!", encode_cursor(["x", "y"]), encode_cursor([1]), "bm90IGpzb24"]:
        with pytest.raises(BadParameter, match="cursor"):
            decode_cursor(bad, (int, str))

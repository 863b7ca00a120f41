"""The suite's guard against a test that leaves an embedded store open (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")

LEAKY = """
from argus.store import ClickHouseStore


def test_a_leaves_its_store_open(tmp_path):
    ClickHouseStore(f"chdb://{tmp_path}/a").query("SELECT 1")
    global KEPT
    KEPT = ClickHouseStore(f"chdb://{tmp_path}/a")


def test_b_opens_another_data_dir(tmp_path):
    store = ClickHouseStore(f"chdb://{tmp_path}/b")
    try:
        assert store.query("SELECT 41 + 1 AS x").column("x").to_pylist() == [42]
    finally:
        store.close()
"""


def test_a_store_left_open_fails_its_test_and_not_the_next(pytester: pytest.Pytester) -> None:
    """Without the guard test_b fails ("EmbeddedServer already initialized"); with it, test_a errors."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_leak=LEAKY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_a_leaves_its_store_open*", "*left 1 embedded store*"]
    )

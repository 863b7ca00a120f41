"""Must show 3 of issue 13: without namespaces the multi-node tests skip with the reason; in CI they fail."""

from __future__ import annotations

import os

import pytest

from argus.demo.netns import netns_unavailable
from tests.cluster.harness import ENV_REQUIRE, require


def test_without_root_the_reason_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netns_unavailable() == "network namespaces need root (ip netns, veth pairs, bridges, tc)"


def test_a_missing_tool_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert netns_unavailable() == "`ip` is not installed (iproute2 / util-linux)"


def test_the_reason_skips_and_under_argus_require_netns_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_REQUIRE, raising=False)
    with pytest.raises(pytest.skip.Exception, match="need root"):
        require("network namespaces need root")
    monkeypatch.setenv(ENV_REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match="ARGUS_REQUIRE_NETNS=1 but network namespaces need root"):
        require("network namespaces need root")
    require(None)  # available: nothing happens

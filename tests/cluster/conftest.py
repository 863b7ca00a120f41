"""Multi-node tests in network namespaces (root only).

Each test builds its own nodes (:class:`argus.demo.netns.Cluster`) and removes them at
teardown, also when it fails. Where namespaces cannot be made (not root, no
iproute2, no ``CAP_NET_ADMIN``) the tests skip with the reason; with
``ARGUS_REQUIRE_NETNS=1`` (``.ci/run`` sets it) they fail instead, so that CI
never passes by skipping them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from argus.demo.netns import Cluster, netns_unavailable
from tests.cluster.harness import require


@pytest.fixture
def cluster3() -> Iterator[Cluster]:
    """Three nodes in network namespaces, removed at teardown."""
    require(netns_unavailable())
    with Cluster(3) as cluster:
        yield cluster

"""`argus demo`: the demo on one machine (:mod:`argus.demo.local`), or on nodes in network
namespaces (:mod:`argus.demo.nodes`, which builds on the first: never the other way round)."""

from __future__ import annotations

import argparse

from argus.demo import local, nodes

__all__ = ["main"]


def main(args: argparse.Namespace) -> int:
    """Run the demo `argus demo`'s options ask for; 0 when it ran (whatever it found).

    Raises:
        ConfigError: an option the chosen demo cannot use (the message names it).
    """
    if args.nodes > 1 or args.scenario == "slow_link":  # the slow link is one between two nodes
        return nodes.main(args)
    return local.main(args)

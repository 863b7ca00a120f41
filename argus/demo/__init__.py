"""The demo and the one-machine cluster: what `argus demo` runs, and nothing a service imports.

- :mod:`argus.demo.local`: `argus demo` on one machine (server, node agent, job).
- :mod:`argus.demo.nodes`: `argus demo --nodes N`, the same on N nodes in network namespaces.
- :mod:`argus.demo.job`: the training job (``python -m argus.demo.job``) with its faults.
- :mod:`argus.demo.multinode`: a job across the nodes of a cluster, under Argus.
- :mod:`argus.demo.netns`: the nodes of one machine (network namespaces, links, ``tc``).
"""

__all__: list[str] = []

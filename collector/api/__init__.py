"""The REST API, ``/metrics``, ``/healthz`` and the page of an `argus server` (docs/design.md §9).

Modules: :mod:`~argus.collector.api.app` builds the FastAPI app (auth, ``/metrics``, the page);
:mod:`~argus.collector.api.routes` declares the ``/api/v1`` endpoints, each a thin call into a
reader — :mod:`~argus.collector.api.jobs` (jobs, ranks, status), :mod:`~argus.collector.api.heatmap`,
:mod:`~argus.collector.api.trace` (Chrome trace export) — with query parameters parsed by
:mod:`~argus.collector.api.params`, bodies declared in :mod:`~argus.collector.api.models` and
Argus errors mapped to HTTP statuses once, in :mod:`~argus.collector.api.errors`.
"""

from argus.collector.api.app import create_app

__all__ = ["create_app"]

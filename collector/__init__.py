"""Collector side: gRPC ingest (:mod:`~argus.collector.grpc_service`, :mod:`~argus.collector.ingest`,
:mod:`~argus.collector.writer`), the REST API (:mod:`argus.collector.api`) and trace import
(:mod:`argus.collector.importer`). The store and the metrics it shares with the analyzer are in
:mod:`argus.store` and :mod:`argus.metrics`; `argus server` wires them together in :mod:`argus.server`.
"""

__all__: list[str] = []

"""Collector side: gRPC ingest, the ClickHouse store backends, the REST API and Prometheus metrics."""

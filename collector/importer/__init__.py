"""Import of PyTorch profiler (Kineto) traces into the tables live capture fills (docs/design.md §8.3).

:mod:`~argus.collector.importer.kineto` parses a trace file, streaming, into columns;
:mod:`~argus.collector.importer.tables` turns them into the rows of each table;
:mod:`~argus.collector.importer.load` writes them, all or nothing, and is `argus import`.
"""

from argus.collector.importer.load import ImportResult, default_job_id, import_parsed, import_traces, main

__all__ = ["ImportResult", "default_job_id", "import_parsed", "import_traces", "main"]

"""Synthetic data for tests and benchmarks, outside the installed package.

- :mod:`synthetic.jobs` — labelled synthetic training jobs (faults of every cause) played step by
  step, as analysis windows and as store rows: the analyzer's tests and ``bench/detection.py``;
- :mod:`synthetic.wire` — a small job's wire tables and two ways to store them (``Store.insert``,
  a real gRPC collector): the REST API's tests and ``bench/api.py``;
- :mod:`synthetic.layout3d` — windows of a pipeline × tensor × data parallel job: the analyzer's
  attribution tests and ``bench/analyzer_scale.py``;
- :mod:`synthetic.bad_inputs` — bad inputs as a buggy process or an attacker on a node sends them
  (corrupt probe frames, crafted rows, ZSTD batches that inflate): the hardening tests and
  ``bench/soak.py``;
- :mod:`synthetic.kineto` — a many-rank GPU job resampled from the kernels of one real Kineto
  trace: the importer's tests and ``bench/compression.py``.

Tests import it from the repository root (pytest puts it on ``sys.path``); benchmarks add the root
themselves.
"""

__all__: list[str] = []

"""Analyzer: progressive fail-slow diagnosis (L1 iteration, L2 phase, L3 kernel), causes and lifecycle.

Modules, in the order data flows through them:

- :mod:`~argus.analyzer.store_io` — reads a job's window from the store into NumPy columns
  (:mod:`~argus.analyzer.window`), writes diagnoses back;
- :mod:`~argus.analyzer.collectives` — wait/transfer decomposition, clock offsets, slow links;
- :mod:`~argus.analyzer.iteration` (L1), :mod:`~argus.analyzer.phase` (L2),
  :mod:`~argus.analyzer.kernels` (L3, with :mod:`~argus.analyzer.wasserstein`),
  :mod:`~argus.analyzer.host`, :mod:`~argus.analyzer.liveness` — pure functions over a window;
- :mod:`~argus.analyzer.robust` — the one-sided outlier rule every level uses;
- :mod:`~argus.analyzer.causes` — one cause per finding; :mod:`~argus.analyzer.lifecycle` —
  findings become diagnoses that open, update and resolve;
- :mod:`~argus.analyzer.pipeline` — one job's analysis, window after window, without I/O;
- :mod:`~argus.analyzer.service` — :class:`~argus.analyzer.service.Analyzer` and `argus analyze`.

Labelled synthetic jobs for its tests and benchmarks live outside the package, in ``synthetic/``.
"""

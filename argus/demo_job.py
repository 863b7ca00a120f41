"""``python -m argus.demo_job``: the documented command of the demo's training job, kept working
since the job moved to :mod:`argus.demo.job` (which this runs as ``__main__``, arguments and all)."""

from __future__ import annotations

import runpy

__all__: list[str] = []

if __name__ == "__main__":
    runpy.run_module("argus.demo.job", run_name="__main__", alter_sys=True)

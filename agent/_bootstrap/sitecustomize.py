"""Run at start-up by every Python process under `argus run` (this folder is on PYTHONPATH).

Installs the automatic-attach import hook (:mod:`argus.agent.autoattach`) unless
``ARGUS_DISABLE`` is set, then runs the ``sitecustomize`` this one shadows, if any.
Errors are reported on stderr and never stop the process.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _chain_previous() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_argus_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


def _main() -> None:
    if os.environ.get("ARGUS_AUTOATTACH") == "1":  # argus.config.ENV_AUTOATTACH, set by `argus run`
        try:
            from argus.config import ENV_DISABLE, env_flag

            if not env_flag(ENV_DISABLE):
                from argus.agent import autoattach

                autoattach.install()
        except Exception as exc:  # never stop the job
            print(f"argus: automatic attach unavailable: {exc}", file=sys.stderr)
    try:
        _chain_previous()
    except Exception as exc:
        print(f"argus: the shadowed sitecustomize failed: {exc}", file=sys.stderr)


_main()

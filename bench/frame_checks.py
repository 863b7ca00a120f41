"""CPU the node agent spends checking each probe frame (issue 39 items 1 and 8).

Per frame, the agent now validates every Arrow buffer (``validate(full=True)``, in
:func:`argus.agent.protocol.decode_batch`) and applies the collector's row rules
(:func:`argus.rowrules.drop_bad_rows`) before it merges the frame's rows. This times, on
typical clean frames, the decode as before (IPC read + schema check), the full validation and
the row rules, interleaved round by round; figures are medians over ``--rounds`` in
microseconds per frame. The last line is ``key=value``.

    python bench/frame_checks.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pyarrow as pa

from argus.agent.protocol import decode_batch, encode_batch
from argus.rowrules import drop_bad_rows
from argus.schema import wire_schema, with_defaults


def frames() -> dict[str, tuple[str, bytes]]:
    """Clean frames of the sizes a probe ships each second: kernel events of a busy rank, a few
    steps, the collectives of those steps."""
    rng = np.random.default_rng(0)
    n = 2_000
    kernels = pa.Table.from_pydict(
        {
            "rank": [3] * n,
            "kind": ["kernel"] * n,
            "kernel": [f"ampere_sgemm_128x64_nn_{i % 40}" for i in range(n)],
            "stream": [7] * n,
            "device": [0] * n,
            "correlation": list(range(n)),
            "start_ns": (1_700_000_000_000_000_000 + np.arange(n) * 5_000).tolist(),
            "dur_ns": rng.integers(1_000, 100_000, n).tolist(),
            "graph_id": [0] * n,
            "graph_node_id": [0] * n,
        },
        schema=wire_schema("kernel_events"),
    )
    steps = pa.Table.from_pydict(
        {"rank": [3] * 16, "step": list(range(16)), "start_ns": list(range(16)), "dur_ns": [9] * 16},
        schema=wire_schema("steps"),
    )
    return {
        "kernel_events_2000": ("kernel_events", encode_batch(1, "kernel_events", kernels)[13:]),
        "steps_16": ("steps", encode_batch(1, "steps", steps)[13:]),
    }


def _decode_unchecked(payload: bytes, table: str) -> pa.Table:
    """The decode as it was before: IPC read, defaults, schema check; no buffer validation."""
    data = with_defaults(table, pa.ipc.open_stream(payload[1:]).read_all())
    assert data.schema.equals(wire_schema(table))
    return data


def _us(fn: object, reps: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(reps):
        fn()  # type: ignore[operator]
    return (time.perf_counter_ns() - t0) / reps / 1_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--reps", type=int, default=20, help="frames timed per round and arm")
    args = parser.parse_args()
    out: dict[str, float] = {}
    for name, (table, payload) in frames().items():
        data = decode_batch(payload)[1]
        arms: dict[str, list[float]] = {"decode": [], "validate": [], "rules": []}
        for _ in range(args.rounds):
            arms["decode"].append(_us(lambda p=payload, t=table: _decode_unchecked(p, t), args.reps))
            arms["validate"].append(_us(lambda d=data: d.validate(full=True), args.reps))
            arms["rules"].append(_us(lambda d=data, t=table: drop_bad_rows(t, d), args.reps))
        for arm, times in arms.items():
            out[f"{name}_{arm}_us"] = round(statistics.median(times), 1)
        print(f"{name}: {len(payload)} bytes, " + ", ".join(f"{a} {out[f'{name}_{a}_us']} us" for a in arms))
    print(" ".join(f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()

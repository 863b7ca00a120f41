"""Recorded real jobs: what the node agents of real 4-rank gloo jobs streamed, kept as Parquet.

A live job on a shared 2-core machine never runs the same way twice, so a test that asserts
the analyzer's exact verdict on one flips with the machine's load. These recordings keep the
data of real jobs (the jobs of ``test_real_runs.JOBS``, under `argus run`, stored by a real
`argus server`) so that the analyzer's verdict on them is a fact a test can pin:
``test_recorded_runs`` analyses them; ``test_real_runs`` keeps recording live jobs.

Layout: ``tests/data/real_runs/<recording>/<table>.parquet``, one file per wire table
(:data:`argus.schema.WIRE_TABLES`: what the agents send), rows of the ``real-*`` jobs only, the
columns as stored without ``stored_at``. Each recording's ``README`` says how and where it was
made.

Make one (about 12 minutes; the folder name is the recording's)::

    ARGUS_TEST_REAL_RUNS=all pytest tests/analyzer/test_real_runs.py --basetemp=/tmp/rr -p no:cacheprovider
    python -m tests.analyzer.recordings chdb:///tmp/rr/real-runs0/data tests/data/real_runs/NAME
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from argus.schema import WIRE_TABLES
from argus.store import Store, open_store

__all__ = ["RECORDINGS", "export_recording", "load_recording", "recording_jobs"]

#: Where the recordings live.
RECORDINGS = Path(__file__).resolve().parent.parent / "data" / "real_runs"
#: The job ids a recording keeps: test_real_runs names its jobs ``real-<name>``.
_JOB_PREFIX = "real-"


def export_recording(store: Store, out: Path, prefix: str = _JOB_PREFIX) -> dict[str, int]:
    """Write the rows of the jobs whose ids start with ``prefix`` (``real-*``) of every wire table
    in ``store`` to ``out/<table>.parquet``.

    Returns:
        Rows written per table.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for table in WIRE_TABLES:
        rows = store.query(
            f"SELECT * EXCEPT (stored_at) FROM {table} WHERE startsWith(job_id, {{prefix:String}}) "
            "ORDER BY ALL",
            {"prefix": prefix},
        )
        # Times and counts are integers that grow slowly along a rank: delta-encoded, a third smaller.
        ints = [f.name for f in rows.schema if pa.types.is_integer(f.type)]
        others = [f.name for f in rows.schema if f.name not in ints]
        pq.write_table(
            rows, out / f"{table}.parquet", compression="zstd", compression_level=19,
            use_dictionary=others, column_encoding=dict.fromkeys(ints, "DELTA_BINARY_PACKED"),
        )  # fmt: skip
        written[table] = rows.num_rows
    return written


def load_recording(store: Store, recording: Path) -> None:
    """Insert a recording's rows into ``store`` (whose tables must not hold those jobs yet).

    A wire table added after the recording was made (its file absent) holds none of its rows.

    Raises:
        FileNotFoundError: ``recording`` is not a recording (it lacks ``jobs.parquet``).
    """
    if not (recording / "jobs.parquet").is_file():
        raise FileNotFoundError(recording / "jobs.parquet")
    for table in WIRE_TABLES:
        path = recording / f"{table}.parquet"
        if not path.is_file():
            continue
        rows = pq.read_table(path)
        if rows.num_rows:
            store.insert(table, rows)


def recording_jobs(recording: Path) -> list[str]:
    """The job ids a recording holds, sorted."""
    jobs = pq.read_table(recording / "jobs.parquet", columns=["job_id"]).column("job_id").to_pylist()
    return sorted(set(jobs))


def main(argv: list[str]) -> int:
    """``python -m tests.analyzer.recordings STORE_URL OUT_DIR``: export a recording."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    store = open_store(argv[0])
    try:
        written = export_recording(store, Path(argv[1]))
    finally:
        store.close()
    print(" ".join(f"{table}={n}" for table, n in written.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

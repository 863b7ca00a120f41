"""The node agent's bounded on-disk spool of batches not yet acknowledged by a collector.

Each batch is one file ``<dir>/<agent_id>/<seq:016d>-<rows>.batch`` holding the
serialized ``argus.v1.Batch`` exactly as sent, so a batch replayed after a
collector outage or an agent restart carries the same (agent id, seq) and the
collector deduplicates it. Files are written to a temporary name and renamed,
so a crash never leaves a torn batch. When the spool would pass its bound, the
oldest batches are deleted and their rows counted as dropped. A batch that
fails every try is moved to ``<dir>/.set-aside/`` and never replayed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SET_ASIDE", "Spool", "SpoolEntry", "safe_name"]

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d{16})-(\d+)\.batch$")
#: Folder under the spool for batches that failed every try (never replayed; a person may look).
SET_ASIDE = ".set-aside"


def safe_name(agent_id: str) -> str:
    """``agent_id`` as a folder name: characters outside ``[A-Za-z0-9._-]`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", agent_id)


@dataclass(frozen=True)
class SpoolEntry:
    """One spooled batch."""

    agent_id: str
    seq: int
    rows: int
    size: int
    path: Path


class Spool:
    """Spooled batches of every agent id found under ``root``, oldest first.

    Args:
        root: The spool folder (created).
        max_bytes: Bound on the total size of spooled batches.
    """

    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int], SpoolEntry] = OrderedDict()
        self._bytes = 0
        #: Rows deleted to stay under the bound (monotonic).
        self.dropped_rows = 0
        self._load()

    def _load(self) -> None:
        found: list[tuple[float, SpoolEntry]] = []
        for folder in self.root.iterdir():
            if not folder.is_dir() or folder.name.startswith("."):
                continue
            agent_id = (folder / "agent_id").read_text() if (folder / "agent_id").exists() else folder.name
            for path in folder.iterdir():
                m = _FILE.match(path.name)
                if m is None:
                    if path.name.endswith(".tmp"):
                        path.unlink(missing_ok=True)
                    continue
                st = path.stat()
                found.append((st.st_mtime, SpoolEntry(agent_id, int(m[1]), int(m[2]), st.st_size, path)))
        for _, entry in sorted(found, key=lambda f: (f[0], f[1].agent_id, f[1].seq)):
            self._entries[(entry.agent_id, entry.seq)] = entry
            self._bytes += entry.size
        if found:
            log.info("argus agent: %d spooled batches (%d bytes) to replay", len(found), self._bytes)

    @property
    def size_bytes(self) -> int:
        """Total size of the spooled batches."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, agent_id: str, seq: int, rows: int, data: bytes) -> list[SpoolEntry]:
        """Spool one batch; returns the entries deleted to make room (their rows counted as dropped).

        Raises:
            OSError: the batch could not be written (disk full, read-only folder); nothing is kept.
        """
        folder = self.root / safe_name(agent_id)
        if not folder.exists():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "agent_id").write_text(agent_id)
        path = folder / f"{seq:016d}-{rows}.batch"
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
        evicted: list[SpoolEntry] = []
        with self._lock:
            entry = SpoolEntry(agent_id, seq, rows, len(data), path)
            self._entries[(agent_id, seq)] = entry
            self._bytes += entry.size
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                _, old = self._entries.popitem(last=False)
                self._bytes -= old.size
                self.dropped_rows += old.rows
                evicted.append(old)
        for old in evicted:
            old.path.unlink(missing_ok=True)
        if evicted:
            log.warning(
                "argus agent: spool full (%d bytes): dropped %d oldest batches, %d rows",
                self.max_bytes,
                len(evicted),
                sum(e.rows for e in evicted),
            )
        return evicted

    def remove(self, agent_id: str, seq: int, unlink: bool = True) -> SpoolEntry | None:
        """Forget an acknowledged (or rejected) batch; None if it was not spooled."""
        with self._lock:
            entry = self._entries.pop((agent_id, seq), None)
            if entry is not None:
                self._bytes -= entry.size
        if entry is not None and unlink:
            entry.path.unlink(missing_ok=True)
        return entry

    def set_aside(self, agent_id: str, seq: int) -> SpoolEntry | None:
        """Move a batch that cannot be delivered to :data:`SET_ASIDE` (kept for a person, never sent).

        Returns:
            The entry set aside (its ``path`` the new place); None if it was not spooled.
        """
        entry = self.remove(agent_id, seq, unlink=False)
        if entry is None:
            return None
        folder = self.root / SET_ASIDE / safe_name(agent_id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / entry.path.name
            os.replace(entry.path, path)
        except OSError:
            entry.path.unlink(missing_ok=True)
            return entry
        return SpoolEntry(agent_id, seq, entry.rows, entry.size, path)

    def read(self, agent_id: str, seq: int) -> bytes | None:
        """The spooled bytes of a batch; None if it is gone."""
        entry = self._entries.get((agent_id, seq))
        if entry is None:
            return None
        try:
            return entry.path.read_bytes()
        except OSError:
            return None

    def seqs(self, agent_id: str) -> list[int]:
        """Spooled sequence numbers of ``agent_id``, ascending."""
        with self._lock:
            return sorted(seq for a, seq in self._entries if a == agent_id)

    def agent_ids(self) -> list[str]:
        """Agent ids with spooled batches."""
        with self._lock:
            return sorted({a for a, _ in self._entries})

    def prune_empty(self) -> None:
        """Delete folders of agent ids with no batch left."""
        live = {safe_name(a) for a in self.agent_ids()}
        for folder in self.root.iterdir():
            if folder.is_dir() and folder.name not in live and folder.name != SET_ASIDE:
                for path in folder.iterdir():
                    with contextlib.suppress(OSError):
                        path.unlink()
                with contextlib.suppress(OSError):
                    folder.rmdir()

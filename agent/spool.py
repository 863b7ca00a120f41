"""The node agent's bounded on-disk spool of batches not yet acknowledged by a collector.

Each batch is one file ``<dir>/<agent_id>/<seq:016d>-<rows>.batch`` holding the
serialized ``argus.v1.Batch`` exactly as sent, so a batch replayed after a
collector outage or an agent restart carries the same (agent id, seq) and the
collector deduplicates it. Files are written to a temporary name, flushed to disk
(``fsync``) and renamed, and the folder is synced after the rename, so neither a
crash nor a power loss leaves a torn batch or one acknowledged but gone. Batches
hold every job's command lines and stacks: files are mode 0600 and folders 0700
whatever the umask (the spool's root too, when the agent creates or owns it).
When the spool would pass its bound, the oldest batches are deleted and their
rows counted as dropped. A batch that fails every try is moved to
``<dir>/.set-aside/`` and never replayed. A folder this process spools into is
never pruned (:meth:`Spool.prune_empty`).
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

from argus.private import private_dir

__all__ = ["SET_ASIDE", "Spool", "SpoolEntry", "safe_name", "write_synced"]

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d{16})-(\d+)\.batch$")
#: Folder under the spool for batches that failed every try (never replayed; a person may look).
SET_ASIDE = ".set-aside"


def safe_name(agent_id: str) -> str:
    """``agent_id`` as a folder name: characters outside ``[A-Za-z0-9._-]`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", agent_id)


def write_synced(path: Path, data: bytes, tmp: Path | None = None) -> None:
    """Write ``data`` to ``path`` (mode 0600) through ``tmp`` (default ``path`` + ``.tmp``): the
    file's bytes reach the disk (``fsync``) before the rename, the rename before this returns.

    Raises:
        OSError: any step failed; ``tmp`` may be left (the caller removes it).
    """
    tmp = tmp if tmp is not None else path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # one left by a crash keeps its mode under O_CREAT
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


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
        private_dir(self.root)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # Folders this process spools into: never pruned (their next batch may be on its way).
        self._writing: set[str] = set()
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
        with self._lock:
            self._writing.add(folder.name)
        if not (folder / "agent_id").exists():
            private_dir(folder)
            write_synced(folder / "agent_id", agent_id.encode())
        path = folder / f"{seq:016d}-{rows}.batch"
        tmp = path.with_suffix(".tmp")
        try:
            write_synced(path, data, tmp)
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
            private_dir(folder.parent)
            private_dir(folder)
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
        """Delete folders of agent ids with no batch left, except those this process spools into
        (the running agent's: a batch it is writing there now is not listed yet)."""
        with self._lock:
            keep = {safe_name(a) for a, _ in self._entries} | self._writing
        for folder in self.root.iterdir():
            if folder.is_dir() and folder.name not in keep and folder.name != SET_ASIDE:
                for path in folder.iterdir():
                    with contextlib.suppress(OSError):
                        path.unlink()
                with contextlib.suppress(OSError):
                    folder.rmdir()

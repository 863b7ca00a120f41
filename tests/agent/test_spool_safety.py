"""The spool keeps what it acknowledged and shows it to nobody else: a batch's bytes reach the disk
before its rename, files are 0600 and folders 0700 whatever the umask (the embedded store's data
folder too), and pruning the folders of finished agents never takes a batch the running agent just
spooled. A power loss cannot be provoked here: the order of the system calls is checked instead."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from argus.agent import spool as spool_module
from argus.agent.spool import SET_ASIDE, Spool
from argus.store import open_store


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The usual umask (0022): what a file or folder gets unless the code asks for less."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_batch_is_on_disk_before_its_rename_and_the_rename_before_put_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append(("rename", str(dst)))
        real_replace(src, dst)

    spool = Spool(tmp_path / "spool", 1 << 20)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    spool.put("agent-1", 7, 3, b"batch bytes")
    batch = str(tmp_path / "spool" / "agent-1" / f"{7:016d}-3.batch")
    folder = str(tmp_path / "spool" / "agent-1")
    assert calls[-3:] == [("fsync", batch[: -len(".batch")] + ".tmp"), ("rename", batch), ("fsync", folder)]
    assert Path(batch).read_bytes() == b"batch bytes"


def test_spool_files_are_0600_and_its_folders_0700(tmp_path: Path, open_umask: None) -> None:
    root = tmp_path / "spool"
    root.mkdir(mode=0o755)  # an older agent's, or one made by hand
    spool = Spool(root, 1 << 20)
    spool.put("agent/1", 1, 2, b"x")
    spool.put("agent/1", 2, 2, b"y")
    spool.set_aside("agent/1", 2)
    folders = [root, root / "agent_1", root / SET_ASIDE, root / SET_ASIDE / "agent_1"]
    assert {str(f): _mode(f) for f in folders} == {str(f): 0o700 for f in folders}
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) == 3  # agent_id, one batch, one set aside
    assert {str(f): _mode(f) for f in files} == {str(f): 0o600 for f in files}


def test_the_embedded_store_data_folder_is_0700(tmp_path: Path, open_umask: None) -> None:
    store = open_store(f"chdb://{tmp_path / 'data'}")
    try:
        assert _mode(tmp_path / "data") == 0o700
    finally:
        store.close()


def test_pruning_finished_agents_never_takes_a_batch_the_running_agent_just_spooled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay sender finishing (it prunes empty folders) while the running agent spools a batch:
    the rename is done, the batch not listed yet. The batch must stay: it is acknowledged to the
    probe once put returns."""
    Spool(tmp_path / "spool", 1 << 20).put("agent-old", 1, 1, b"old")  # an agent before this one
    spool = Spool(tmp_path / "spool", 1 << 20)
    spool.put("agent-now", 1, 1, b"first")
    spool.remove("agent-old", 1)  # replayed and acknowledged by the collector
    spool.remove("agent-now", 1)  # the running agent's batches so far all acknowledged
    real_replace = os.replace

    def replace_then_prune(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_replace(src, dst)
        if str(dst).endswith(".batch"):
            spool.prune_empty()  # the replay sender of agent-old, at this very moment

    monkeypatch.setattr(spool_module.os, "replace", replace_then_prune)
    spool.put("agent-now", 2, 1, b"second")
    monkeypatch.undo()
    assert spool.read("agent-now", 2) == b"second"
    assert (tmp_path / "spool" / "agent-now" / "agent_id").read_text() == "agent-now"
    assert not (tmp_path / "spool" / "agent-old").exists()  # the finished agent's folder is pruned

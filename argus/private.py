"""Folders only their owner may read: the node agent's spool and the embedded store's data.

Both hold every job's command lines, stacks and timings; any local user could read them
under the default umask (0022). A folder made here is mode 0700 whatever the umask, and one
found open (made by an older version, or by hand) is closed when this user owns it; the
files in it are then out of others' reach whatever their own mode.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PRIVATE_DIR_MODE", "private_dir"]

#: Mode of a private folder: its owner only.
PRIVATE_DIR_MODE = 0o700


def private_dir(folder: Path) -> None:
    """Make ``folder`` (and missing parents) mode 0700, or make one there that this user owns 0700.

    A folder of another user is left as it is (the caller's open or write fails if it may not).

    Raises:
        OSError: it cannot be made or its mode changed.
    """
    folder.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    st = folder.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(folder, PRIVATE_DIR_MODE)

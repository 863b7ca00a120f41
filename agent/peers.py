"""Which process a probe's connection comes from: the kernel says so, never the probe.

The node agent samples a rank's process with py-spy (:mod:`argus.agent.captures`), often as
root: the pid it samples must be the probe's own, not one the probe names in its HELLO (a member
of the socket's group could name another user's process and read its stacks). The pid is taken
from the socket (``SO_PEERCRED``: the process that connected), as the agent's pid namespace
numbers it; the kernel does the mapping between namespaces. A probe in a pid namespace the agent
cannot see (the kernel reports pid 0) is never sampled by the agent: it samples itself.

A HELLO pid that is neither the socket's pid nor that process's pid in its own namespace (the
innermost ``NSpid`` of ``/proc/<pid>/status``: a rank in a container numbers itself so) is a
probe naming another process; the agent logs it and samples the socket's pid all the same.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

__all__ = ["claims_its_own_pid", "peer_pid"]

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_pid(conn: socket.socket) -> int | None:
    """The pid of the process that connected ``conn`` (a unix socket), in this process's pid
    namespace; None when the kernel cannot name it here (the peer is in a pid namespace this one
    does not contain) or the platform has no ``SO_PEERCRED``."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        pid, _, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, option, _UCRED.size))
    except OSError:
        return None
    return pid if pid > 0 else None


def claims_its_own_pid(peer: int, claimed: int, proc: Path = Path("/proc")) -> bool:
    """Whether a HELLO pid ``claimed`` names the process ``peer`` (the socket's pid, this
    namespace): equal, or its pid in its innermost pid namespace (``NSpid``); unreadable: False."""
    if claimed == peer:
        return True
    try:
        status = (proc / str(peer) / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return line.split()[-1] == str(claimed)
    return False

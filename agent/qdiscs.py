"""The root queueing discipline (qdisc) of each network interface: backlog, overlimits, drops, shaping rate.

Read from the kernel over rtnetlink (``RTM_GETQDISC``, a dump: the request and answers that
``tc -s qdisc show`` makes), in this process: one request and a few hundred bytes parsed, about
40 µs of CPU. The node agent ran ``tc -s -j qdisc show`` for it every second, a process started
each time: 1.7 ms of CPU (1.45 ms the child's), 0.4 % of a core with its thread's share
(``bench/host_cpu.py``). ``tc`` stays the fallback where a netlink socket cannot be opened.

Sources: ``linux/rtnetlink.h`` (``struct tcmsg``, ``TCA_*``), ``linux/gen_stats.h``
(``TCA_STATS2`` / ``TCA_STATS_QUEUE``: ``struct gnet_stats_queue``), ``linux/pkt_sched.h``
(``TCA_TBF_PARMS``: ``struct tc_tbf_qopt``, ``TCA_TBF_RATE64``); iproute2's ``tc/q_tbf.c`` reads
the rate the same way (the 64-bit attribute when present).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Qdisc", "read_netlink", "read_tc"]

#: Seconds ``tc`` may take before a sample goes without qdisc figures.
TC_TIMEOUT_S = 2.0

_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_TCMSG = struct.Struct("=BxxxiIII")  # tcmsg: family, ifindex, handle, parent, info
_RTA = struct.Struct("=HH")  # rtattr: length, type
_QUEUE = struct.Struct("=IIIII")  # gnet_stats_queue: qlen, backlog, drops, requeues, overlimits
_TC_STATS = struct.Struct("=QIIIIIII")  # tc_stats: bytes, packets, drops, overlimits, bps, pps, qlen, backlog
_RATESPEC_RATE = struct.Struct("=8xI")  # tc_ratespec: cell_log .. mpu, then rate (bytes/s)
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_RTM_NEWQDISC, _RTM_GETQDISC = 36, 38
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_TCA_KIND, _TCA_OPTIONS, _TCA_STATS, _TCA_STATS2 = 1, 2, 3, 7
_TCA_STATS_QUEUE = 3
_TCA_TBF_PARMS, _TCA_TBF_RATE64 = 1, 4
_TC_H_ROOT = 0xFFFFFFFF


@dataclass(frozen=True)
class Qdisc:
    """The root qdisc of one interface: bytes queued now, times a shaper held a packet back and
    packets dropped (both since it was made), and the shaping rate of a ``tbf`` (bit/s, 0: none)."""

    backlog: int
    overlimits: int
    drops: int
    rate_bps: int


def _attrs(data: bytes | memoryview, offset: int = 0) -> Iterator[tuple[int, memoryview]]:
    """``(type, payload)`` of each netlink attribute in ``data`` from ``offset`` (4-byte aligned)."""
    view = memoryview(data)
    while offset + _RTA.size <= len(view):
        length, kind = _RTA.unpack_from(view, offset)
        if length < _RTA.size:
            return
        yield kind & 0x3FFF, view[offset + _RTA.size : offset + length]  # less the nested/order flags
        offset += (length + 3) & ~3


def _queue(stats2: memoryview | None, legacy: memoryview | None) -> tuple[int, int, int]:
    """``(backlog, overlimits, drops)`` from ``TCA_STATS2``'s queue statistics, else ``TCA_STATS``."""
    for kind, stat in _attrs(stats2) if stats2 is not None else ():
        if kind == _TCA_STATS_QUEUE and len(stat) >= _QUEUE.size:
            _, backlog, drops, _, overlimits = _QUEUE.unpack_from(stat)
            return backlog, overlimits, drops
    if legacy is not None and len(legacy) >= _TC_STATS.size:
        _, _, drops, overlimits, _, _, _, backlog = _TC_STATS.unpack_from(legacy)
        return backlog, overlimits, drops
    return 0, 0, 0


def _tbf_rate(options: memoryview) -> int:
    """A ``tbf`` qdisc's rate from its options, bytes/s: the 64-bit attribute when present."""
    rate = 0
    for kind, value in _attrs(options):
        if kind == _TCA_TBF_RATE64 and len(value) >= 8:
            return int(struct.unpack_from("=Q", value)[0])
        if kind == _TCA_TBF_PARMS and len(value) >= _RATESPEC_RATE.size:
            rate = int(_RATESPEC_RATE.unpack_from(value)[0])
    return rate


def _qdisc(payload: memoryview) -> tuple[int, Qdisc] | None:
    """``(ifindex, qdisc)`` of one ``RTM_NEWQDISC`` payload when it is a root qdisc, else None."""
    _, ifindex, _, parent, _ = _TCMSG.unpack_from(payload)
    if parent != _TC_H_ROOT:
        return None
    attrs = dict(_attrs(payload, _TCMSG.size))
    kind = bytes(attrs.get(_TCA_KIND, b"")).split(b"\0", 1)[0]
    options = attrs.get(_TCA_OPTIONS)
    rate = _tbf_rate(options) if kind == b"tbf" and options is not None else 0
    return ifindex, Qdisc(*_queue(attrs.get(_TCA_STATS2), attrs.get(_TCA_STATS)), rate * 8)


def _messages(data: bytes) -> Iterator[tuple[int, int, memoryview]]:
    """``(type, seq, payload)`` of each netlink message in ``data``.

    Raises:
        OSError: a message shorter than its header.
    """
    offset = 0
    while offset + _NLMSG.size <= len(data):
        length, kind, _, seq, _ = _NLMSG.unpack_from(data, offset)
        if length < _NLMSG.size:
            raise OSError("a netlink message shorter than its header")
        yield kind, seq, memoryview(data)[offset + _NLMSG.size : offset + length]
        offset += (length + 3) & ~3


def read_netlink() -> dict[str, Qdisc] | None:
    """Root qdisc of every interface of this network namespace, by interface name, over rtnetlink;
    None when no netlink socket can be opened or the kernel answers with an error (use :func:`read_tc`)."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    except (OSError, AttributeError):  # not Linux, or no netlink in this sandbox
        return None
    found: dict[str, Qdisc] = {}
    request = _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    header = _NLMSG.pack(_NLMSG.size + len(request), _RTM_GETQDISC, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
    with sock:
        try:
            sock.settimeout(TC_TIMEOUT_S)
            sock.bind((0, 0))
            sock.send(header + request)
            while data := sock.recv(1 << 16):
                for kind, seq, payload in _messages(data):
                    if seq != 1 or kind not in (_RTM_NEWQDISC, _NLMSG_DONE, _NLMSG_ERROR):
                        continue
                    if kind != _RTM_NEWQDISC:
                        return found if kind == _NLMSG_DONE else None
                    got = _qdisc(payload) if len(payload) >= _TCMSG.size else None
                    if got is not None:
                        with contextlib.suppress(OSError):
                            found[socket.if_indextoname(got[0])] = got[1]
        except (OSError, struct.error):
            return None
    return None


def read_tc(tc: str | None) -> dict[str, Qdisc]:
    """Root qdisc of every interface, from ``tc -s -j qdisc show`` (iproute2); {} when tc is missing
    or fails."""
    if tc is None:
        return {}
    try:
        out = subprocess.run(
            [tc, "-s", "-j", "qdisc", "show"],
            capture_output=True,
            timeout=TC_TIMEOUT_S,
            check=False,
        ).stdout
        entries: list[dict[str, Any]] = json.loads(out or b"[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    found: dict[str, Qdisc] = {}
    for e in entries:
        if not e.get("root") or "dev" not in e:
            continue
        rate = int(e.get("options", {}).get("rate", 0)) * 8 if e.get("kind") == "tbf" else 0
        found[str(e["dev"])] = Qdisc(
            int(e.get("backlog", 0)), int(e.get("overlimits", 0)), int(e.get("drops", 0)), rate
        )
    return found

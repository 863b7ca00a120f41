"""The JSON messages on the probe socket, typed: read once, checked once, then fields.

:mod:`argus.agent.protocol` frames them (``HELLO``, ``BYE``, ``DUMP``, ``CAPTURE`` from a
probe or client; ``SAMPLE`` from the agent); each class here is one payload. ``decode``
checks every field the agent reads (type and presence) and raises
:class:`~argus.agent.protocol.ProtocolError` otherwise, so no code past it reads a document
by key. Fields a later version added are optional with the default an older peer meant.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from argus.agent.protocol import ProtocolError, decode_json

__all__ = ["Bye", "Capture", "Dump", "Hello", "Sample"]


def _int(doc: dict[str, Any], key: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str | float):  # as an older probe may send it
        try:
            return int(value)
        except (ValueError, OverflowError):
            pass
    raise ProtocolError(f"{key}: expected an integer, got {value!r:.80}")


def _str(doc: dict[str, Any], key: str, default: str | None = None) -> str:
    value = doc.get(key, default)
    if value is None:
        raise ProtocolError(f"{key}: missing")
    return str(value)


class _Json:
    """A message whose payload is the JSON object of its fields."""

    def encode(self) -> bytes:
        """The JSON payload."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()  # type: ignore[call-overload]


@dataclass(frozen=True)
class Hello(_Json):
    """A probe's identity, the first frame of each of its connections (``HELLO``).

    ``pid`` is the rank's own (its pid namespace's) number, recorded in its rows; the agent samples
    the socket's peer instead (:mod:`argus.agent.peers`). ``version``: 1 knows ``ACK`` only, 2 adds
    ``ACK_ONE``, 3 adds ``REFUSED``. ``attach_ns``: when the probe attached, ns since the epoch.
    """

    job_id: str
    rank: int
    world_size: int
    pid: int
    attach_ns: int
    local_rank: int = 0
    host: str = ""
    device: str = ""
    command: str = ""
    version: int = 1

    @classmethod
    def decode(cls, payload: bytes) -> Hello:
        """Raises: ProtocolError: not a JSON object, or a field missing or of the wrong type."""
        doc = decode_json(payload)
        return cls(
            job_id=_str(doc, "job_id"),
            rank=_int(doc, "rank"),
            world_size=_int(doc, "world_size"),
            pid=_int(doc, "pid"),
            attach_ns=_int(doc, "attach_ns"),
            local_rank=_int(doc, "local_rank", 0),
            host=_str(doc, "host", ""),
            device=_str(doc, "device", ""),
            command=_str(doc, "command", ""),
            version=_int(doc, "version", 1),
        )

    @property
    def takes_one(self) -> bool:
        """The probe understands ``ACK_ONE`` (version 2 and later)."""
        return self.version >= 2

    @property
    def takes_refused(self) -> bool:
        """The probe understands ``REFUSED`` (version 3 and later)."""
        return self.version >= 3

    @property
    def key(self) -> tuple[str, ...]:
        """One probe's identity across its connections (a re-attached or forked probe is another)."""
        return (self.job_id, str(self.rank), self.host, str(self.pid), str(self.attach_ns))


@dataclass(frozen=True)
class Bye(_Json):
    """A probe's last frame when its process exits (``BYE``)."""

    exit_code: int

    @classmethod
    def decode(cls, payload: bytes) -> Bye:
        """Raises: ProtocolError: not a JSON object or no integer ``exit_code``."""
        return cls(_int(decode_json(payload), "exit_code", 0))


@dataclass(frozen=True)
class Dump(_Json):
    """A client's request for the raw kernel events the agent holds (``DUMP``): ``[start_ns, end_ns)``."""

    job_id: str
    start_ns: int
    end_ns: int

    @classmethod
    def decode(cls, payload: bytes) -> Dump:
        """Raises: ProtocolError: not a JSON object, or a field missing or not an integer."""
        doc = decode_json(payload)
        return cls(_str(doc, "job_id"), _int(doc, "start_ns"), _int(doc, "end_ns"))


@dataclass(frozen=True)
class Capture(_Json):
    """When a rank's CUPTI capture ran (``CAPTURE``): ``(start_ns, end_ns)`` spans, host clock."""

    spans: list[tuple[int, int]]

    @classmethod
    def decode(cls, payload: bytes) -> Capture:
        """Raises: ProtocolError: not a JSON object, or ``spans`` not a list of integer pairs."""
        spans = decode_json(payload).get("spans")
        if not isinstance(spans, list):
            raise ProtocolError(f"spans: expected a list of [start_ns, end_ns], got {spans!r:.80}")
        try:
            return cls([(int(a), int(b)) for a, b in spans])
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"spans: expected [start_ns, end_ns] pairs ({exc})") from None


@dataclass(frozen=True)
class Sample(_Json):
    """The agent's request that a probe sample its own threads for ``duration_ms`` (``SAMPLE``)."""

    capture_id: str
    duration_ms: int

    @classmethod
    def decode(cls, payload: bytes) -> Sample:
        """Raises: ProtocolError: not a JSON object, or a field missing or of the wrong type."""
        doc = decode_json(payload)
        return cls(_str(doc, "capture_id"), _int(doc, "duration_ms"))

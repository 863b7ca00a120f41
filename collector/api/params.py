"""Query parameters of the REST API: times, rank sets and page cursors.

Each parser takes the raw query string value and returns a typed value, or
raises :class:`BadParameter` (answered as 422 by :mod:`argus.collector.api.errors`).

- Times are integer ns since the epoch (``1718000000000000000``) or RFC 3339
  (``2024-06-10T06:13:20.5Z``, fraction up to ns, ``Z`` or ``±HH:MM`` required).
- Rank sets are comma-separated ranks and inclusive ranges: ``0,1,5-7``.
- Cursors are opaque (URL-safe base64 of a JSON array); clients pass back the
  ``next`` value of the previous page unchanged.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "INT64_MAX",
    "MAX_RANK",
    "BadParameter",
    "RankSet",
    "decode_cursor",
    "encode_cursor",
    "parse_ranks",
    "parse_time_ns",
]

INT64_MAX = 2**63 - 1
#: Ranks are UInt32 in the store.
MAX_RANK = 2**32 - 1
#: Bound on the ranges of one rank set, so a query stays small.
MAX_RANK_RANGES = 1000

_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})\Z",
    re.ASCII,
)
_RANGE = re.compile(r"(\d{1,10})(?:-(\d{1,10}))?\Z", re.ASCII)


class BadParameter(ValueError):
    """A query parameter has a value the API cannot use; the message names it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


def parse_time_ns(name: str, value: str) -> int:
    """Epoch ns or RFC 3339 → integer ns since the epoch (0 <= t <= 2**63-1).

    Raises:
        BadParameter: neither form, or out of range.
    """
    text = value.strip()
    if re.fullmatch(r"\d{1,19}", text, re.ASCII):
        ns = int(text)
    else:
        match = _RFC3339.match(text)
        if match is None:
            raise BadParameter(name, f"{value!r} is neither epoch ns nor an RFC 3339 time")
        day, clock, fraction, zone = match.groups()
        zone = "+00:00" if zone in ("Z", "z") else zone
        try:
            moment = datetime.fromisoformat(f"{day}T{clock}{zone}")
        except ValueError as exc:
            raise BadParameter(name, f"{value!r}: {exc}") from exc
        seconds = int((moment - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
        ns = seconds * 1_000_000_000 + int((fraction or "").ljust(9, "0"))
    if not 0 <= ns <= INT64_MAX:
        raise BadParameter(name, f"{value!r} is outside 1970-01-01 .. 2262-04-11")
    return ns


@dataclass(frozen=True)
class RankSet:
    """Inclusive rank ranges, sorted and merged: ``((0, 1), (5, 7))`` for ``0,1,5-7``."""

    ranges: tuple[tuple[int, int], ...]

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int) and any(lo <= rank <= hi for lo, hi in self.ranges)

    @property
    def lows(self) -> list[int]:
        return [lo for lo, _ in self.ranges]

    @property
    def highs(self) -> list[int]:
        return [hi for _, hi in self.ranges]


def parse_ranks(name: str, value: str) -> RankSet:
    """``"0,1,5-7"`` → :class:`RankSet`; ranks 0 .. 2**32-1, at most 1000 ranges.

    Raises:
        BadParameter: empty, malformed, a range with lo > hi, or too many ranges.
    """
    ranges: list[tuple[int, int]] = []
    for part in value.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise BadParameter(name, f"{part.strip()!r} is not a rank or a range like 5-7")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if lo > hi:
            raise BadParameter(name, f"range {lo}-{hi} is empty")
        if hi > MAX_RANK:
            raise BadParameter(name, f"rank {hi} is larger than {MAX_RANK}")
        ranges.append((lo, hi))
    if len(ranges) > MAX_RANK_RANGES:
        raise BadParameter(name, f"{len(ranges)} ranges; at most {MAX_RANK_RANGES}")
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return RankSet(tuple(merged))


def encode_cursor(key: list[Any]) -> str:
    """The opaque cursor for a page that starts after ``key`` (JSON scalars)."""
    raw = json.dumps(key, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(value: str, types: tuple[type, ...]) -> list[Any]:
    """Inverse of :func:`encode_cursor`, checking the key's shape against ``types``.

    Raises:
        BadParameter: not a cursor this API made for this list.
    """
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        key = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise BadParameter("cursor", "not a cursor from this API") from exc
    if (
        not isinstance(key, list)
        or len(key) != len(types)
        or not all(type(k) is t for k, t in zip(key, types, strict=True))
    ):
        raise BadParameter("cursor", "not a cursor from this API")
    for k in key:
        if isinstance(k, int) and not -(2**63) <= k <= 2**64 - 1:
            raise BadParameter("cursor", "not a cursor from this API")
    return key

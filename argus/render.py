"""How a diagnosis reads to a person: the one renderer of `argus diagnose`, `argus demo` and the logs.

- :func:`line` — one line of plain text (the analyzer's log, `argus analyze --once`);
- :func:`table` — a job's line, a table of its diagnoses, open first, then each one's summary
  and key figures (`argus diagnose`);
- :func:`report` — each diagnosis as a headline, its summary and key figures (`argus demo`);
- :func:`jobs` — a table of jobs (`argus jobs`);
- :func:`printable` — the one place terminal control sequences are taken out of what the store
  holds (host names, kernel names, commands, frames, job ids come from the jobs' processes): every
  renderer here shows only :func:`scrubbed` values, and `argus run` prints through it too.

All name the rank(s) (:func:`who`), the place (:func:`where`) and the evidence the same
way. Under a headline comes the diagnosis's summary sentence, then at most five evidence figures
with units (:func:`argus.summary.lines`), then the top frames of the rank's sampled stacks when
there are some (:func:`top_frames`); the whole evidence is in ``--json``. Evidence keys an
older analyzer kept for its own bookkeeping are not shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from argus.diagnosis import Diagnosis, State
from argus.summary import lines as summary_lines

__all__ = [
    "evidence",
    "jobs",
    "line",
    "lost",
    "printable",
    "report",
    "scrubbed",
    "table",
    "top_frames",
    "where",
    "who",
]

#: Evidence keys an older analyzer kept there for its own bookkeeping (now its own columns), not for a
#: person reading a diagnosis.
BOOKKEEPING = frozenset({"analysed_to_ns", "subject"})
#: Ranks named before the rest are counted.
_MAX_RANKS = 16
#: A terminal control sequence: ESC [ ... final (CSI), ESC ] ... BEL or ST (OSC), ESC P/X/^/_ ... ST
#: (strings), ESC and one character; the 8-bit CSI and OSC; then any other C0 or C1 control
#: character or DEL on its own.
_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|[\x00-\x1f\x7f-\x9f]"
)
_T = TypeVar("_T")
#: What `argus diagnose` says under its table of diagnoses.
_SCORE_WORDS = (
    "score: how far the rank stands from its peers (0 = like them, 1 = the detection threshold); "
    "slowdown: the job's throughput lost; a group is the process group the rank was compared in"
)


def printable(text: str) -> str:
    """``text`` without terminal control sequences (colours, cursor moves, window titles, links,
    a clear screen) or control characters: each sequence is removed, each line break or tab becomes
    a space. Store values (host names, kernel names, commands, frames, job ids) come from the jobs'
    processes, so they are printed through this."""
    return _CONTROL.sub(lambda m: " " if m.group() in ("\n", "\r", "\t") else "", text)


def scrubbed(value: _T) -> _T:
    """``value`` with :func:`printable` applied to every string in it (dict keys and values, list
    items, nested), or to a :class:`~argus.diagnosis.Diagnosis`'s fields; anything else unchanged."""
    out: Any
    if isinstance(value, str):
        out = printable(value)
    elif isinstance(value, Diagnosis):
        out = Diagnosis.from_dict(scrubbed(value.to_dict()))
    elif isinstance(value, Mapping):
        out = {scrubbed(k): scrubbed(v) for k, v in value.items()}
    elif isinstance(value, list | tuple):
        out = [scrubbed(v) for v in value]
    else:
        out = value
    return out  # type: ignore[no-any-return]


def who(d: Diagnosis) -> str:
    """``rank 3``, or ``ranks 0,1,5`` (the first 16, then how many) when the fault is not one rank's."""
    if d.rank is not None:
        return f"rank {d.rank}"
    shown = ",".join(map(str, d.ranks[:_MAX_RANKS]))
    more = f",... ({len(d.ranks)} ranks)" if len(d.ranks) > _MAX_RANKS else ""
    return f"ranks {shown}{more}"


def where(d: Diagnosis, sep: str = " ", eq: str = "=") -> str:
    """``phase=forward kernel=… group=…``: the parts the diagnosis names, '' when none."""
    parts = (("phase", d.phase), ("kernel", d.kernel), ("group", d.group))
    return sep.join(f"{name}{eq}{value}" for name, value in parts if value)


def evidence(d: Diagnosis) -> list[tuple[str, str]]:
    """The evidence a person checks, as ``(key, JSON text)`` pairs in the analyzer's order."""
    return [
        (key, value if isinstance(value, str) else json.dumps(value, separators=(",", ":")))
        for key, value in d.evidence.items()
        if key not in BOOKKEEPING
    ]


def line(d: Diagnosis) -> str:
    """One line: ``JOB ID STATE CAUSE WHO [WHERE] score=… slowdown=…%`` (:func:`printable`)."""
    d = scrubbed(d)
    place = where(d)
    return (
        f"{d.job_id} {d.id} {d.state} {d.cause} {who(d)}{' ' + place if place else ''} "
        f"score={d.score:.2f} slowdown={d.slowdown_pct:.1f}%"
    )


def _time(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def rfc3339(ns: int | None) -> str | None:
    """``ns`` since the epoch as an RFC 3339 UTC time to the millisecond (``2026-12-01T17:29:14.123Z``),
    for the REST objects' ``*_at`` fields beside their ``*_ns``; None for None."""
    if ns is None:
        return None
    moment = datetime.fromtimestamp(ns // 1_000_000 / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def lost(d: Diagnosis) -> str:
    """The time the job lost to the fault (its evidence's ``lost_s``), ``"-"`` when not known."""
    value = d.evidence.get("lost_s")
    return f"{value:.1f} s" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def top_frames(d: Diagnosis) -> list[str]:
    """Lines naming the lines of code that set the rank's stacks apart from its peer's
    (``evidence.top_frames``, :mod:`argus.analyzer.stacks`), or one line saying why there are
    none (``evidence.stacks.why_no_frames``); nothing without stacks."""
    frames = d.evidence.get("top_frames")
    about = d.evidence.get("stacks")
    if not isinstance(frames, list) or not isinstance(about, Mapping):
        return []
    peer = about.get("peer")
    versus = f" against rank {peer}" if peer is not None else ""
    thread = f", thread {about['thread']}" if about.get("thread") else ""
    if not frames:
        why = about.get("why_no_frames") or "no line is held more often than in the peer's stacks"
        return [f"    no top frames of rank {about.get('rank')}{versus} ({about.get('sampler')}): {why}"]
    head = (
        f"top frames of rank {about.get('rank')}{versus} ({about.get('sampler')}{thread}, share of samples)"
    )
    out = [f"    {head}:"]
    for f in frames:
        out.append(
            f"      {100 * float(f['share']):5.1f} %  {f['function']} ({f['file']}:{f['line']})"
            + (f"  peer {100 * float(f['peer_share']):.1f} %" if peer is not None else "")
        )
    return out


def table(job: Mapping[str, Any], diagnoses: Sequence[Diagnosis]) -> RenderableType:
    """The job's lines (status, ranks, open diagnoses; its lost time), a table of its diagnoses,
    then under it each one's headline, summary and at most five evidence figures.

    Args:
        job: The REST API's job object (``job_id``, ``status``, ``ranks_attached``,
            ``world_size``, ``open_diagnoses``; ``windows_analysed``, ``analysed_s``, ``lost_s``,
            ``unexplained_loss_ratio``, ``windows_failed`` when the server has them).
        diagnoses: The job's diagnoses, any order; the table lists the open ones first.

    Every value shown is :func:`printable`.
    """
    job, diagnoses = scrubbed(job), [scrubbed(d) for d in diagnoses]
    head = Text.assemble(
        ("job ", "bold"),
        (str(job["job_id"]), "bold cyan"),
        f"  {job['status']}, {job['ranks_attached']}/{job['world_size']} ranks, "
        f"{job['open_diagnoses']} open diagnoses",
    )
    failed = job.get("windows_failed")
    loss = Text(
        f"{job.get('windows_analysed', 0)} analysis window(s), {job.get('analysed_s', 0.0):.1f} s of steps "
        f"analysed; lost {job.get('lost_s', 0.0):.1f} s against its healthy pace, "
        f"{100 * job.get('unexplained_loss_ratio', 0.0):.0f} % of it unexplained"
        + (f"; {failed} window(s) failed to analyse" if failed else ""),
        style="dim",
    )
    header = Group(head, loss)
    if not diagnoses:
        return Group(header, Text("no diagnoses: every rank is like its peers", style="green"))
    grid = Table(show_lines=False, header_style="bold")
    for name in (
        "state",
        "cause",
        "rank(s)",
        "phase / kernel",
        "score",
        "slowdown",
        "lost",
        "first seen",
        "last seen",
    ):
        grid.add_column(name, justify="right" if name in ("score", "slowdown", "lost") else "left")
    ordered = sorted(diagnoses, key=lambda d: (d.state != State.OPEN, -d.last_window_ns))
    for d in ordered:
        grid.add_row(
            Text(d.state, style="bold red" if d.state == State.OPEN else "dim"),
            Text(d.cause),  # Text, not markup: a kernel name "[link=...]" is not a hyperlink
            who(d).partition(" ")[2],
            Text(" / ".join(x for x in (d.phase, d.kernel) if x) or "-"),
            f"{d.score:.2f}",
            f"{d.slowdown_pct:.1f}%",
            lost(d),
            _time(d.first_window_ns),
            _time(d.last_window_ns),
        )
    # What the table's numbers mean, in words; then under it each diagnosis's sentence and the
    # figures that carry it (all of them: --json).
    details: list[RenderableType] = [Text(_SCORE_WORDS, style="dim")]
    for d in ordered:
        details.append(Text.assemble("\n", (d.state.upper(), "bold"), f" {who(d)}: ", (d.cause, "bold")))
        details.extend(Text(text) for text in summary_lines(d) + top_frames(d))
    return Group(header, grid, *details)


def report(diagnoses: Sequence[Diagnosis]) -> RenderableType:
    """Each diagnosis as a headline (state, who, cause, where, cost), its summary sentence, then at
    most five evidence figures with units (every value :func:`printable`)."""
    blocks: list[RenderableType] = []
    for d in map(scrubbed, diagnoses):
        place = where(d, ", ", " ")
        blocks.append(
            Text.assemble(
                "\n",
                (d.state.upper(), "bold red"),
                f" {who(d)}: ",
                (d.cause, "bold"),
                f" ({place})" if place else "",
                f" — costs the job about {d.slowdown_pct:.0f}% of its throughput (score {d.score:.1f})",
            )
        )
        blocks.extend(Text(text) for text in summary_lines(d) + top_frames(d))
    return Group(*blocks)


def jobs(items: Sequence[Mapping[str, Any]]) -> RenderableType:
    """A table of the REST API's job objects: id (whole, folded), status, ranks, open diagnoses,
    started, last seen (local time, as :func:`table`); every value :func:`printable`."""
    items = [scrubbed(job) for job in items]
    if not items:
        return Text("no jobs yet: start one with argus run -- torchrun ...")
    grid = Table(header_style="bold")
    for name in ("job", "status", "ranks", "open diagnoses", "started", "last seen"):
        grid.add_column(
            name, justify="right" if name in ("ranks", "open diagnoses") else "left", overflow="fold"
        )
    for job in items:
        grid.add_row(
            Text(str(job["job_id"])),  # Text, not markup (see table)
            Text(str(job["status"])),
            f"{job['ranks_attached']}/{job['world_size']}",
            str(job["open_diagnoses"]),
            _time(job["start_ns"]) if job.get("start_ns") else "-",
            _time(job["last_seen_ns"]) if job.get("last_seen_ns") else "-",
        )
    return grid

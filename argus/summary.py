"""A diagnosis as a person reads it first: one sentence, then the few figures that carry it.

:func:`summary` writes the diagnosis's ``summary`` (docs/design.md §7.1): who (the rank, its host and
pid), what (the cause in the field's words), how much (the job's loss of throughput and the
time lost) and how we know (the comparison that names it: self time against its peers or its
own past, its wait at each collective against its peers' wait, a GPU clock, a transfer against
its reference). :func:`key_evidence` gives the three to five figures of the evidence that carry
it, with units; the full evidence stays in the JSON. Both read the evidence the analyzer writes
(:mod:`argus.analyzer.causes`, :mod:`argus.analyzer.loss`, :mod:`argus.analyzer.liveness`,
:mod:`argus.analyzer.lifecycle`) and skip what a diagnosis lacks: an evidence key that is absent,
null or of another type leaves its clause out, never an error.

The summary is computed when a diagnosis is read (the REST API fills it, with the rank's host and
pid from the ``ranks`` table), not stored: every stored diagnosis, however old, reads with the
current wording, and the analyzer's rows stay numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from argus.diagnosis import Diagnosis

__all__ = ["MAX_EVIDENCE_LINES", "Identity", "key_evidence", "lines", "summary"]

#: Rank → (host, pid): where the ranks a diagnosis names run.
Identity = Mapping[int, tuple[str, int]]
#: Most evidence lines shown under a summary.
MAX_EVIDENCE_LINES = 5
_MAX_RANKS = 8
_COMPUTE = ("forward", "backward", "optimizer")


def _num(ev: Mapping[str, Any], key: str) -> float | None:
    value = ev.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _ms(x: float) -> str:
    return f"{x:.1f} ms" if abs(x) >= 1 else f"{x:.2f} ms"


def _us(x: float) -> str:
    return f"{x:.1f} µs"


def _s(x: float) -> str:
    return f"{x:.1f} s"


def _pct(x: float) -> str:
    return f"{x:.0f} %" if abs(x) >= 10 else f"{x:.1f} %"


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:_MAX_RANKS]))
    return shown + (f", … ({len(ranks)} ranks)" if len(ranks) > _MAX_RANKS else "")


def _some(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0, 1, 2``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranks(ranks)}"


def _who(d: Diagnosis, identity: Identity | None) -> str:
    if d.rank is None:
        return _some(d.ranks) if d.ranks else "the job"
    where = (identity or {}).get(d.rank)
    return f"rank {d.rank}" + (f" (host {where[0]}, pid {where[1]})" if where else "")


def _basis(ev: Mapping[str, Any]) -> str:
    return "its own past" if ev.get("compared_with") == "own past" else "its peers"


def _top_phases(ev: Mapping[str, Any], names: tuple[str, ...] = _COMPUTE) -> list[tuple[str, float]]:
    """The positive per-phase excesses (ms per step) of ``names``, largest first."""
    per = ev.get("phase_excess_ms")
    if not isinstance(per, Mapping):
        return []
    out = [(k, float(v)) for k, v in per.items() if k in names and _num(per, k) is not None and v > 0]
    return sorted(out, key=lambda kv: -kv[1])


def _excess(ev: Mapping[str, Any]) -> str:
    """``1.16× as long as its peers (+85.3 ms per step)``, from self time against the reference."""
    own, ref, extra = _num(ev, "self_ms"), _num(ev, "peer_self_ms"), _num(ev, "excess_ms_per_step")
    parts = []
    if own is not None and ref:
        parts.append(f"{own / ref:.2f}× as long as {_basis(ev)}")
    if extra is not None:
        parts.append(f"+{_ms(extra)} per step")
    if len(parts) == 2:
        return f"{parts[0]} ({parts[1]})"
    return parts[0] if parts else ""


def _waits(ev: Mapping[str, Any]) -> str:
    """The straggler's mark: it arrives last at each collective, so it waits least."""
    own, peers = _num(ev, "wait_ms"), _num(ev, "peer_wait_ms")
    if own is None or peers is None:
        return ""
    if own < peers:
        return (
            f"it reaches each collective last (waits {_ms(own)} per step while its peers wait {_ms(peers)})"
        )
    return f"it waits {_ms(own)} per step in collectives, its peers {_ms(peers)}"


def _kernel(ev: Mapping[str, Any]) -> str:
    name, mean, ref = ev.get("kernel"), _num(ev, "kernel_mean_us"), _num(ev, "peer_kernel_mean_us")
    if mean is None or ref is None or not ref:
        return ""
    what = f"kernel {name}" if isinstance(name, str) and name else "its slowest kernel"
    return f"{what} averages {_us(mean)} against its peers' {_us(ref)}"


def _cost(d: Diagnosis) -> str:
    ev = d.evidence
    lost, span = _num(ev, "lost_s"), _num(ev, "span_s")
    if d.cause == "unresponsive" and ev.get("hung") is True:
        return "the job waits for it"
    if d.slowdown_pct <= 0 and not lost:
        return ""
    text = f"the job loses {_pct(d.slowdown_pct)} of its throughput"
    if lost is not None and span:
        text += f" ({_s(lost)} over {_s(span)})"
    return text


def _host_stall(who: str, ev: Mapping[str, Any], excess: str) -> str:
    what = f"{who} stalls on the host"
    peak = ev.get("stall_ms")
    if ev.get("spiky") is True and isinstance(ev.get("stalls"), int):
        top = (
            max((v for v in peak if isinstance(v, int | float)), default=None)
            if isinstance(peak, list)
            else None
        )
        what += f" in {ev['stalls']} stall(s)" + (f" of up to {_ms(float(top))}" if top is not None else "")
    untracked = _top_phases(ev, ("untracked",))
    if untracked:
        return what + f", +{_ms(untracked[0][1])} per step outside the tracked phases"
    return what + (f": its step's own work takes {excess}" if excess else "")


def _throttled(who: str, ev: Mapping[str, Any], excess: str) -> str:
    clock, ref = _num(ev, "sm_clock_mhz"), _num(ev, "peer_sm_clock_mhz")
    what = f"the GPU of {who} is throttled"
    if clock is not None and ref is not None:
        what += f": its SM clock runs at {clock:.0f} MHz against its peers' {ref:.0f} MHz"
    return what + (f", and its compute takes {excess}" if excess else "")


def _straggler(d: Diagnosis, who: str, ev: Mapping[str, Any]) -> list[str]:
    """Clauses of a one-rank finding of L2/L3 (compute, host_stall, dataloader, throttling)."""
    excess = _excess(ev)
    if d.cause == "dataloader":
        data = _top_phases(ev, ("data",))
        what = f"{who} waits for its input batches"
        if data:
            what += f": its data phase takes +{_ms(data[0][1])} per step against {_basis(ev)}"
    elif d.cause == "host_stall":
        what = _host_stall(who, ev, excess)
    elif d.cause == "throttling":
        what = _throttled(who, ev, excess)
    else:
        phases = _top_phases(ev)
        phase = d.phase or (phases[0][0] if phases else None)
        what = f"{who} computes more slowly" + (f", most in {phase}" if phase else "")
        if excess:
            what += f": its own work per step takes {excess}"
    kernel = _kernel(ev) if d.cause in ("compute", "throttling") else ""
    return [c for c in (what, kernel, _waits(ev), _knock_on(ev)) if c]


def _knock_on(ev: Mapping[str, Any]) -> str:
    """The ranks that slowed while waiting for it (analyzer.causes._drop_hidden), not named apart."""
    ranks = ev.get("knock_on_ranks")
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, int) for r in ranks):
        return ""
    return f"{_some(ranks)} slowed down too while waiting for it"


def _unresponsive(who: str, ev: Mapping[str, Any]) -> list[str]:
    if ev.get("hung") is True:
        stalled = _num(ev, "stalled_s")
        text = f"{who} hangs: no progress" + (f" for {_s(stalled)}" if stalled is not None else "")
        if ev.get("at_step") is not None:
            text += f", stopped at step {ev['at_step']}" + (
                f" ({ev['at_phase']})" if isinstance(ev.get("at_phase"), str) else ""
            )
        clauses = [text]
        if isinstance(ev.get("collective"), str):
            clauses.append(f"its peers wait in collective {ev['collective']} that it never issued")
        return clauses
    silent = _num(ev, "silent_s")
    text = f"{who} stopped reporting" + (f" {_s(silent)} ago" if silent is not None else "")
    return [text + " while its peers still report"]


def _link(d: Diagnosis, ev: Mapping[str, Any]) -> list[str]:
    group = f"process group {d.group}" if d.group else "the collectives"
    ranks = f" (ranks {_ranks(d.ranks)})" if d.ranks else ""
    transfer, ref = _num(ev, "transfer_ms"), _num(ev, "reference_transfer_ms")
    if transfer is not None and ref is not None:
        text = f"{group}{ranks} transfers slowly: {_ms(transfer)} per collective against {_ms(ref)}"
        text += " of its own past" if ev.get("compared_with") == "own past" else " of its peers"
        late = _num(ev, "late_arrival_ms")
        clauses = [text]
        if late is not None:
            clauses.append(f"no rank arrives late ({_ms(late)}), so it is the link, not a rank")
        kernel = _kernel(ev)
        if kernel:
            clauses.append(kernel)
        return clauses
    kernel = _kernel(ev)
    return [f"{group}{ranks}: " + (kernel or "communication is slower than its peers'")]


def _many(d: Diagnosis, ev: Mapping[str, Any]) -> list[str]:
    """Several ranks with one cause (``ranks_slow``, ``top``, ``example``)."""
    text = f"{len(d.ranks)} ranks ({_ranks(d.ranks)}) are slower than the rest ({d.cause.replace('_', ' ')})"
    example = ev.get("example")
    top = ev.get("top")
    clauses = [text]
    if isinstance(top, list) and top and isinstance(top[0], Mapping) and isinstance(example, Mapping):
        excess = _excess(example)
        if excess:
            clauses.append(f"the slowest, rank {top[0].get('rank')}, takes {excess}")
    return clauses


def _job(d: Diagnosis, ev: Mapping[str, Any]) -> list[str]:
    """The job-level finding of :mod:`argus.analyzer.loss`: a loss no single rank explains."""
    step, healthy, extra = (
        _num(ev, "job_step_ms"),
        _num(ev, "healthy_step_ms"),
        _num(ev, "unexplained_ms_per_step"),
    )
    text = "the job's steps are slower than its healthy pace"
    if step is not None and healthy is not None:
        text = f"the job's steps take {_ms(step)} against its healthy {_ms(healthy)}"
    if extra is not None:
        text += f" (+{_ms(extra)} per step that no single rank explains)"
    clauses = [text]
    growth = ev.get("growth_ms_per_step")
    grown = (
        max(((k, float(v)) for k, v in growth.items() if _num(growth, k) is not None), key=lambda kv: kv[1])
        if isinstance(growth, Mapping) and growth
        else None
    )
    if d.cause == "unknown":
        clauses.append("no phase or transfer grew enough to name a cause")
    elif grown is not None and grown[1] > 0:
        name = {
            "untracked": "untracked host time",
            "transfer": "transfers",
            "run_queue": "the wait for a CPU",
        }.get(grown[0], grown[0])
        clauses.append(f"{name} grew by {_ms(grown[1])} per step")
    if d.ranks:
        one = len(d.ranks) == 1
        clauses.append(
            f"{_some(d.ranks)} {'is' if one else 'are'} behind {'its' if one else 'their'} own past"
        )
    return clauses


def summary(d: Diagnosis, identity: Identity | None = None) -> str:
    """One sentence: who, what, how much, how we know (module doc).

    Args:
        d: The diagnosis (its ``evidence`` as the analyzer wrote it; any key may be missing).
        identity: Host and pid per rank, to name where ``d.rank`` runs; None or a missing rank
            leaves them out.

    Returns:
        The sentence, ending with a full stop; a resolved diagnosis says so at its start.
    """
    ev: Mapping[str, Any] = d.evidence if isinstance(d.evidence, Mapping) else {}
    who = _who(d, identity)
    if d.cause == "unresponsive":
        clauses = _unresponsive(who, ev)
    elif d.cause == "communication" and d.rank is None:
        clauses = _link(d, ev)
    elif d.rank is None and "unexplained_ms_per_step" in ev:
        clauses = _job(d, ev)
    elif d.rank is None:
        clauses = _many(d, ev)
    else:
        clauses = _straggler(d, who, ev)
    clauses.append(_cost(d))
    text = "; ".join(c for c in clauses if c)
    if d.state == "resolved":
        text = ("resolved (the job finished): " if ev.get("job_finished") else "resolved: ") + text
    return text[0].upper() + text[1:] + "."


def key_evidence(d: Diagnosis) -> list[tuple[str, str]]:
    """At most :data:`MAX_EVIDENCE_LINES` ``(label, value with units)`` pairs that carry the summary.

    The figures a person checks first, in that order: the rank's own time against its reference,
    its collective wait against its peers', where the excess is, a kernel or clock, and the lost
    time. Absent evidence is skipped.
    """
    ev: Mapping[str, Any] = d.evidence if isinstance(d.evidence, Mapping) else {}
    if d.rank is None and isinstance(ev.get("example"), Mapping):
        ev = {**ev["example"], **{k: v for k, v in ev.items() if k != "example"}}
    out: list[tuple[str, str]] = []

    def pair(label: str, own_key: str, ref_key: str, fmt: Any, ref_name: str) -> None:
        own, ref = _num(ev, own_key), _num(ev, ref_key)
        if own is not None:
            out.append((label, fmt(own) + (f" ({ref_name} {fmt(ref)})" if ref is not None else "")))

    basis = "own past" if ev.get("compared_with") == "own past" else "peers"
    pair("self time per step", "self_ms", "peer_self_ms", _ms, basis)
    pair("collective wait per step", "wait_ms", "peer_wait_ms", _ms, "peers")
    phases = _top_phases(ev, (*_COMPUTE, "data", "untracked"))
    if phases:
        out.append(("excess per step by phase", ", ".join(f"{k} +{_ms(v)}" for k, v in phases[:3])))
    pair("SM clock", "sm_clock_mhz", "peer_sm_clock_mhz", lambda x: f"{x:.0f} MHz", "peers")
    if isinstance(ev.get("kernel"), str):
        pair(f"kernel {ev['kernel'][:60]} mean", "kernel_mean_us", "peer_kernel_mean_us", _us, "peers")
    pair("transfer per collective", "transfer_ms", "reference_transfer_ms", _ms, "reference")
    pair("late arrival", "late_arrival_ms", "", _ms, "")
    if "unexplained_ms_per_step" in ev:  # the job-level finding; a straggler's job step only confuses
        pair("job step", "job_step_ms", "healthy_step_ms", _ms, "healthy")
        pair("unexplained per step", "unexplained_ms_per_step", "", _ms, "")
    pair("stalled", "stalled_s", "", _s, "")
    pair("silent", "silent_s", "", _s, "")
    if isinstance(ev.get("collective"), str):
        out.append(("collective its peers wait in", ev["collective"]))
    lost, span = _num(ev, "lost_s"), _num(ev, "span_s")
    cost = (
        ("time lost", f"{_s(lost)} over {_s(span)} ({_pct(d.slowdown_pct)} of throughput)")
        if lost is not None and span is not None
        else ("throughput lost", _pct(d.slowdown_pct))
    )
    return [*out[: MAX_EVIDENCE_LINES - 1], cost]


def lines(d: Diagnosis, identity: Identity | None = None) -> list[str]:
    """What `argus demo` and `argus diagnose` print under a diagnosis's headline: its summary
    (``d.summary``, else written here), then its :func:`key_evidence` as indented lines."""
    width = max((len(k) for k, _ in key_evidence(d)), default=0)
    return [
        "  " + (d.summary or summary(d, identity)),
        *(f"    {k.ljust(width)}  {v}" for k, v in key_evidence(d)),
    ]

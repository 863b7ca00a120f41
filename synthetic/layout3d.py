"""Synthetic windows of a 3-D parallel job: pipeline × tensor × data parallel (bench and tests).

``stages`` pipeline stages, each of ``tp`` tensor-parallel ranks, replicated
``dp`` times (world = stages · tp · dp; rank = (replica · stages + stage) · tp + tp position).
Per step, a GPipe schedule of ``micro`` micro-batches:

* forward, micro-batch by micro-batch: a stage after the first blocks in
  ``recv`` for its upstream activations, computes, joins a blocking all-reduce
  of its tensor-parallel group, and ``send``\\ s downstream;
* backward in reverse order: gradients flow upstream the same way;
* the data-parallel gradient all-reduce of each (stage, tp position) group
  across replicas: one overlapped bucket issued mid-backward and the last
  one, which the end of backward waits for;
* stage 0 loads data; the last stage's compute includes the loss.

Stages have unequal work (``stage_work``). A rank in ``slow`` computes
``1 + slowdown`` times as long, from the step that starts ``onset_s`` after the first window
does. Times are int64 ns on one clock (no offsets).
Built with NumPy over all replicas and tensor positions at once: a 10,000-rank
window of several thousand steps' rows takes seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from argus.analyzer.window import Collectives, Phases, RankStatus, Steps, Window
from argus.window_grid import WindowGrid

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


@dataclass(frozen=True)
class Layout3D:
    stages: int = 5
    tp: int = 8
    dp: int = 250
    micro: int = 2
    step_ms: float = 900.0
    stage_work: tuple[float, ...] = (1.0, 1.2, 1.0, 0.9, 1.1)
    noise: float = 0.03
    slow: tuple[int, ...] = ()
    slowdown: float = 0.2
    onset_s: float = 0.0
    seed: int = 0

    @property
    def world(self) -> int:
        return self.stages * self.tp * self.dp


def _rank(
    lay: Layout3D, replica: NDArray[np.int64], stage: int, tpos: NDArray[np.int64]
) -> NDArray[np.int64]:
    return (replica * lay.stages + stage) * lay.tp + tpos


def windows(lay: Layout3D, n_windows: int, window_s: float = 10.0) -> list[Window]:
    """Play the job for ``n_windows`` windows of ``window_s`` and cut it into windows."""
    rng = np.random.default_rng(lay.seed)
    n_stages, n_tp, n_dp, n_micro = lay.stages, lay.tp, lay.dp, lay.micro
    world = lay.world
    replica = np.repeat(np.arange(n_dp), n_tp)  # (n_dp*n_tp,) for one stage's ranks
    tpos = np.tile(np.arange(n_tp), n_dp)
    ranks_of = [_rank(lay, replica, s, tpos) for s in range(n_stages)]
    slowed = np.ones(world)
    slowed[list(lay.slow)] = 1.0 + lay.slowdown
    speed = np.ones(world)
    unit = (
        lay.step_ms * 1e6 / (2 * n_micro * sum(lay.stage_work) / n_stages * 3)
    )  # compute per micro-batch pass
    # Groups: tensor-parallel "t<stage>.<replica>", data-parallel "d<stage>.<tp position>",
    # and "p" for the point-to-point transfers.
    keys = ("rank", "step", "group", "op", "issue", "end", "peer", "ovl")
    rows: dict[str, list[NDArray[np.int64]]] = {k: [] for k in keys}
    group_ids: dict[str, int] = {}

    def gid(name: str) -> int:
        return group_ids.setdefault(name, len(group_ids))

    tp_group = [np.array([gid(f"t{s}.{r}") for r in range(n_dp)])[replica] for s in range(n_stages)]
    dp_group = [np.array([gid(f"d{s}.{p}") for p in range(n_tp)])[tpos] for s in range(n_stages)]
    pp_group = gid("p")

    def coll(
        r: NDArray[np.int64],
        step: int,
        g: NDArray[np.int64],
        op: int,
        issue: NDArray[np.float64],
        end: NDArray[np.float64],
        peer: NDArray[np.int64] | int = -1,
        ovl: int = 0,
    ) -> None:
        """Rows of one collective (op 0 tensor-, 1 data-parallel all-reduce) or transfer (2 send, 3 recv)."""
        rows["rank"].append(r)
        rows["step"].append(np.full(r.size, step))
        rows["group"].append(np.broadcast_to(np.asarray(g), r.shape).astype(np.int64))
        rows["op"].append(np.full(r.size, op))
        rows["issue"].append(issue.astype(np.int64))
        rows["end"].append(end.astype(np.int64))
        rows["peer"].append(np.broadcast_to(np.asarray(peer), r.shape).astype(np.int64))
        rows["ovl"].append(np.full(r.size, ovl))

    st_rank: list[NDArray[np.int64]] = []
    st_step: list[NDArray[np.int64]] = []
    st_start: list[NDArray[np.int64]] = []
    st_dur: list[NDArray[np.int64]] = []
    ph: dict[str, list[NDArray[np.int64]]] = {k: [] for k in ("rank", "step", "phase", "start", "dur")}
    t = np.full(world, float(T0 + NS // 3))
    end_all = T0 + n_windows * WindowGrid.from_seconds(window_s).length_ns
    step = 0
    xfer_tp, xfer_pp, xfer_dp = 0.02 * unit, 0.05 * unit, 0.3 * unit
    sent = np.zeros(world)

    def compute(r: NDArray[np.int64], s: int, scale: float) -> NDArray[np.float64]:
        return unit * lay.stage_work[s] * scale * speed[r] * rng.lognormal(0, lay.noise, r.size)

    def tp_allreduce(
        step: int, r: NDArray[np.int64], s: int, when: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        last = np.full(n_dp, -np.inf)
        np.maximum.at(last, replica, when)
        done = last[replica] + xfer_tp
        coll(r, step, tp_group[s], 0, when, done)
        return done

    def p2p(
        step: int,
        src: NDArray[np.int64],
        dst: NDArray[np.int64],
        send_at: NDArray[np.float64],
        recv_at: NDArray[np.float64],
    ) -> NDArray[np.float64]:
        done = np.maximum(send_at, recv_at) + xfer_pp
        coll(src, step, np.full(src.size, pp_group), 2, send_at, done, dst)
        coll(dst, step, np.full(dst.size, pp_group), 3, recv_at, done, src)
        return done

    while t.min() < end_all:
        start = t.copy()
        if start.min() >= T0 + lay.onset_s * NS:
            speed = slowed
        data_end = t.copy()
        s0 = ranks_of[0]
        data_end[s0] += 0.05 * unit * n_micro * rng.lognormal(0, lay.noise, s0.size)
        cur = data_end.copy()
        fwd_start = cur.copy()

        # Forward, micro-batch by micro-batch, stage by stage.
        for _m in range(n_micro):
            for s in range(n_stages):
                r = ranks_of[s]
                if s > 0:
                    prev = ranks_of[s - 1]
                    cur[r] = p2p(step, prev, r, sent[prev], cur[r])
                cur[r] += compute(r, s, 1.0)
                cur[r] = tp_allreduce(step, r, s, cur[r])
                sent[r] = cur[r]
        fwd_end = cur.copy()
        # Backward in reverse.
        bucket_at = np.zeros(world)
        for m in range(n_micro):
            for s in reversed(range(n_stages)):
                r = ranks_of[s]
                if s < n_stages - 1:
                    nxt = ranks_of[s + 1]
                    cur[r] = p2p(step, nxt, r, sent[nxt], cur[r])
                cur[r] += compute(r, s, 2.0)
                if m == n_micro - 1:
                    bucket_at[r] = cur[r] - 0.5 * unit
                cur[r] = tp_allreduce(step, r, s, cur[r])
                sent[r] = cur[r]
        # Data-parallel gradient all-reduce across replicas per (stage, tp position).
        for s in range(n_stages):
            r = ranks_of[s]
            for b, (when, ovl) in enumerate(((bucket_at[r], 1), (cur[r], 1))):
                last = np.full(n_tp, -np.inf)
                np.maximum.at(last, tpos, when)
                done = last[tpos] + xfer_dp
                coll(r, step, dp_group[s], 1, when, done, ovl=ovl)
                if b == 1:
                    cur[r] = np.maximum(cur[r], done) + 0.001 * unit
        bwd_end = cur.copy()
        opt_end = bwd_end + 0.1 * unit * rng.lognormal(0, lay.noise, world)
        for k, (a, z) in enumerate(
            ((start, data_end), (fwd_start, fwd_end), (fwd_end, bwd_end), (bwd_end, opt_end))
        ):
            keep = z > a
            ph["rank"].append(np.flatnonzero(keep))
            ph["step"].append(np.full(int(keep.sum()), step))
            ph["phase"].append(np.full(int(keep.sum()), k))
            ph["start"].append(a[keep].astype(np.int64))
            ph["dur"].append((z - a)[keep].astype(np.int64))
        st_rank.append(np.arange(world))
        st_step.append(np.full(world, step))
        st_start.append(start.astype(np.int64))
        st_dur.append((opt_end - start).astype(np.int64))
        t = opt_end
        step += 1

    cat = {k: np.concatenate(v) for k, v in rows.items()}
    # Sequence numbers, in issue order: collectives count per (rank, group), transfers per
    # (rank, direction, peer), as the probe numbers them.
    order = np.lexsort((cat["issue"], cat["rank"]))
    cat = {k: v[order] for k, v in cat.items()}
    is_p2p = cat["op"] >= 2
    key = np.where(
        is_p2p, (cat["rank"] << 34) | (cat["op"] << 32) | cat["peer"], (cat["rank"] << 34) | cat["group"]
    )
    _, inv = np.unique(key, return_inverse=True)
    inv = inv.ravel()
    by_key = np.argsort(inv, kind="stable")
    first = np.r_[0, np.flatnonzero(np.diff(inv[by_key])) + 1]
    seq = np.empty(inv.size, np.int64)
    seq[by_key] = np.arange(inv.size) - np.repeat(first, np.diff(np.r_[first, inv.size]))
    steps = Steps(
        np.concatenate(st_rank), np.concatenate(st_step), np.concatenate(st_start), np.concatenate(st_dur)
    )
    phases = Phases(*(np.concatenate(ph[k]) for k in ("rank", "step", "phase", "start", "dur")))
    group_names = tuple(sorted(group_ids, key=lambda g: group_ids[g]))
    op = np.where(cat["op"] <= 1, 0, cat["op"] - 1)  # allreduce, send, recv
    out = []
    for k in range(n_windows):
        w0, w1 = (
            T0 + k * WindowGrid.from_seconds(window_s).length_ns,
            T0 + (k + 1) * WindowGrid.from_seconds(window_s).length_ns,
        )
        s_end = steps.start_ns + steps.dur_ns
        sel = (s_end >= w0) & (s_end < w1)
        ws = Steps(steps.rank[sel], steps.step[sel], steps.start_ns[sel], steps.dur_ns[sel])
        cells = (ws.rank.astype(np.int64) << 32) | ws.step
        psel = np.isin((phases.rank.astype(np.int64) << 32) | phases.step, cells)
        wp = Phases(
            phases.rank[psel],
            phases.step[psel],
            phases.phase[psel],
            phases.start_ns[psel],
            phases.dur_ns[psel],
        )
        in_win = np.isin((cat["rank"] << 32) | cat["step"], cells)
        csel = in_win | np.isin(cat["step"], np.unique(ws.step))
        wc = Collectives(
            rank=cat["rank"][csel],
            step=cat["step"][csel],
            group=cat["group"][csel],
            seq=seq[csel],
            op=op[csel],
            bytes=np.full(int(csel.sum()), 1 << 20),
            issue_ns=cat["issue"][csel],
            start_ns=cat["issue"][csel],
            dur_ns=cat["end"][csel] - cat["issue"][csel],
            in_window=in_win[csel],
            group_names=group_names,
            op_names=("allreduce", "send", "recv"),
            peer=cat["peer"][csel],
            overlapped=cat["ovl"][csel].astype(bool),
        )
        status = RankStatus(
            rank=np.arange(world),
            exited=np.zeros(world, bool),
            exit_code=np.zeros(world, np.int64),
            last_seen_ns=np.full(world, w1 - NS),
            last_progress_ns=np.full(world, w1 - NS),
            position=np.full(world, 1),
            has_gpu=np.ones(world, bool),
        )
        out.append(Window("layout3d", w0, w1, ws, wp, wc, status=status))
    return out

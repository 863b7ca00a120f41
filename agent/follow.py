"""`argus run`'s terminal follows the job's diagnoses: a line as each opens and resolves, then a verdict.

How the diagnoses reach `argus run`: over the REST API of the `argus server` (``--server``, else
``$ARGUS_SERVER``, else port 7471 on the collector's host), with the token and TLS certificate
`argus run` already has, one ``GET /api/v1/jobs/{id}/diagnoses`` every :data:`POLL_S`, all on one
HTTP client kept for the job's life (its connection kept alive; a client made per read cost about
20 ms of CPU, its TLS context and CA bundle: 1 % of a core beside the training job). Not on the
node agent's stream: the agent a job uses may be a node's shared one, not started by this `argus
run`, and it serves every job of its node. Only node rank 0 of a multi-node job follows
(:func:`node_rank`); the other nodes stay quiet, and ``--quiet`` turns it off.

Every value printed goes through :func:`argus.render.printable` (a host or kernel name is the
job's text, not the terminal's commands). The server not answering is said once, never retried
noisily; the job is never delayed by it (the follower is a daemon thread, each request bounded
by :data:`REQUEST_TIMEOUT_S`).
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence

from argus import config, render
from argus.client import ArgusClient
from argus.diagnosis import Diagnosis, State
from argus.errors import ArgusError, NotFound, Unauthenticated

__all__ = ["POLL_S", "REQUEST_TIMEOUT_S", "Follower", "node_rank", "server_url", "verdict"]

#: Seconds between two reads of the job's diagnoses.
POLL_S = 2.0
#: Longest wait for one answer of the server, seconds.
REQUEST_TIMEOUT_S = 5.0
#: What one read of the diagnoses found (:meth:`Follower._read`).
_READ, _MISSING, _REFUSED, _UNREACHABLE = "read", "missing", "refused", "unreachable"
#: Where launchers put the node's rank (torchrun's ``--node-rank`` wins over them).
_NODE_RANK_ENV = ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID")
_NODE_RANK_FLAG = re.compile(r"--node[-_]rank(?:=(\S+))?$")


def node_rank(cmd: Sequence[str], environ: Mapping[str, str]) -> int:
    """The node rank of this node in the job: a ``--node-rank``/``--node_rank`` in ``cmd`` (torchrun's,
    ``=N`` or the next word), else ``$NODE_RANK``, ``$GROUP_RANK`` or ``$SLURM_NODEID``, else 0
    (one node). A value that is not an integer counts as 0."""
    for i, word in enumerate(cmd):
        m = _NODE_RANK_FLAG.match(word)
        if m:
            value = m.group(1) if m.group(1) is not None else (cmd[i + 1] if i + 1 < len(cmd) else "")
            return _int(value)
    for name in _NODE_RANK_ENV:
        if environ.get(name, "").strip():
            return _int(environ[name])
    return 0


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        return 0


def server_url(collector: str, environ: Mapping[str, str]) -> str:
    """The REST URL `argus run` follows: ``$ARGUS_SERVER``, else ``http://HOST:7471`` with the host of
    ``collector`` (``HOST:PORT``: `argus server` serves gRPC and REST on one host)."""
    given = environ.get(config.ENV_SERVER, "").strip()
    if given:
        return given
    host = collector.rpartition(":")[0] or "127.0.0.1"
    port = config.DEFAULT_HTTP_LISTEN.rpartition(":")[2]
    return f"http://{host}:{port}"


def _place(d: Diagnosis) -> str:
    """``phase forward, kernel K, process group G``: where the diagnosis points, '' when nowhere."""
    parts = (("phase", d.phase), ("kernel", d.kernel), ("process group", d.group))
    return ", ".join(f"{name} {value}" for name, value in parts if value)


def _opened(d: Diagnosis, job_id: str) -> str:
    place = _place(d)
    return (
        f"argus: diagnosis opened: {render.who(d)} {d.cause}"
        + (f" ({place})" if place else "")
        + f", slows the job about {d.slowdown_pct:.0f} %; details: argus diagnose --job {job_id}"
    )


def _resolved(d: Diagnosis) -> str:
    held_s = max(d.last_window_ns - d.first_window_ns, 0) / 1e9
    lost = render.lost(d)
    return f"argus: diagnosis resolved: {render.who(d)} {d.cause} after {held_s:.0f} s" + (
        f", {lost} lost" if lost != "-" else ""
    )


def verdict(job_id: str, diagnoses: Sequence[Diagnosis], server: str) -> str:
    """One paragraph on the job's diagnoses at its end: "no diagnosis", or each one's rank, cause,
    slowdown, time lost and state, then where the details are (`argus diagnose`, the page)."""
    page = f"{server.rstrip('/')}/#job={job_id}"
    if not diagnoses:
        return (
            f"argus: job {job_id}: no diagnosis: every rank ran like its peers in the windows analysed "
            f"(the last few seconds are analysed after the job ends; see {page})."
        )
    parts = []
    for d in sorted(diagnoses, key=lambda d: d.first_window_ns):
        lost = render.lost(d)
        still = "still open at the end" if d.state == State.OPEN else "resolved"
        parts.append(
            f"{render.who(d)} {d.cause}, about {d.slowdown_pct:.0f} % slower"
            + (f", {lost} lost" if lost != "-" else "")
            + f" ({still})"
        )
    return (
        f"argus: job {job_id}: {len(diagnoses)} diagnosis(es): " + "; ".join(parts) + ". "
        f"Details and evidence: argus diagnose --job {job_id}, or {page}."
    )


class Follower:
    """Reads a job's diagnoses in a daemon thread and prints their openings and resolutions.

    Args:
        server: The REST URL (:func:`server_url`).
        job_id: The job.
        token: Bearer token, as for the collector.
        tls_cert: PEM file to trust (TLS), as for the collector.
        say: Where a line goes (default: stderr, flushed); each line is :func:`argus.render.printable`.
        poll_s: Seconds between two reads.
    """

    def __init__(
        self,
        server: str,
        job_id: str,
        *,
        token: str | None = None,
        tls_cert: str | None = None,
        say: Callable[[str], None] | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.server = server
        self.job_id = job_id
        self._client_args = {"token": token, "tls_cert": tls_cert, "timeout_s": REQUEST_TIMEOUT_S}
        self._say = say or _stderr
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._told: dict[str, str] = {}  # id -> the state last printed
        self._latest: dict[str, Diagnosis] = {}
        self._failed = False  # the server did not answer (said once)
        self._client: ArgusClient | None = None  # made by the first read, kept until finish()
        self._thread = threading.Thread(target=self._loop, name="argus-follow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        """Stop following, read once more and print the verdict, or why there is none (the server
        did not answer, refused the token, or has no record of the job)."""
        self._stop.set()
        self._thread.join(timeout=REQUEST_TIMEOUT_S + 1)
        if self._thread.is_alive():
            return  # a read still hangs: nothing reliable to say
        try:
            got = self._read()
        finally:
            if self._client is not None:
                self._client.close()
                self._client = None
        if got == _READ:
            self._print(verdict(self.job_id, list(self._latest.values()), self.server))
        elif got == _MISSING:
            self._print(
                f"argus: no verdict for job {self.job_id}: the argus server {self.server} has no record "
                "of it (pass --server URL: the server of the collector the job reported to)"
            )
        else:
            self._print(
                f"argus: no verdict for job {self.job_id}: the argus server {self.server} did not answer"
            )

    def _loop(self) -> None:
        while not self._stop.wait(self._poll_s):
            if self._read() == _REFUSED:
                return

    def _read(self) -> str:
        """One read; prints what changed. Returns :data:`_READ`, :data:`_MISSING` (no row of the job
        stored yet), :data:`_REFUSED` (the token: following stops) or :data:`_UNREACHABLE`."""
        try:
            if self._client is None:
                self._client = ArgusClient(self.server, **self._client_args)  # type: ignore[arg-type]
            found = self._client.diagnoses(self.job_id)
        except NotFound:
            return _MISSING
        except Unauthenticated as exc:
            self._fail(f"argus: cannot follow the diagnoses: {exc}")
            return _REFUSED
        except ArgusError as exc:
            self._fail(
                f"argus: cannot follow the diagnoses at {self.server} ({exc}); pass --server URL (or --quiet)"
            )
            return _UNREACHABLE
        self._latest.update({d.id: d for d in found})  # one version per id: the newest
        for d in sorted(self._latest.values(), key=lambda d: d.first_window_ns):
            told = self._told.get(d.id)
            if d.state == State.OPEN and told is None:
                self._print(_opened(d, self.job_id))
            elif d.state not in (State.OPEN, told):
                if told is None:
                    self._print(_opened(d, self.job_id))
                self._print(_resolved(d))
            self._told[d.id] = d.state
        return _READ

    def _fail(self, line: str) -> None:
        if not self._failed:
            self._failed = True
            self._print(line)

    def _print(self, line: str) -> None:
        self._say(render.printable(line))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

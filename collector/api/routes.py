"""The JSON endpoints under ``/api/v1`` (docs/design.md §9.1); thin: parse, call a reader, answer."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Path, Query, UploadFile
from fastapi.responses import JSONResponse
from pydantic import AfterValidator

from argus.collector.api.diagnoses import list_diagnoses
from argus.collector.api.errors import ERROR_RESPONSES
from argus.collector.api.heatmap import heatmap
from argus.collector.api.jobs import list_jobs, list_ranks, require_ranks, unknown_job
from argus.collector.api.models import (
    DiagnosisPage,
    Heatmap,
    ImportOut,
    Job,
    JobPage,
    RankPage,
    StackPage,
    TraceDocument,
)
from argus.collector.api.params import BadParameter, RankSet, parse_ranks, parse_time_ns
from argus.collector.api.stacks import StackQuery, stacks_answer
from argus.collector.api.trace import chrome_trace
from argus.collector.importer import import_traces
from argus.config import ApiSettings
from argus.diagnosis import Cause, State
from argus.jobid import JOB_ID_RULE, check_job_id, content_disposition
from argus.limits import ByteBudget, SharedBytes
from argus.store import Store

__all__ = ["build_router"]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No such job"}}
_BAD: dict[int | str, dict[str, Any]] = {422: {"description": "A parameter the API cannot use"}}

Limit = Annotated[int, Query(ge=1, le=1000, description="most items in the page")]
Cursor = Annotated[
    str | None, Query(max_length=512, description="the `next` of the previous page; omit for the first")
]
# The one job-id rule (argus.jobid); a bad id is a 422 whose message states the rule.
JobId = Annotated[str, Path(description=JOB_ID_RULE), AfterValidator(check_job_id)]
TimeParam = Annotated[
    str | None,
    Query(max_length=64, description="epoch ns (`1718000000000000000`) or RFC 3339 (`2024-06-10T06:13:20Z`)"),
]
# 8,000 characters hold 1,000 ranges and keep the request head under uvicorn's (h11) limit.
RanksParam = Annotated[
    str | None,
    Query(max_length=8000, pattern=r"^[0-9, -]+$", description="ranks and inclusive ranges, e.g. `0,1,5-7`"),
]


def _ranks(value: str | None) -> RankSet | None:
    return parse_ranks("ranks", value) if value is not None else None


def _time(name: str, value: str | None) -> int | None:
    return parse_time_ns(name, value) if value is not None else None


def _range(start: str | None, end: str | None) -> tuple[int | None, int | None]:
    lo, hi = _time("start", start), _time("end", end)
    if lo is not None and hi is not None and hi < lo:
        raise BadParameter("end", "is before start")
    return lo, hi


def build_router(store: Store, settings: ApiSettings) -> APIRouter:
    """The ``/api/v1`` router over ``store``; errors are raised, mapped by errors.

    A job's rank is ``running`` while its heartbeats are at most ``settings.heartbeat_timeout_ns``
    old. ``settings.max_upload_bytes`` caps the decompressed JSON text of one trace upload and of all
    uploads parsed at once; ``settings.max_upload_parse_s`` the CPU seconds of parsing one (413 past
    either, as past ``max_inflate_ratio``: :class:`argus.limits.ByteBudget`); uploads are summarised
    in ``settings.window``.
    """
    heartbeat_timeout_ns = settings.heartbeat_timeout_ns
    uploads = SharedBytes(settings.max_upload_bytes)
    router = APIRouter(prefix="/api/v1", responses={**ERROR_RESPONSES, **_BAD})

    @router.get("/jobs", response_model=JobPage, summary="List jobs, newest first")
    def get_jobs(limit: Limit = 100, cursor: Cursor = None) -> dict[str, Any]:
        """Jobs with their status (`running`, `finished`, `unknown`; see the README for the rule)."""
        items, nxt = list_jobs(
            store, limit=limit, cursor=cursor, now_ns=time.time_ns(), timeout_ns=heartbeat_timeout_ns
        )
        return {"items": items, "next": nxt}

    @router.get("/jobs/{job_id}", response_model=Job, responses=_NOT_FOUND, summary="One job")
    def get_job(job_id: JobId) -> dict[str, Any]:
        items, _ = list_jobs(
            store, limit=1, cursor=None, now_ns=time.time_ns(), timeout_ns=heartbeat_timeout_ns, job_id=job_id
        )
        if not items:
            raise unknown_job(store, job_id)
        return items[0]

    @router.get(
        "/jobs/{job_id}/ranks", response_model=RankPage, responses=_NOT_FOUND, summary="A job's ranks"
    )
    def get_ranks(job_id: JobId, ranks: RanksParam = None, limit: Limit = 100, cursor: Cursor = None) -> Any:
        """Ranks in rank order with host, device, process groups, lifecycle and status; `ranks`
        naming ranks beyond the job's world size answers 422 naming them."""
        selected = _ranks(ranks)
        require_ranks(store, job_id, selected)
        items, nxt = list_ranks(
            store,
            job_id,
            ranks=selected,
            limit=limit,
            cursor=cursor,
            now_ns=time.time_ns(),
            timeout_ns=heartbeat_timeout_ns,
        )
        return {"items": items, "next": nxt}

    @router.get(
        "/jobs/{job_id}/diagnoses",
        response_model=DiagnosisPage,
        responses=_NOT_FOUND,
        summary="A job's diagnoses, newest first",
    )
    def get_diagnoses(
        job_id: JobId,
        state: Annotated[
            State | Literal["all"] | None,
            Query(description="`open`, `resolved`, or `all` (the default: both)"),
        ] = None,
        cause: Cause | None = None,
        limit: Limit = 100,
        cursor: Cursor = None,
    ) -> Any:
        """Each item is the diagnosis object (docs/design.md §7); filter by `state` and `cause`."""
        items, nxt = list_diagnoses(
            store, job_id, state=None if state == "all" else state, cause=cause, limit=limit, cursor=cursor
        )
        return {"items": items, "next": nxt}

    @router.get(
        "/jobs/{job_id}/stacks",
        response_model=StackPage,
        responses={**_NOT_FOUND, 200: {"content": {"text/plain": {}}}},
        summary="Sampled CPU stacks of a job's ranks (JSON, or folded text for flame graphs)",
    )
    def get_stacks(
        job_id: JobId,
        rank: Annotated[int | None, Query(ge=0, le=2**32 - 1, description="only this rank")] = None,
        start: TimeParam = None,
        end: TimeParam = None,
        capture: Annotated[
            str | None,
            Query(
                max_length=256, description="only this capture (a diagnosis's `evidence.stacks.capture_id`)"
            ),
        ] = None,
        format: Annotated[
            Literal["json", "collapsed"],
            Query(description="`json` (pages of rows) or `collapsed` (folded stacks, all rows asked for)"),
        ] = "json",
        limit: Limit = 100,
        cursor: Cursor = None,
    ) -> Any:
        """Stack rows of captures overlapping [start, end] (argus.agent.stacks): thread, frames (root
        to leaf), samples, idle, GIL, and the sampler that took them."""
        lo, hi = _range(start, end)
        query = StackQuery(job_id, rank, lo, hi, capture)
        return stacks_answer(store, query, collapsed=format == "collapsed", limit=limit, cursor=cursor)

    @router.get(
        "/jobs/{job_id}/trace",
        response_model=TraceDocument,
        responses=_NOT_FOUND,
        summary="Timeline as Chrome trace JSON (opens in Perfetto)",
    )
    def get_trace(
        job_id: JobId,
        start: TimeParam = None,
        end: TimeParam = None,
        ranks: RanksParam = None,
        max_events: Annotated[int, Query(ge=1, le=2_000_000, description="bound on events")] = 200_000,
    ) -> JSONResponse:
        """Steps, phases, collectives and kernels overlapping [start, end], one process per rank."""
        lo, hi = _range(start, end)
        selected = _ranks(ranks)
        require_ranks(store, job_id, selected)
        doc = chrome_trace(store, job_id, start_ns=lo, end_ns=hi, ranks=selected, max_events=max_events)
        return JSONResponse(doc, headers={"Content-Disposition": content_disposition(f"argus-{job_id}.json")})

    @router.get(
        "/jobs/{job_id}/heatmap",
        response_model=Heatmap,
        responses=_NOT_FOUND,
        summary="Rank × time heatmap of busy, step or phase time and slowdown",
    )
    def get_heatmap(
        job_id: JobId,
        metric: Annotated[
            Literal["busy", "step", "data", "forward", "backward", "optimizer"],
            Query(description="busy = step time minus collective wait; step; or a phase"),
        ] = "busy",
        start: TimeParam = None,
        end: TimeParam = None,
        bins: Annotated[int, Query(ge=1, le=500, description="time bins")] = 60,
        max_rows: Annotated[int, Query(ge=1, le=1024, description="most rows (rank ranges beyond)")] = 128,
    ) -> Any:
        """What the page draws; a row's value is its slowest rank's mean per bin."""
        lo, hi = _range(start, end)
        return heatmap(store, job_id, metric=metric, start_ns=lo, end_ns=hi, bins=bins, max_rows=max_rows)

    @router.post(
        "/jobs/{job_id}/traces",
        response_model=ImportOut,
        status_code=201,
        responses={
            400: {"description": "The body is not valid multipart/form-data"},
            413: {
                "description": "The body or its decompressed text is past --max-upload-bytes, "
                "a gzip file inflates past 200x, or parsing is past --max-upload-parse-s"
            },
            422: {"description": "A file cannot be imported (nothing of the upload is written)"},
            501: {"description": "Trace import is not built into this server"},
        },
        summary="Import PyTorch profiler (Kineto) traces, one file per rank",
    )
    def post_traces(
        job_id: JobId,
        file: Annotated[
            list[UploadFile], File(description="one part named `file` per trace (.json or .json.gz)")
        ],
        rank: Annotated[
            int | None, Query(ge=0, le=2**32 - 1, description="rank of a single file without its own")
        ] = None,
    ) -> Any:
        """Loads the traces into the same tables as live capture, under `job_id`."""
        names = [f.filename or f"upload {i}" for i, f in enumerate(file)]
        budget = ByteBudget(
            settings.max_upload_bytes, "the upload", max_parse_s=settings.max_upload_parse_s, shared=uploads
        )
        try:
            result = import_traces(
                store,
                [f.file for f in file],
                job_id=job_id,
                rank=rank,
                names=names,
                window=settings.window,
                budget=budget,
            )
        finally:
            budget.release()
        return {"job_id": result.job_id, "ranks": list(result.ranks), "rows": dict(result.rows)}

    return router

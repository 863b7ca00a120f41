"""Client side of the REST API: a small HTTP client for commands, `argus diagnose` and `argus jobs`.

:class:`ArgusClient` maps HTTP answers to :mod:`argus.errors` (404 → NotFound,
401 → Unauthenticated, 422 → ConfigError or TraceError for uploads, 501 →
NotBuiltYet, 503 → StoreError, an unreachable server → StoreError), so
commands print one clear line. With ``tls_cert`` the server's certificate (or
its CA) is trusted and ``http://`` URLs are upgraded to ``https://``.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from argus.diagnosis import Diagnosis
from argus.errors import (
    ArgusError,
    ConfigError,
    NotBuiltYet,
    NotFound,
    StoreError,
    TraceError,
    Unauthenticated,
)

__all__ = ["ArgusClient", "diagnose_main", "jobs_main"]

_ERRORS: dict[int, type[ArgusError]] = {
    401: Unauthenticated,
    404: NotFound,
    422: ConfigError,
    501: NotBuiltYet,
    503: StoreError,
}


class ArgusClient:
    """JSON over HTTP to an `argus server`.

    Args:
        server: Base URL, e.g. ``http://127.0.0.1:7471``.
        token: Sent as ``Authorization: Bearer TOKEN``.
        tls_cert: PEM file of the server's certificate or CA: use TLS and trust it.
        timeout_s: Per-request timeout, seconds.
    """

    def __init__(
        self, server: str, *, token: str | None = None, tls_cert: str | None = None, timeout_s: float = 30.0
    ) -> None:
        base = server.rstrip("/")
        if "://" not in base:
            base = f"http://{base}"
        verify: ssl.SSLContext | bool = True
        if tls_cert:
            if base.startswith("http://"):
                base = "https://" + base[len("http://") :]
            try:
                verify = ssl.create_default_context(cafile=tls_cert)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"--tls-cert {tls_cert}: {exc}") from exc
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = base
        self._http = httpx.Client(base_url=base, headers=headers, verify=verify, timeout=timeout_s)

    def __enter__(self) -> ArgusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, upload: bool = False, **kwargs: Any) -> httpx.Response:
        """Send a request; a non-2xx answer raises the matching ArgusError with the server's detail.

        Raises:
            NotFound, Unauthenticated, ConfigError (TraceError when ``upload``), NotBuiltYet,
            StoreError (also when the server cannot be reached), ArgusError for other statuses.
        """
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise StoreError(f"cannot reach the argus server at {self.server}: {exc}") from exc
        if response.is_success:
            return response
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        kind = (
            TraceError
            if upload and response.status_code == 422
            else _ERRORS.get(response.status_code, ArgusError)
        )
        raise kind(f"{response.status_code} from {self.server}{path}: {detail}")

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        """GET ``path`` (under the server root) and return its JSON."""
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        return self.request("GET", path, params=clean).json()

    def items(self, path: str, params: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list, following ``next`` cursors."""
        query = dict(params or {})
        while True:
            page = self.get(path, query)
            yield from page["items"]
            if not page.get("next"):
                return
            query["cursor"] = page["next"]

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.get(f"/api/v1/jobs/{_quote(job_id)}"))

    def diagnoses(self, job_id: str, *, state: str | None = None) -> list[Diagnosis]:
        """Every diagnosis of ``job_id``, newest first."""
        path = f"/api/v1/jobs/{_quote(job_id)}/diagnoses"
        return [Diagnosis.from_dict(d) for d in self.items(path, {"state": state, "limit": 1000})]

    def upload_traces(self, job_id: str, paths: Sequence[Path], *, rank: int | None = None) -> dict[str, Any]:
        """POST trace files to ``/api/v1/jobs/{job_id}/traces``; returns the import result.

        Raises:
            TraceError: the server could not import a file.
        """
        handles = [p.open("rb") for p in paths]
        try:
            files = [
                ("file", (p.name, h, "application/octet-stream")) for p, h in zip(paths, handles, strict=True)
            ]
            params = {"rank": rank} if rank is not None else {}
            response = self.request(
                "POST", f"/api/v1/jobs/{_quote(job_id)}/traces", upload=True, files=files, params=params
            )
            return dict(response.json())
        finally:
            for h in handles:
                h.close()


def _quote(part: str) -> str:
    return quote(part, safe="")


def diagnose_main(args: argparse.Namespace) -> int:
    """`argus diagnose --job ID [--server URL] [--json] [--token T] [--tls-cert F]`.

    Prints the job's diagnoses as a table, or with ``--json`` a JSON array of
    docs/design.md §7 objects on stdout. Returns 0; errors raise ArgusError (the CLI prints them).
    """
    with ArgusClient(args.server, token=args.token, tls_cert=getattr(args, "tls_cert", None)) as client:
        job = client.job(args.job)
        diagnoses = client.diagnoses(args.job)
    if args.json:
        json.dump([d.to_dict() for d in diagnoses], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console

    from argus import render

    # Piped output keeps whole cells (rich would wrap them at 80 columns).
    Console(width=None if sys.stdout.isatty() else 200).print(render.table(job, diagnoses))
    return 0


def jobs_main(args: argparse.Namespace) -> int:
    """`argus jobs [--server URL] [--json] [--token T] [--tls-cert F]`: every job, newest first.

    Prints a table (:func:`argus.render.jobs`: times in the local zone, as `argus diagnose`), or
    with ``--json`` a JSON array of the REST API's job objects. Returns 0; errors raise ArgusError
    (the CLI prints them).
    """
    with ArgusClient(args.server, token=args.token, tls_cert=getattr(args, "tls_cert", None)) as client:
        jobs = list(client.items("/api/v1/jobs", {"limit": 1000}))
    if args.json:
        json.dump(jobs, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console

    from argus import render

    Console(width=None if sys.stdout.isatty() else 200).print(render.jobs(jobs))
    return 0

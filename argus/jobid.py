"""The one job-id rule (docs/design.md §8.2), checked the same way at every entry.

A job id is 1 to :data:`MAX_JOB_ID_BYTES` (256) bytes of UTF-8 with no control
character (Unicode category ``Cc``: U+0000-U+001F, U+007F-U+009F) and no ``/``.
Anything else is allowed: Unicode, spaces, quotes, ``%``, ``?``, ``#``, ``\\``.

Entries and what they answer for a bad id: gRPC ingest (a REJECTED ack with
``INVALID_ARGUMENT``), trace import (``TraceError``; 422 over REST), the REST API
(422 naming the rule) and ``argus run`` (exit status 2 before the command starts).

Where an id must go into an HTTP header, :func:`content_disposition` encodes it
per RFC 6266 / RFC 8187 (``filename*=UTF-8''...``) with an ASCII fallback.
"""

from __future__ import annotations

import unicodedata
import urllib.parse

__all__ = ["JOB_ID_RULE", "MAX_JOB_ID_BYTES", "check_job_id", "content_disposition"]

#: Longest job id, bytes of UTF-8.
MAX_JOB_ID_BYTES = 256
#: The rule in words, quoted by every refusal.
JOB_ID_RULE = f"a job id is 1-{MAX_JOB_ID_BYTES} bytes of UTF-8 with no control characters and no '/'"


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` when it follows the rule of this module; raise otherwise.

    Raises:
        ValueError: the message names the problem and quotes :data:`JOB_ID_RULE`.
    """
    if not isinstance(job_id, str):
        raise ValueError(f"job id {job_id!r} is not a string: {JOB_ID_RULE}")
    try:
        size = len(job_id.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise ValueError(f"job id {job_id!r} is not valid UTF-8 ({exc.reason}): {JOB_ID_RULE}") from exc
    if size == 0:
        raise ValueError(f"job id is empty: {JOB_ID_RULE}")
    if size > MAX_JOB_ID_BYTES:
        raise ValueError(f"job id is {size} bytes long: {JOB_ID_RULE}")
    if "/" in job_id:
        raise ValueError(f"job id {job_id!r} contains '/': {JOB_ID_RULE}")
    for i, char in enumerate(job_id):
        if unicodedata.category(char) == "Cc":
            raise ValueError(
                f"job id {job_id!r} has control character U+{ord(char):04X} at {i}: {JOB_ID_RULE}"
            )
    return job_id


def content_disposition(filename: str, disposition: str = "inline") -> str:
    """A ``Content-Disposition`` value naming ``filename``, safe for any Unicode name (RFC 6266).

    ``filename="..."`` holds an ASCII fallback (non-ASCII, quotes, backslashes and
    control characters replaced by ``_``) for old clients; ``filename*=UTF-8''...``
    holds the exact name, percent-encoded (RFC 8187), which current browsers and
    curl prefer.
    """
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in filename)
    exact = urllib.parse.quote(filename, safe="", encoding="utf-8")
    return f"{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{exact}"

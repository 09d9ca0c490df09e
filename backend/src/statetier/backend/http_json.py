"""One HTTP call with a JSON body and a JSON answer, on the standard library.

The compaction protocol is small JSON over HTTP, spoken by the backend's client
(:mod:`statetier.backend.compaction_client`) and by the compaction service's workers alike; this
helper is what both share, so that a worker need not import the backend's client, and it sits
at the bottom of the backend's layers (it imports nothing of statetier).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

__all__ = ["call_json"]


def call_json(
    method: str, url: str, body: Any = None, *, token: str = "", timeout: float = 5.0
) -> tuple[int, Any]:
    """One HTTP call with a JSON body and answer; returns (status, parsed body).

    HTTP errors come back as their status with the JSON error body; connection problems raise
    ``OSError`` (``urllib.error.URLError`` is one). ``token``, when given, goes as a bearer
    token.
    """
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), _parse(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), _parse(exc.read())


def _parse(raw: bytes) -> Any:
    """The answer's JSON; a body that is not JSON becomes an error naming its first bytes."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"error": "invalid", "message": raw[:200].decode(errors="replace")}

"""A small async Kubernetes API client for the objects the operator owns.

kopf watches and patches the resources it handles, but the operator also applies Deployments
and Services (server-side apply, field manager ``statetier-operator``), patches the status of a
CompactionService when its Deployments change, and reads objects. Every write names the field
manager, so ``metadata.managedFields`` says ``statetier-operator`` (not ``Python``, which is what
an apiserver makes of aiohttp's User-Agent). This client does that with the very credentials
kopf logged in with (see :func:`remember`), over aiohttp, which kopf already depends on: no
second Kubernetes library and no second login path to keep in step.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from typing import Any

import aiohttp
import kopf

__all__ = ["FIELD_MANAGER", "ApiClient", "ApiError", "client", "remember"]

Obj = dict[str, Any]

FIELD_MANAGER = "statetier-operator"
_USER_AGENT = f"{FIELD_MANAGER}/0.1.0"

_connection: kopf.ConnectionInfo | None = None
_client: ApiClient | None = None


class ApiError(RuntimeError):
    """The apiserver answered an error; ``code`` is the HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"HTTP {code}: {message}")
        self.code = code


def remember(connection: kopf.ConnectionInfo) -> None:
    """Keep the credentials kopf uses (called from the operator's login handler)."""
    global _connection  # noqa: PLW0603 - one connection per operator process
    _connection = connection


def client() -> ApiClient:
    """The process-wide client, built on first use from the remembered credentials."""
    global _client  # noqa: PLW0603 - one client (one connection pool) per process
    if _client is None:
        if _connection is None:
            raise RuntimeError("no Kubernetes credentials yet: the login handler has not run")
        _client = ApiClient(_connection)
    return _client


def _ssl_context(conn: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if not conn.server.startswith("https://"):
        return False
    if conn.insecure:
        return False
    context = ssl.create_default_context()
    if conn.ca_path:
        context.load_verify_locations(cafile=conn.ca_path)
    elif conn.ca_data:
        data = conn.ca_data if isinstance(conn.ca_data, bytes) else conn.ca_data.encode()
        context.load_verify_locations(cadata=_maybe_b64(data).decode())
    cert, key = conn.certificate_path, conn.private_key_path
    if conn.certificate_data and conn.private_key_data:
        cert = _temp_pem(conn.certificate_data)
        key = _temp_pem(conn.private_key_data)
    if cert and key:
        context.load_cert_chain(cert, key)
    return context


def _maybe_b64(data: bytes) -> bytes:
    return data if data.lstrip().startswith(b"-----") else base64.b64decode(data)


def _temp_pem(data: str | bytes) -> str:
    raw = data if isinstance(data, bytes) else data.encode()
    handle = tempfile.NamedTemporaryFile(suffix=".pem", delete=False)  # noqa: SIM115
    with handle:
        handle.write(_maybe_b64(raw))
    return handle.name


class ApiClient:
    """GET, POST and merge-PATCH of JSON objects by URL path; 404 on GET gives None."""

    def __init__(self, conn: kopf.ConnectionInfo) -> None:
        self._base = conn.server.rstrip("/")
        self._headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
        if conn.token:
            self._headers["Authorization"] = f"{conn.scheme or 'Bearer'} {conn.token}"
        self._ssl = _ssl_context(conn)
        self._session: aiohttp.ClientSession | None = None

    async def _request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Obj | None:
        result = await self._exchange(method, path, body, content_type)
        return result[1] if result is not None else None

    async def _exchange(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Obj] | None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=aiohttp.ClientTimeout(total=30)
            )
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self._session.request(
            method, self._base + path, json=body, headers=headers, ssl=self._ssl
        ) as response:
            text = await response.text()
            try:
                data: Any = json.loads(text) if text.strip() else {}
            except ValueError:  # e.g. an HTML error page from a proxy: keep it for the message
                data = text[:500]
            if response.status == 404 and method == "GET":
                return None
            if response.status >= 400:
                message = data.get("message", "") if isinstance(data, dict) else str(data)
                raise ApiError(response.status, f"{method} {path}: {message}")
            return response.status, data if isinstance(data, dict) else {}

    async def get(self, path: str) -> Obj | None:
        return await self._request("GET", path)

    async def merge_patch(self, path: str, patch: Obj) -> Obj:
        url = f"{path}?fieldManager={FIELD_MANAGER}"
        return await self._request("PATCH", url, patch, "application/merge-patch+json") or {}

    async def apply(self, path: str, body: Obj) -> tuple[bool, Obj]:
        """Server-side apply of ``body`` at ``path`` (the object's URL), forcing ownership of
        the fields it sets, as a controller does with what it owns; (created?, the object)."""
        url = f"{path}?fieldManager={FIELD_MANAGER}&force=true"
        result = await self._exchange("PATCH", url, body, "application/apply-patch+yaml")
        assert result is not None  # only a GET answers None
        return result[0] == 201, result[1]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

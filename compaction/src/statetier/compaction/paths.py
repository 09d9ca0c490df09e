"""Which object-storage locations a compaction job may touch.

The service reads and writes with its own credentials on behalf of whoever can reach its HTTP
port, so every URL in a request (inputs and output prefix) must lie under one of the prefixes
the operator configured (``--allowed-prefix``). The check is by path segment after parsing, not
by string prefix: ``s3://bucket/ckpt`` allows ``s3://bucket/ckpt/x`` but not
``s3://bucket/ckpt-other/x``; ``..`` and ``.`` segments (also percent-encoded), backslashes,
empty segments, queries and fragments are refused outright rather than normalized, because a
storage layer might resolve them differently from this check. Gateway and worker both check:
a worker does not trust the gateway to have done it.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Iterable, Sequence

from statetier.backend.snapshot.compaction import CompactionRequest

__all__ = ["PathPolicy", "RefusedPathError"]

_SCHEMES = ("s3", "file", "memory")


class RefusedPathError(ValueError):
    """A URL of a request is malformed or outside the allowed prefixes."""


@dataclasses.dataclass(frozen=True)
class _Location:
    scheme: str
    segments: tuple[str, ...]  # bucket (or first directory) first


def _parse(url: str, what: str) -> _Location:
    if "://" not in url:
        raise RefusedPathError(
            f"{what} {url!r} is not a URL (expected s3://, file:// or memory://)"
        )
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise RefusedPathError(f"{what} {url!r}: scheme {scheme!r} is not served")
    if any(c in rest for c in "?#\\") or any(ord(c) < 32 for c in rest):
        raise RefusedPathError(f"{what} {url!r} contains a query, fragment or control character")
    parts = rest.strip("/").split("/") if rest.strip("/") else []
    for part in parts:
        decoded = urllib.parse.unquote(part)
        if part == "" or decoded in (".", "..") or ("/" in decoded and ".." in decoded.split("/")):
            raise RefusedPathError(f"{what} {url!r} contains an empty, '.' or '..' path segment")
    return _Location(scheme, tuple(parts))


class PathPolicy:
    """The allowed prefixes, and the check of a request against them."""

    def __init__(self, prefixes: Iterable[str]) -> None:
        self.prefixes = tuple(prefixes)
        self._allowed = tuple(_parse(p, "allowed prefix") for p in self.prefixes)
        for location, text in zip(self._allowed, self.prefixes, strict=True):
            if not location.segments:
                raise ValueError(f"allowed prefix {text!r} names no bucket or directory")

    def check_url(self, url: str, what: str = "URL") -> None:
        """Raise :class:`RefusedPathError` unless ``url`` is under an allowed prefix."""
        location = _parse(url, what)
        for allowed in self._allowed:
            n = len(allowed.segments)
            if allowed.scheme == location.scheme and location.segments[:n] == allowed.segments:
                return
        raise RefusedPathError(
            f"{what} {url!r} is outside the allowed prefixes "
            f"({', '.join(self.prefixes) or 'none configured'})"
        )

    def check_request(self, request: CompactionRequest) -> None:
        """Every input and the output prefix must be allowed."""
        if not self.prefixes:
            raise RefusedPathError("this compaction service allows no prefix (--allowed-prefix)")
        for item in request.inputs:
            self.check_url(item.url, "input")
        self.check_url(request.output_prefix, "output prefix")

    def check_urls(self, urls: Sequence[str], what: str) -> None:
        for url in urls:
            self.check_url(url, what)

"""Which object-storage locations a compaction job may touch.

The service reads and writes with its own credentials on behalf of whoever can reach its HTTP
port, so every URL in a request (inputs and output prefix) must lie under one of the prefixes
the operator configured (``--allowed-prefix``).

Every URL is parsed once into a canonical location (scheme, then the bucket or the segments of
an absolute path) and only that location is checked, by path segment: ``s3://bucket/ckpt``
allows ``s3://bucket/ckpt/x`` but not ``s3://bucket/ckpt-other/x``. Anything a storage layer
could resolve differently from this check is refused rather than normalized: a scheme not
spelled in lower case (``FILE://``), a ``file://`` URL that is not absolute (``file://tmp/x``
is the relative path ``tmp/x`` to fsspec, resolved against the worker's working directory),
``memory:///x`` (the same object as ``memory://x``), ``..`` and ``.`` segments (also
percent-encoded), backslashes, empty segments, queries, fragments, whitespace and control
characters, and fsspec chain URLs (``file:///a::s3://b``, which fsspec opens as one location
inside another: a check of the whole text would allow what the part before ``::`` is not).
Gateway and worker both check: a worker does not trust the gateway to have done it.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Iterable

from statetier.backend.snapshot.compaction import CompactionRequest

__all__ = ["Location", "PathPolicy", "RefusedPathError", "parse_location"]

_SCHEMES = ("s3", "file", "memory")
_BUCKET = re.compile(r"[a-z0-9](?:[a-z0-9.\-]{0,61}[a-z0-9])?")  # S3 wants 3+; others less
MAX_URL_LENGTH = 2048


class RefusedPathError(ValueError):
    """A URL of a request is malformed or outside the allowed prefixes."""


@dataclasses.dataclass(frozen=True)
class Location:
    """A URL in canonical form: the scheme and the path segments (bucket or first directory
    first); two URLs name the same object exactly when their locations are equal."""

    scheme: str
    segments: tuple[str, ...]

    def under(self, prefix: Location) -> bool:
        n = len(prefix.segments)
        return self.scheme == prefix.scheme and self.segments[:n] == prefix.segments


def _split_scheme(url: str, what: str) -> tuple[str, str]:
    if not isinstance(url, str):
        raise RefusedPathError(f"{what} must be a string URL, got {type(url).__name__}")
    if len(url) > MAX_URL_LENGTH:
        raise RefusedPathError(f"{what} is longer than {MAX_URL_LENGTH} characters")
    if "://" not in url:
        raise RefusedPathError(
            f"{what} {url!r} is not a URL (expected s3://, file:/// or memory://)"
        )
    if "::" in url:
        raise RefusedPathError(
            f"{what} {url!r} is an fsspec chain URL ('::' joins two locations); give one "
            "location, such as s3://bucket/path or file:///absolute/path"
        )
    scheme, rest = url.split("://", 1)
    if scheme.lower() not in _SCHEMES:
        raise RefusedPathError(f"{what} {url!r}: scheme {scheme!r} is not served")
    if scheme not in _SCHEMES:
        raise RefusedPathError(f"{what} {url!r}: write the scheme in lower case ({scheme.lower()})")
    if any(c in rest for c in "?#\\") or any(ord(c) < 33 or ord(c) == 127 for c in rest):
        raise RefusedPathError(
            f"{what} {url!r} contains a query, fragment, whitespace or control character"
        )
    return scheme, rest


def _root(scheme: str, rest: str, url: str, what: str) -> str:
    """The part after the scheme without the one form of leading slash the scheme allows."""
    if scheme == "file":
        if not rest.startswith("/"):
            raise RefusedPathError(
                f"{what} {url!r} is not an absolute file URL (file://x/y is the relative "
                "path x/y); write file:///absolute/path"
            )
        return rest[1:]
    if rest.startswith("/"):
        raise RefusedPathError(
            f"{what} {url!r} has an empty bucket name; write {scheme}://bucket/path"
        )
    return rest


def parse_location(url: str, what: str = "URL") -> Location:
    """``url`` in canonical form, or :class:`RefusedPathError` naming ``what`` and the reason."""
    scheme, rest = _split_scheme(url, what)
    root = _root(scheme, rest, url, what)
    parts = root[:-1].split("/") if root.endswith("/") else root.split("/")
    if parts == [""]:
        parts = []
    for part in parts:
        decoded = urllib.parse.unquote(part)
        if part == "" or decoded in (".", "..") or ".." in decoded.replace("\\", "/").split("/"):
            raise RefusedPathError(f"{what} {url!r} contains an empty, '.' or '..' path segment")
    if scheme == "s3" and parts and not _BUCKET.fullmatch(parts[0]):
        raise RefusedPathError(f"{what} {url!r}: {parts[0]!r} is not a valid bucket name")
    return Location(scheme, tuple(parts))


class PathPolicy:
    """The allowed prefixes, and the check of a request against them."""

    def __init__(self, prefixes: Iterable[str]) -> None:
        self.prefixes = tuple(prefixes)
        self._allowed = tuple(parse_location(p, "allowed prefix") for p in self.prefixes)
        for location, text in zip(self._allowed, self.prefixes, strict=True):
            if not location.segments:
                raise RefusedPathError(f"allowed prefix {text!r} names no bucket or directory")

    def check_url(self, url: str, what: str = "URL") -> Location:
        """The canonical location of ``url``; :class:`RefusedPathError` unless it is under an
        allowed prefix."""
        location = parse_location(url, what)
        if any(location.under(allowed) for allowed in self._allowed):
            return location
        raise RefusedPathError(
            f"{what} {url!r} is outside the allowed prefixes "
            f"({', '.join(self.prefixes) or 'none configured'})"
        )

    def root_of(self, url: str) -> str:
        """The allowed prefix ``url`` lies under (the longest, if several)."""
        location = self.check_url(url)
        roots = [
            (len(allowed.segments), text)
            for allowed, text in zip(self._allowed, self.prefixes, strict=True)
            if location.under(allowed)
        ]
        return max(roots)[1]

    def check_request(self, request: CompactionRequest) -> None:
        """Every input and the output prefix must be allowed."""
        if not self.prefixes:
            raise RefusedPathError("this compaction service allows no prefix (--allowed-prefix)")
        for index, item in enumerate(request.inputs):
            self.check_url(item.url, f"inputs[{index}].url")
        self.check_url(request.output_prefix, "output_prefix")

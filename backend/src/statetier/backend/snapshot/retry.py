"""Retries with exponential backoff for object-storage calls.

Object stores fail transiently (connection resets, timeouts, 5xx, throttling); a checkpoint must
ride through those. Anything else (missing bucket, access denied, a checksum mismatch) will not
get better by trying again, so it fails at once, and the checkpoint fails cleanly with a message
that says which file and what went wrong.

One layer owns the retry policy: this one. s3fs and botocore retry on their own too (5 and up to
5 attempts, with their own backoff), and stacked under ours a refused endpoint took most of a
minute to fail. :func:`storage_options_for` and :func:`single_attempt` turn theirs off (botocore's
unless the caller configured it), so a
refused connection fails after ``RetryPolicy.attempts`` quick attempts (about 2 s), and an
endpoint that does not answer after ``attempts`` connect timeouts (5 s each in s3fs).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = [
    "RetryPolicy",
    "StorageError",
    "call_with_retry",
    "is_transient",
    "single_attempt",
    "single_attempt_botocore",
    "storage_options_for",
]

T = TypeVar("T")
log = logging.getLogger(__name__)

_TRANSIENT_ERRNOS = {
    errno.EAGAIN,
    errno.EBUSY,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.EPIPE,
}
# Exception class names (anywhere in the MRO) of the S3 stack that mean "try again"; matched by
# name so this module needs neither botocore nor aiohttp installed.
_TRANSIENT_NAMES = {
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ResponseStreamingError",
    "ServerDisconnectedError",
    "ClientConnectionError",
    "ClientPayloadError",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeout",
    "Throttling",
    "500",
    "502",
    "503",
    "504",
}


_S3_PROTOCOLS = ("s3://", "s3a://", "s3n://")


def single_attempt_botocore() -> dict[str, Any]:
    """botocore Config arguments: one attempt per call (max_attempts counts the first)."""
    return {"retries": {"max_attempts": 1, "mode": "standard"}}


def storage_options_for(uri: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` for fsspec, with botocore's own retries off unless set there, and no
    listings cache: other processes (state hosts, compaction workers) write the location, and
    s3fs consults a cached listing even to read a file by name (it asks for the size first),
    so a listing made before another process wrote a file would hide that file for good."""
    result = dict(options)
    if not uri.startswith(_S3_PROTOCOLS):
        return result
    result.setdefault("use_listings_cache", False)
    config = dict(result.get("config_kwargs") or {})
    for key, value in single_attempt_botocore().items():
        config.setdefault(key, value)
    result["config_kwargs"] = config
    return result


def single_attempt(fs: Any) -> Any:
    """``fs`` with s3fs's own retry loop at one attempt per call (a class attribute in s3fs)."""
    if type(fs).__name__ == "S3FileSystem" and hasattr(fs, "retries"):
        fs.retries = 1
    return fs


class StorageError(OSError):
    """A storage call failed for good: persistent, or transient past the retry budget."""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a storage call is retried."""

    attempts: int = 6
    base_delay: float = 0.05
    max_delay: float = 2.0

    def delay(self, attempt: int) -> float:
        """Full-jitter exponential backoff, so retrying writers do not move in lockstep."""
        return float(random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt)))


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__):
        return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
        if code in _TRANSIENT_CODES:
            return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and is_transient(cause)


def call_with_retry(fn: Callable[[], T], what: str, policy: RetryPolicy | None = None) -> T:
    """``fn()``, retried on transient errors; ``what`` names the call in errors and logs."""
    policy = policy or RetryPolicy()
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt + 1 == policy.attempts:
                raise StorageError(
                    f"{what}: still failing after {policy.attempts} attempts: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            delay = policy.delay(attempt)
            log.warning(
                "%s: transient %s (%s), retry in %.2fs", what, type(exc).__name__, exc, delay
            )
            time.sleep(delay)
    raise AssertionError("unreachable")

"""The checkpoint location, looked at once when a runtime opens it.

A location that cannot hold checkpoints (a directory that cannot be created, a path under a
file, a bucket without credentials) would otherwise fail deep inside the first commit, after the
sink wrote, as a bare ``FileNotFoundError`` or ``NoCredentialsError``. Opening it first turns
those into one line that names the setting and the fix. The default location (the working
directory) is said out loud, and so is resuming what an earlier run left there: a second run of
a script would otherwise resume it silently.
"""

from __future__ import annotations

import os

from fsspec.implementations.local import LocalFileSystem
from statetier.backend.config import ConfigError
from statetier.backend.snapshot.store import SnapshotStore

__all__ = [
    "CREDENTIALS_HINT",
    "CheckpointLocationError",
    "default_location_notice",
    "open_location",
]

CREDENTIALS_HINT = (
    "object-store credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment"
)
SETTING = "checkpoint.uri (spark.statetier.checkpoint.uri or STATETIER_CHECKPOINT_URI)"


class CheckpointLocationError(ConfigError):
    """The checkpoint location cannot hold checkpoints."""


def open_location(store: SnapshotStore) -> list[int]:
    """The epochs committed at ``store``, once its location is known to be usable:
    :class:`CheckpointLocationError` naming the location, the setting and the fix otherwise."""
    if isinstance(store.fs, LocalFileSystem):
        _make_directory(store)
    try:
        return store.epochs()
    except Exception as exc:
        if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            raise CheckpointLocationError(
                f"checkpoint location {store.uri!r}: no {CREDENTIALS_HINT} of the driver and "
                "the executors (or pass storage_options)"
            ) from None
        if isinstance(exc, PermissionError):
            raise _refused(store, f"access denied ({exc})") from None
        raise


def default_location_notice(store: SnapshotStore, epochs: list[int]) -> str:
    """One line for a run whose ``checkpoint.uri`` is the default: where its state goes, and
    whether it resumes what an earlier run committed there."""
    where = os.path.abspath(store.root) if isinstance(store.fs, LocalFileSystem) else store.uri
    resumes = (
        f"resuming epoch {epochs[-1]} an earlier run committed there"
        if epochs
        else "starting empty"
    )
    return (
        f"checkpoint.uri is not set: state goes to {where} ({resumes}), on this machine only; "
        f"set {SETTING} to choose the location"
    )


def _make_directory(store: SnapshotStore) -> None:
    """Create a local location's directory now, or say why it cannot be."""
    try:
        os.makedirs(store.root, exist_ok=True)
    except OSError as exc:
        blocker = _file_in_the_way(store.root)
        if blocker is not None:
            reason = f"{blocker} is a file, not a directory"
        else:
            reason = f"cannot create the directory {store.root} ({exc.strerror})"
        raise _refused(store, reason) from None


def _file_in_the_way(path: str) -> str | None:
    """The nearest existing part of ``path`` when it is not a directory."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    return path if path and not os.path.isdir(path) else None


def _refused(store: SnapshotStore, reason: str) -> CheckpointLocationError:
    return CheckpointLocationError(
        f"checkpoint location {store.uri!r}: {reason}; set {SETTING} to a writable directory "
        "(file:///absolute/path) or bucket (s3://bucket/prefix)"
    )

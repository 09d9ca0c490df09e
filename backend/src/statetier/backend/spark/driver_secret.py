"""The secret that the coordinators on one Spark Connect driver share, so that they share hosts.

A Connect server runs each streaming query's ``foreachBatch`` function in a Python process of its
own, on the driver's machine, and each such process coordinates its query's pipeline with a host
registry of its own. Hosts authenticate every peer with the application's secret, and a secret
made per process would give every query its own state hosts on every executor: a host process per
task slot per running query (each of which takes a whole budget's share of the executor's
memory), and a new query waiting for its hosts to start (about 2.6 s of a 10-micro-batch query
on a local server, docs/spark.md). So the coordinators of one application on one driver
machine share one secret, kept in a file only this user can read: the first coordinator makes
it, the others read it, and all of them then use the application's hosts (see membership).

The file lives in the driver's Spark local dir (``SPARK_LOCAL_DIRS``, which Spark gives the
``foreachBatch`` processes: the driver block manager's folder, deleted when the application
stops; the temp dir where it is not set) and holds nothing but the secret, which the tasks carry
to the executors anyway. In the temp dir, every local Connect server left its application's
secret and host roster behind. A file that another user owns, or that others may read, is
refused with an error that names it. The coordinators' other shared file, their host roster
(host_roster), lives beside it under the same rules (:func:`driver_file_path`,
:func:`read_private`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile

from statetier.backend.spark.channel import new_secret

__all__ = [
    "SecretFileError",
    "driver_file_path",
    "driver_scratch_dir",
    "read_private",
    "shared_secret",
    "shared_secret_path",
]

_HEX_LENGTH = 64  # 32 bytes


class SecretFileError(RuntimeError):
    """A file the coordinators share is not one this user made for this application."""


def driver_file_path(app_id: str, suffix: str, directory: str | None = None) -> str:
    """Where the coordinators' file ``suffix`` (``.secret``, ``.hosts``) of application
    ``app_id`` lives on this machine (``directory``: by default :func:`driver_scratch_dir`)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in app_id)
    return os.path.join(directory or driver_scratch_dir(), f"statetier-{safe}{suffix}")


def driver_scratch_dir() -> str:
    """The first of ``SPARK_LOCAL_DIRS`` (what Spark gives the Python processes it starts: its
    block manager's folders, which it deletes when the application stops) that exists; the
    temp dir when there is none. The state host's files (protocol.host_file) take the first
    entry whether it exists or not, so that every worker of an executor derives the same name
    from the same variable; a coordinator's shared files may skip a folder that is gone."""
    dirs = (d.strip() for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(","))
    return next((d for d in dirs if d and os.path.isdir(d)), tempfile.gettempdir())


def shared_secret_path(app_id: str, directory: str | None = None) -> str:
    """Where the secret of application ``app_id`` lives on this machine."""
    return driver_file_path(app_id, ".secret", directory)


def shared_secret(app_id: str, directory: str | None = None) -> bytes:
    """The secret of application ``app_id`` on this machine: made by the first caller (atomically:
    written aside, then linked into place), read by every other."""
    path = shared_secret_path(app_id, directory)
    with contextlib.suppress(FileNotFoundError):
        return _read(path)
    secret = new_secret()
    fd, aside = tempfile.mkstemp(prefix=".statetier-", dir=os.path.dirname(path))  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secret.hex())
        try:
            os.link(aside, path)
        except FileExistsError:  # another coordinator made it first: theirs is the secret
            return _read(path)
    finally:
        os.unlink(aside)
    return secret


def read_private(path: str, what: str) -> str:
    """The text of the file at ``path`` (FileNotFoundError when there is none), refused with
    :class:`SecretFileError` naming ``what`` and the file when it is not this user's alone."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SecretFileError(
                f"statetier's {what} {path} is not this user's alone (owner uid "
                f"{info.st_uid}, mode {stat.filemode(info.st_mode)}): remove it and run again"
            )
        return f.read()


def _read(path: str) -> bytes:
    text = read_private(path, "shared secret").strip()
    try:
        if len(text) != _HEX_LENGTH:
            raise ValueError(f"{len(text)} characters")
        return bytes.fromhex(text)
    except ValueError as e:
        raise SecretFileError(
            f"statetier's shared secret {path} is not a secret ({e}): remove it and run again"
        ) from None

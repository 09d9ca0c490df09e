"""Owner identity of spill files, removal of a crashed process's leftovers, and clean exit.

Every file this process writes in a spill dir is named ``statetier-spill-<pid>-<uuid>-...``, and
the process holds an exclusive ``flock`` on ``statetier-spill-<pid>-<uuid>.lock`` in each dir for
its whole life. Why a lock and not only the pid: pids are reused, and pods that share a host
volume each have their own pid 1. The kernel releases a dead process's locks, so at start a lock
we *can* take belongs to a dead owner, and all of that owner's files are removed. Chunk files
whose owner has no lock file at all are orphans of the same kind (the lock is created, under a
temporary name and then renamed, before any chunk).

On clean exit (``close``, or ``atexit`` if nobody called it) every file is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import uuid
from collections.abc import Callable, Sequence

__all__ = ["PREFIX", "SpillDirs", "remove_stale_files"]

log = logging.getLogger(__name__)

PREFIX = "statetier-spill-"
_OWNER = re.compile(re.escape(PREFIX) + r"(\d+-[0-9a-f]{12})(?:[-.]|$)")


def _owner_of(name: str) -> str | None:
    match = _OWNER.match(name)
    return match.group(1) if match else None


def remove_stale_files(directory: str, own_owner: str | None = None) -> list[str]:
    """Remove the spill files of dead owners in ``directory``; returns the names removed."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    by_owner: dict[str, list[str]] = {}
    for name in names:
        owner = _owner_of(name)
        if owner is not None and owner != own_owner:
            by_owner.setdefault(owner, []).append(name)
    removed: list[str] = []
    for owner, files in by_owner.items():
        lock_name = f"{PREFIX}{owner}.lock"
        if lock_name in files and not _owner_is_dead(os.path.join(directory, lock_name)):
            continue
        for name in sorted(files, key=lambda n: n.endswith(".lock")):  # the lock last
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
                removed.append(name)
    if removed:
        log.warning("removed %d stale spill files of dead processes in %s", len(removed), directory)
    return removed


def _owner_is_dead(lock_path: str) -> bool:
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live process holds it
    finally:
        os.close(fd)  # releases the lock we may have taken
    return True


class SpillDirs:
    """The spill dirs this process may write to, each holding this process's owner lock."""

    def __init__(
        self, dirs: Sequence[str], *, on_error: Callable[[str, OSError], None] | None = None
    ) -> None:
        self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.owner_prefix = PREFIX + self.owner
        self.usable: list[str] = []
        self.removed_stale: list[str] = []
        self._locks: dict[str, int] = {}
        for given in dirs:
            directory = os.path.abspath(given)
            if directory in self._locks:
                continue
            try:
                os.makedirs(directory, exist_ok=True)
                self.removed_stale += remove_stale_files(directory, self.owner)
                self._locks[directory] = self._lock(directory)
            except OSError as exc:
                if on_error is not None:
                    on_error(directory, exc)
                else:
                    log.error("spill dir %s unusable: %s", directory, exc)
                continue
            self.usable.append(directory)

    def _lock(self, directory: str) -> int:
        """Create and lock the owner lock under a temporary name, then rename it in place.

        The rename makes the lock appear already held, so a process cleaning up at the same
        moment can never take it for a dead owner's.
        """
        final = os.path.join(directory, f"{self.owner_prefix}.lock")
        temporary = os.path.join(directory, f".{self.owner_prefix}.lock.tmp")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(temporary, final)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        return fd

    def close(self) -> None:
        """Remove this process's remaining files and its locks."""
        for directory, fd in self._locks.items():
            with contextlib.suppress(OSError):
                for name in os.listdir(directory):
                    if name.startswith(self.owner_prefix) and not name.endswith(".lock"):
                        os.unlink(os.path.join(directory, name))
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, f"{self.owner_prefix}.lock"))
            os.close(fd)
        self._locks = {}
        self.usable = []

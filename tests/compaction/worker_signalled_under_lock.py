"""``statetier-compaction worker`` whose lock sends this process SIGTERM while the main thread
holds it: the moment a parent's death or a pod deletion can land on a busy machine, made certain.

The signal is handled inside the lock's ``acquire``, just after the lock is taken, as it can be
inside ``threading.Condition.__enter__`` (Python code around the C lock): the ``with`` block
never starts, so nothing releases the lock. Run as ``python worker_signalled_under_lock.py
worker --gateway ...``. Only the lock is a double (``threading.Lock`` with the signal added);
the command, the worker's loop and its signal handling are the real ones.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import TracebackType
from typing import Any

from statetier.compaction import cli, worker


class SignalWhileHeld:
    """A lock that, on the main thread's first acquisition, sends SIGTERM before returning."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._signalled = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got and not self._signalled and threading.current_thread() is threading.main_thread():
            self._signalled = True
            os.kill(os.getpid(), signal.SIGTERM)
        return got

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


_original_init = worker.Worker.__init__


def _init_with_signalling_lock(self: worker.Worker, settings: Any) -> None:
    _original_init(self, settings)
    self._lock = SignalWhileHeld()  # type: ignore[assignment]
    self._free = threading.Condition(self._lock)


if __name__ == "__main__":
    worker.Worker.__init__ = _init_with_signalling_lock  # type: ignore[method-assign]
    sys.exit(cli.main(sys.argv[1:]))

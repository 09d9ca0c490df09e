"""Servers that a demo, benchmark or test starts end with it, however it ends.

SeaweedFS, compaction gateways and workers run in sessions of their own (a Ctrl-C in the
terminal must reach the demo, which stops them after the state it is still writing), so
neither a terminal nor a CI runner that kills the parent's process group reaches them. Two
things make them end anyway:

- a parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG)``): the kernel sends the child SIGTERM
  when its parent dies, even by SIGKILL. It is tied to the *thread* that started the child, so
  start servers from a thread that lives as long as they should (the main thread);
- SIGTERM handled like Ctrl-C (:func:`terminate_as_interrupt`): a timeout, ``kill`` or CI limit
  that sends SIGTERM runs the same cleanup as Ctrl-C, which stops Spark, the state hosts and the
  servers in order. Python's default for SIGTERM is to end at once, without any ``finally``.

State hosts and merge processes watch their parents themselves (``--watch-pid``, the merge
process's parent watch): the runtime cannot rely on developer tools.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["die_with_parent", "stop_process", "terminate_as_interrupt"]

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up before any fork (the child only calls it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that makes the child get SIGTERM when this
    process dies; None where the platform has no parent-death signal. A parent that died
    between the fork and the call would never signal: the child then exits at once."""
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def set_signal() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return set_signal


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def terminate_as_interrupt() -> None:
    """From now on SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does, so
    that ``finally`` blocks and context managers stop what the command started."""
    signal.signal(signal.SIGTERM, _interrupt)


def stop_process(process: subprocess.Popen[Any], grace: float, *, group: bool = False) -> None:
    """Stop a server this process started: SIGTERM, ``grace`` seconds to end, then SIGKILL.
    ``group``: the whole process group it leads (a server started in a session of its own that
    starts processes of its own, as Spark's executors and Python workers)."""
    if process.poll() is not None:
        return

    def send(sig: signal.Signals) -> None:
        if group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)

    send(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()

"""A compactor that merges in a child process of its own.

A merge is CPU-bound Python: run on a thread of a process that has other Python work (the Spark
driver's micro-batch loop, its py4j calls and commits), it holds the GIL for most of its time
and slows that work down. In a child process it only takes a core.

The child is ``python -m statetier.backend.snapshot.process_compactor``, started at the first
compaction, serving the following ones over its standard input and output. There is one per
process, shared by every :class:`ProcessCompactor` in it (a Spark driver's pipelines, one after
another or side by side), as there is one state host per executor: a new pipeline does not pay
for a new interpreter, Arrow and its object store's client (about a second of CPU for s3fs and
its session), and the child keeps its filesystems between them. It stops after
``IDLE_SECONDS`` without a merge, and with its parent. Not
``multiprocessing``: its ``spawn`` runs the parent's main script again in the child (a user's
driver script without an ``if __name__ == "__main__"`` guard would start a second Spark job
there), and ``fork`` would copy the JVM and event-loop threads of the driver half-way. The child
never sees the terminal's Ctrl-C (its parent stops it) and exits when its parent is gone; the
request and result are the same JSON objects a compaction service takes, the compactor (its
filesystem, which fsspec pickles as its constructor arguments) travels pickled, parent to child
only.

The child runs at a lower CPU priority (``MERGE_NICENESS``): a merge is background work, and a
driver often shares its cores with executors (``local-cluster``, a driver pod beside executor
pods on a node). Measured on ``local-cluster[2,1,3072]``, a merge right after a commit took 0.5-0.8
of a core from the next micro-batch's map tasks and stretched that stage by 0.8 s; at the lower
priority it takes about a tenth of a contended core and the rest in the micro-batch's gaps
(docs/checkpoints.md, "Compaction").
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from statetier.backend.snapshot.compaction import (
    CompactionRequest,
    CompactionResult,
    LocalCompactor,
)
from statetier.backend.snapshot.recent_bases import RecentBases

__all__ = ["MERGE_NICENESS", "MergeProcessError", "ProcessCompactor", "stop_merge_process"]

_OK, _FAILED = b"k", b"f"

MERGE_NICENESS = 10  # added to the parent's nice value: about a tenth of a contended core
IDLE_SECONDS = 120.0  # the shared merge process stops after this long without a merge


class MergeProcessError(RuntimeError):
    """The merge process died or broke the protocol: this merge failed, the next one starts a
    new process."""


class _Child:
    """One running merge process and the two ends of its pipes."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
            # a process group of its own: the terminal's Ctrl-C goes to the parent's group
            # and never reaches the child, not even while it still imports (main() ignores
            # SIGINT only once its imports are done, and Arrow's take a while)
            process_group=0,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.requests = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.replies = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()

    def call(self, local: LocalCompactor, request: str) -> tuple[str, float]:
        try:
            self.requests.send_bytes(pickle.dumps((local, request)))
            reply = self.replies.recv_bytes()
        except (EOFError, OSError) as e:
            raise MergeProcessError(
                f"the merge process (pid {self.process.pid}) is gone: {e!r}"
            ) from e
        kind, body = reply[:1], reply[1:]
        if kind == _FAILED:
            raise RuntimeError(f"the merge failed in the merge process:\n{body.decode()}")
        result, cpu = body.decode().rsplit("\n", 1)
        return result, float(cpu)

    def stop(self) -> None:
        self.requests.close()  # the child ends at the end of its input
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.replies.close()


class _MergeProcess:
    """The process's one merge child: started on demand, one merge at a time, stopped when it
    has been idle for ``IDLE_SECONDS`` (or by :func:`stop_merge_process`)."""

    def __init__(self) -> None:
        self._child: _Child | None = None
        self._lock = threading.Lock()
        self._idle: threading.Timer | None = None
        self._calls = 0  # merges asked for so far: an idle timer stops the child only if none came

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.process.pid if child is not None else None

    def call(self, local: LocalCompactor, request: str) -> tuple[str, float]:
        with self._lock:
            if self._idle is not None:
                self._idle.cancel()
            self._calls += 1
            if self._child is None:
                self._child = _Child()
            child = self._child
            try:
                return child.call(local, request)
            except MergeProcessError:
                self._child = None  # killed, out of memory: a new one next time
                child.process.kill()
                child.process.wait()
                raise
            finally:
                self._idle = threading.Timer(IDLE_SECONDS, self._stop_if_idle, (self._calls,))
                self._idle.daemon = True
                self._idle.start()

    def _stop_if_idle(self, calls: int) -> None:
        with self._lock:
            if self._calls != calls or self._child is None:  # a merge came meanwhile
                return
            child, self._child = self._child, None
        child.stop()

    def stop(self) -> None:
        with self._lock:
            child, self._child = self._child, None
            if self._idle is not None:
                self._idle.cancel()
        if child is not None:
            child.stop()


_MERGES = _MergeProcess()


def stop_merge_process() -> None:
    """Stop the shared merge process now (a later merge starts a new one)."""
    _MERGES.stop()


class ProcessCompactor:
    """Runs ``local``'s merges in the process's merge child, one merge at a time."""

    def __init__(self, local: LocalCompactor) -> None:
        self.local = local
        self.cpu_seconds = 0.0  # the child's CPU in this compactor's merges (for benchmarks)

    @property
    def pid(self) -> int | None:
        """The merge process's pid, while one runs."""
        return _MERGES.pid

    def compact(self, request: CompactionRequest) -> CompactionResult:
        result, cpu = _MERGES.call(self.local, request.to_json())
        self.cpu_seconds += cpu
        return CompactionResult.from_json(result)


def _watch_parent(parent: int) -> None:
    """End when the parent is gone, whatever ended it: the child must not outlive the driver,
    nor hold the pipes the driver's own parent reads to their end."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def _serve(requests: Connection, replies: Connection) -> None:
    recent = RecentBases()  # a range's next merge starts from the base its last one wrote
    while True:
        try:
            message = requests.recv_bytes()
        except EOFError:
            return
        started = time.process_time()
        try:
            local, request = pickle.loads(message)
            local.recent = recent
            result = local.compact(CompactionRequest.from_json(request)).to_json()
        except Exception:
            replies.send_bytes(_FAILED + traceback.format_exc().encode())
            continue
        cpu = time.process_time() - started
        replies.send_bytes(_OK + f"{result}\n{cpu}".encode())


def _lower_priority() -> None:
    """Yield the CPU to the foreground: merges only have to keep up, not to be quick. Where
    the platform has no ``nice``, or refuses it, the merge runs at its parent's priority."""
    nice = getattr(os, "nice", None)
    if nice is not None:
        with contextlib.suppress(OSError):
            nice(MERGE_NICENESS)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is the parent's
    _lower_priority()
    threading.Thread(
        target=_watch_parent, args=(int(args[0]),), name="statetier-parent-watch", daemon=True
    ).start()
    requests = Connection(os.dup(sys.stdin.fileno()), writable=False)
    replies = Connection(os.dup(sys.stdout.fileno()), readable=False)
    sys.stdout = sys.stderr  # nothing else may write into the reply pipe
    _serve(requests, replies)


if __name__ == "__main__":
    main()

"""The wire protocol between a Spark task and its executor's state host.

One connection per task attempt over a Unix socket (``multiprocessing.connection`` frames).
The task sends a JSON header (:class:`~statetier.backend.spark.messages.TaskHeader`), the
pickled function, then its records as Arrow IPC messages and an empty frame; the host answers
with output batches (``B`` + Arrow IPC), then ``R`` + the result as JSON, or ``X`` + the error
text (``F`` + one line when the function's state was refused: see refusals). Control requests
(``ping``, ``shutdown``, ``stats``) are a JSON header answered by one ``R`` frame.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import tempfile
import time
from typing import Any

import pyarrow as pa

__all__ = [
    "BATCH",
    "ERROR",
    "REFUSED",
    "RESULT",
    "STOPPING",
    "ProcessWatch",
    "epoch_property",
    "process_alive",
    "read_batch",
    "socket_path",
    "write_batch",
]

BATCH = b"B"
RESULT = b"R"
ERROR = b"X"
REFUSED = b"F"
# how a host's refusal ends while it stops (idle, its executor gone, told to): a task that
# starts hosts takes it for no host there and starts one in its place
STOPPING = " is stopping"


def write_batch(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def read_batch(data: Any) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    batch: pa.RecordBatch = reader.read_next_batch()
    return batch


def epoch_property(pipeline: str) -> str:
    """The Spark job property through which a streaming query planned once (``write_stream``)
    tells its tasks the micro-batch's epoch, base and writer (JSON)."""
    return f"statetier.epoch.{pipeline}"


def socket_path(app_id: str, local_dirs: str | None = None, slot: int = 0) -> str:
    """Where the state host of application ``app_id`` (of host slot ``slot``, see slots) listens
    on this machine/executor.

    Under the executor's first local dir (``SPARK_LOCAL_DIRS``), else the temp dir; hashed into
    the temp dir when the path would pass the Unix socket length limit.
    """
    path = host_file(app_id, ".sock", local_dirs, slot)
    if len(path.encode()) > 100:
        digest = hashlib.sha256(path.encode()).hexdigest()[:16]
        path = os.path.join(tempfile.gettempdir(), f"statetier-host-{digest}.sock")
    return path


def host_file(app_id: str, suffix: str, local_dirs: str | None = None, slot: int = 0) -> str:
    """A file of this executor's state host of ``slot`` (``.log``, ``.lock``) under the
    executor's first local dir, which Spark removes with the application; the temp dir when
    there is none. Slot 0 keeps the name of the one host an executor had before slots."""
    dirs = local_dirs if local_dirs is not None else os.environ.get("SPARK_LOCAL_DIRS", "")
    root = next((d.strip() for d in dirs.split(",") if d.strip()), tempfile.gettempdir())
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in app_id)
    tail = f"-s{slot}" if slot else ""
    return os.path.join(root, f"statetier-host-{safe}{tail}{suffix}")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not): the host watches its executor's JVM
    with it, the driver its hosts when it stops them."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class ProcessWatch:
    """Tells at once when a process exits: a pidfd (Linux 5.3+) is readable from the moment the
    process is gone, zombie or not; elsewhere :func:`process_alive` is polled.

    The state host watches its executor's JVM with it. A host that went on serving for even half
    a second after a SIGKILL took its JVM would still look alive to the driver, take the retried
    task's ranges, and lose them again when it noticed: a second restore of each.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfd here: poll
            self._fd = os.pidfd_open(pid)

    def gone(self) -> bool:
        """Whether the process has exited (does not wait)."""
        return self.wait(0.0)

    def wait(self, timeout: float) -> bool:
        """Whether the process exited within ``timeout`` seconds (returns as soon as it does
        when a pidfd watches it; after the timeout otherwise)."""
        if self._fd is None:
            if timeout > 0 and process_alive(self.pid):
                time.sleep(timeout)
            return not process_alive(self.pid)
        ready, _, _ = select.select([self._fd], [], [], timeout)
        return bool(ready)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

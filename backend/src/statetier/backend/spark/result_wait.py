"""The driver's wait for each range's result of an epoch, after the job that ran it returned.

A state host snapshots a range after its task returned (overlapping Spark's next tasks), sends
the :class:`~statetier.backend.spark.results.RangeResult` over its registry link and writes it as
a file only when the driver's registry did not acknowledge it. So the driver takes what the
hosts told first, reads the store every ``RESULT_POLL_S`` meanwhile (a host whose link was down
could not tell), and gives up on a range whose host is gone or that sent nothing within
``host.result-timeout``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import NoReturn

from statetier.backend.snapshot import CorruptFileError, SnapshotStore
from statetier.backend.snapshot.layout import error_name, result_name
from statetier.backend.snapshot.store import read_whole
from statetier.backend.spark.registry import HostRegistry
from statetier.backend.spark.results import RangeResult
from statetier.backend.wire import MessageError

__all__ = ["RESULT_POLL_S", "RangesLostError", "ResultWait"]

RESULT_POLL_S = 1.0  # the store's result files, read while waiting for a host to tell


class RangesLostError(RuntimeError):
    """State hosts died after their tasks returned, before the ranges' snapshots: the epoch's
    job runs again (its outputs may reach the sink twice, as with any Spark task retry)."""


@dataclasses.dataclass(frozen=True)
class ResultWait:
    """Waits for the results of one pipeline's ranges, written under the driver's ``owner``."""

    store: SnapshotStore
    registry: HostRegistry | None
    pipeline: str
    parallelism: int
    owner: str
    timeout: float  # host.result-timeout

    def result(self, epoch: int, index: int) -> tuple[RangeResult, bool]:
        """Range ``index``'s result, once its host has written it (after the job returned),
        and whether the host told it (else it was read from the store). Raises
        :class:`RangesLostError` when the range's host is gone without one, and
        :class:`CorruptFileError` (the epoch is not committed) when the host failed to
        snapshot the range or sent nothing in time."""
        name = result_name(epoch, self.owner, index, self.parallelism)
        deadline = time.monotonic() + self.timeout
        poll_every = RESULT_POLL_S if self.registry is not None else 0.0
        next_poll = time.monotonic() + poll_every
        files = {self.store.url(n): n for n in (name, error_name(name))}  # as a host tells them
        pause = 0.002
        while True:
            found = told = self._told(files, pause)
            if told is None and time.monotonic() >= next_poll:
                found = self._read_result_files(name)
                next_poll = time.monotonic() + poll_every
            if found is not None:
                path, body = found
                if path == name:
                    return self._decode(name, body, epoch, index), told is not None
                self._no_result(name, epoch, index, body)
            if not self._owner_alive(index):
                with contextlib.suppress(FileNotFoundError):  # written just before it died?
                    return self._decode(name, self._cat(name), epoch, index), False
                raise RangesLostError(
                    f"the state host of range {index} is gone before it wrote the range's "
                    f"snapshot of epoch {epoch}"
                )
            if time.monotonic() > deadline:
                self._no_result(name, epoch, index, None)
            pause = min(pause * 2, 0.1)

    def _told(self, files: dict[str, str], timeout: float) -> tuple[str, bytes] | None:
        """The first of ``files`` (URL: name) a host told the registry it wrote, as (name,
        bytes), waiting at most ``timeout``; None without a registry (after sleeping) or if
        none came."""
        if self.registry is None:
            time.sleep(timeout)
            return None
        told = self.registry.take_written(tuple(files), timeout)
        return None if told is None else (files[told[0]], told[1])

    def _read_result_files(self, name: str) -> tuple[str, bytes] | None:
        """The result file ``name`` or its error file, read from the store; None if neither
        exists yet."""
        for path in (name, error_name(name)):
            with contextlib.suppress(FileNotFoundError):
                return path, self._cat(path)
        return None

    def _cat(self, name: str) -> bytes:
        return read_whole(self.store.fs, self.store.full_path(name))

    @staticmethod
    def _decode(name: str, raw: bytes, epoch: int, index: int) -> RangeResult:
        try:
            return RangeResult.decode(raw)
        except MessageError as e:  # never partial (written whole): not one of ours
            raise CorruptFileError(name, f"range {index} of epoch {epoch}: {e}") from None

    def _no_result(self, name: str, epoch: int, index: int, error: bytes | None) -> NoReturn:
        """Fail the epoch uncommitted: the range's host failed to snapshot it (``error``, its
        traceback) or wrote nothing within the result timeout."""
        why = (
            f"its state host failed to snapshot it:\n{error.decode(errors='replace')}"
            if error is not None
            else f"no result within host.result-timeout={self.timeout:.0f}s (state host gone?)"
        )
        raise CorruptFileError(name, f"range {index} of epoch {epoch}: {why}; not committing")

    def _owner_alive(self, index: int) -> bool:
        if self.registry is None:
            return True
        return self.registry.owner((self.pipeline, self.parallelism, index)) is not None

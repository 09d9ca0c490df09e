"""Which gathered ranges' outputs left Spark: the check that keeps a partial micro-batch from sinks.

In a gathered epoch (see gathering) every task sends its piece of every range to the range's
state host, and only the task whose piece completes a range gets the range's outputs. A piece
whose task has finished cannot be sent again (Spark does not rerun a successful task), so when
a host dies holding pieces, or an executor dies with outputs its task had got, some range can
never complete in that job; every task would still succeed, and the sink's job with them, with
that range's rows missing: a partial micro-batch committed as a success (``_SUCCESS``).

So each task of a gathered epoch, after it passed on its outputs and before it ends, tells the
driver's registry which ranges it delivered (:func:`report_delivered`). The registry keeps
those reports per Spark stage (:class:`Deliveries`). Once every piece of the stage has
reported, a report that leaves a range undelivered fails its task: no more pieces can come but
a retry's, so the job cannot succeed without the range, and Spark retries the task until the
job fails, before the sink commits anything; the driver cancels the job at the first refusal
rather than wait for Spark's retries of the task (``spark.task.maxFailures``), then runs the
epoch again (see pipeline): the sink gets the micro-batch complete, possibly a second time, never
partial.

A partition's attempts that reported count only for the ranges every one of them delivered
(a retry that no longer gets a range, its host gone, takes it back), so a report is never
counted for a range that the attempt Spark keeps did not deliver. Every successful job's last
report is checked with every piece in, so a job that succeeds delivered every range; a job the
check fails for nothing (a lost piece a retry could still complete) only runs the epoch again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
from collections.abc import Callable

from statetier.backend.spark.channel import Endpoint, connect
from statetier.backend.wire import Fields, decode_fields, encode_fields

__all__ = ["Deliveries", "DeliveryReport", "UndeliveredError", "report_delivered"]

log = logging.getLogger("statetier.spark.deliveries")

MAX_EPOCHS = 256  # (pipeline, epoch) pairs held: a bound, far above epochs in flight


class UndeliveredError(RuntimeError):
    """Ranges of a gathered stage can no longer reach the sink: the task fails, so the job does."""


@dataclasses.dataclass(frozen=True)
class DeliveryReport:
    """A gathered task's word to the driver: piece ``piece`` of ``pieces`` of stage ``stage``
    of ``pipeline``'s ``epoch`` (of ``ranges`` ranges) delivered the outputs of ``delivered``."""

    pipeline: str
    epoch: int
    stage: int
    piece: int
    pieces: int
    ranges: int
    delivered: tuple[int, ...]

    def encode(self) -> bytes:
        data = encode_fields(self)
        return json.dumps({"op": "delivered", **data}).encode()

    @classmethod
    def decode(cls, fields: Fields) -> DeliveryReport:
        return decode_fields(cls, fields, delivered=_range_indexes)


def _range_indexes(fields: Fields) -> tuple[int, ...]:
    items = fields.items("delivered")
    if not all(type(i) is int for i in items):
        fields.fail("delivered", "a list of range indexes", items)
    return tuple(items)


@dataclasses.dataclass
class _Stage:
    """The reports of one stage: per piece, the ranges every reported attempt delivered."""

    pieces: int
    ranges: int
    delivered: dict[int, frozenset[int]] = dataclasses.field(default_factory=dict)
    refused: tuple[int, ...] = ()  # ranges a check found undelivered with every piece in
    stale: bool = False  # of a run of the epoch the driver has given up

    def add(self, piece: int, delivered: frozenset[int]) -> None:
        earlier = self.delivered.get(piece)
        self.delivered[piece] = delivered if earlier is None else earlier & delivered

    def all_delivered(self) -> frozenset[int]:
        return frozenset().union(*self.delivered.values())

    def undelivered(self) -> tuple[int, ...]:
        """Ranges no piece delivered, once every piece reported (else none yet)."""
        if len(self.delivered) < self.pieces:
            return ()
        return tuple(sorted(set(range(self.ranges)) - self.all_delivered()))


class Deliveries:
    """The driver's record of the reports of gathered tasks, per pipeline, epoch and stage."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epochs: dict[tuple[str, int], dict[int, _Stage]] = {}
        self._on_refusal: dict[tuple[str, int], Callable[[], None]] = {}

    def report(self, report: DeliveryReport) -> str | None:
        """File ``report``; why its task must fail (None: it may end). The first refusal of a
        run calls the run's ``on_refusal`` (see :meth:`begin`)."""
        refusal = self._file(report)
        on_refusal = None
        if refusal is not None:
            with self._lock:
                on_refusal = self._on_refusal.pop((report.pipeline, report.epoch), None)
        if on_refusal is not None:
            try:
                on_refusal()
            except Exception:  # the task fails anyway: Spark's retries fail the job
                log.warning("could not cancel the job of epoch %s", report.epoch, exc_info=True)
        return refusal

    def _file(self, report: DeliveryReport) -> str | None:
        with self._lock:
            stages = self._epochs.setdefault((report.pipeline, report.epoch), {})
            self._bound()
            stage = stages.setdefault(report.stage, _Stage(report.pieces, report.ranges))
            if stage.stale:
                return f"stage {report.stage} belongs to a run of epoch {report.epoch} that failed"
            stage.add(report.piece, frozenset(report.delivered))
            missing = stage.undelivered()
            if missing:
                stage.refused = missing
                return (
                    f"the outputs of ranges {list(missing)} of epoch {report.epoch} were lost "
                    "with a state host or executor after every task of the micro-batch sent its "
                    "piece: this task fails so that the sink's job cannot succeed without them; "
                    "the driver runs the epoch again"
                )
        return None

    def begin(
        self, pipeline: str, epoch: int, on_refusal: Callable[[], None] | None = None
    ) -> None:
        """A run of ``epoch``'s job starts: the stages of earlier runs no longer count.
        ``on_refusal`` (the driver's cancel of the run's jobs) is called at its first refusal."""
        with self._lock:
            self._on_refusal.pop((pipeline, epoch), None)
            if on_refusal is not None:
                self._on_refusal[(pipeline, epoch)] = on_refusal
            for stage in self._epochs.get((pipeline, epoch), {}).values():
                stage.stale = True

    def refused(self, pipeline: str, epoch: int) -> tuple[int, ...]:
        """The ranges a check of this run of ``epoch`` found undelivered (its job then fails)."""
        with self._lock:
            stages = self._epochs.get((pipeline, epoch), {}).values()
            return tuple(sorted({r for s in stages if not s.stale for r in s.refused}))

    def delivered(self, pipeline: str, epoch: int) -> frozenset[int]:
        """The ranges whose outputs tasks of this run of ``epoch`` delivered."""
        with self._lock:
            stages = self._epochs.get((pipeline, epoch), {}).values()
            return frozenset().union(*(s.all_delivered() for s in stages if not s.stale))

    def forget(self, pipeline: str, epoch: int) -> None:
        """``epoch`` is committed: its reports go."""
        with self._lock:
            self._epochs.pop((pipeline, epoch), None)
            self._on_refusal.pop((pipeline, epoch), None)

    def _bound(self) -> None:
        while len(self._epochs) > MAX_EPOCHS:  # epochs a driver gave up: the oldest go
            oldest = next(iter(self._epochs))
            del self._epochs[oldest]
            self._on_refusal.pop(oldest, None)


def report_delivered(registry: Endpoint, secret: bytes, report: DeliveryReport) -> None:
    """Tell the driver which ranges this task delivered; :class:`UndeliveredError` when the
    driver says its task must fail (ranges of the stage can no longer be delivered)."""
    with contextlib.closing(connect(registry, secret)) as conn:
        conn.send_bytes(report.encode())
        answer = Fields.parse("the registry's answer to a delivery report", conn.recv_bytes())
    refusal = answer.maybe_text("refused")
    if refusal is not None:
        raise UndeliveredError(f"statetier: {refusal}")

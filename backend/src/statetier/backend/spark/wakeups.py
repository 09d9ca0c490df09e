"""Micro-batches for due timers when no input comes: the query's wake-up source.

Spark runs a micro-batch when a source has new data, or when a stateful operator of the last
micro-batch asks for one (``shouldRunAnotherBatch``, with
``spark.sql.streaming.noDataMicroBatches.enabled``): ``transformWithState`` does after the
watermark moved (event time) and always in processing time. A ``foreachBatch`` query has no
such operator, so without this module a statetier pipeline's timers wait for the next input.

``StatefulPipeline.write_stream`` therefore unions into its input a source of its own that
reads no rows: :class:`WakeUpSource`, when the function can emit from its timers
(:func:`emits_from_timers`: its class overrides ``on_timer``). A function that cannot gets its
due timers fired with the next input, as before, and its query pays none of the source's
Python processes on the driver (Spark starts one to find the source, one to create it, one to
plan its reads and one to run its reader, each importing pyspark and statetier; see
docs/spark.md, "Spark Connect", for what that cost the word count's benchmark).

The source's offset is a wall-clock time in ms, the last wake-up the driver asked for; it
offers that offset once it is due and newer than the query's. Spark then sees new data and runs
an ordinary micro-batch: it writes the batch's offsets, watermark and timestamp to its offset
log first, the batch is epoch ``batch id + 1`` like any other, its ranges fire what is due and
commit, and a restarted query runs it again with the same offsets and time (the same timers
fire; the sink sees the same batch id). Exactly-once is Spark's own.

The driver asks (:func:`wake_at`, after each committed epoch):

- event time: now, when the epoch had input, the query has a watermark and a range has an
  event-time timer. The next micro-batch gets the watermark this one's input moved: Spark's own
  rule (one no-data micro-batch after the watermark moved), so the sessions of a stream that
  stops close as ``transformWithStateInPandas``'s do. That no-data epoch has no input and asks
  for no more;
- processing time: when the earliest processing-time timer is due (on the wall clock);
- at the start of a query whose checkpoint has timers: now (the restored ranges' due timers).

A wake-up reaches the next micro-batch the trigger starts: at once with the default trigger
(Spark polls the sources every ``spark.sql.streaming.pollingDelay``, 10 ms), else at the next
trigger interval. An ``availableNow`` query runs the wake-up asked for by its last epoch, so it
fires the timers due at its final watermark, and ends when nothing due is asked for.

The source runs in a Python process the JVM starts on the driver, not in the driver's Python:
the request is a small JSON file the driver replaces atomically (:class:`WakeUps`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructField, StructType
from statetier.backend.functions import KeyedProcessFunction

try:  # pyspark 4.2+: availableNow queries ask the source itself
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover (4.1: Spark fixes the offset at the query's start)
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

__all__ = [
    "SOURCE_NAME",
    "WakeUpSource",
    "WakeUps",
    "emits_from_timers",
    "wake_at",
    "with_wake_ups",
]

SOURCE_NAME = "statetier-wakeups"
REQUEST_FILE = "wake-up.json"


def wake_at(
    *,
    records: int,
    has_watermark: bool,
    next_event_timer: int | None,
    next_processing_timer: int | None,
    processing_time: int,
    now_ms: int,
) -> int | None:
    """When (wall-clock ms) the next micro-batch should run without input; None: not before
    input comes. ``processing_time`` is the epoch's (its timers' clock), ``now_ms`` the wall
    clock's: a processing-time timer is due that long after now."""
    wanted = []
    if records and has_watermark and next_event_timer is not None:
        wanted.append(now_ms)
    if next_processing_timer is not None:
        wanted.append(now_ms + max(0, next_processing_timer - processing_time))
    return min(wanted, default=None)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _read_request(path: str) -> int | None:
    """The wake-up the driver asked for (None: none, or no request file yet)."""
    try:
        wake = json.loads(Path(path).read_text())["wake"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    return int(wake) if isinstance(wake, int) else None


class _Nothing(InputPartition):
    """Never made: the source has no partitions."""


class WakeUpReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offers the requested wake-up as the next offset once it is due; reads no rows."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._last = 0  # pyspark 4.1 calls latestOffset() without the start offset

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 (Spark's name)
        return {"wake": 0}

    def latestOffset(  # noqa: N802 (Spark's name)
        self, start: dict[str, int] | None = None, limit: Any = None
    ) -> dict[str, int]:
        current = self._last if start is None else int(start["wake"])
        wanted = _read_request(self.path)
        if wanted is not None and current < wanted <= _now_ms():
            current = wanted
        self._last = current
        return {"wake": current}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 (Spark's name)
        """No data to bound: wake-ups asked for during the run are its own timers'."""

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return iter(())


class WakeUpSource(DataSource):
    """The wake-up source (``format("statetier-wakeups")``, option ``path``: the request)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return "wake bigint"  # replaced by the input's schema (``readStream.schema``)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return WakeUpReader(self.options["path"])


class WakeUps:
    """The driver's side: the request file the query's wake-up source reads, in a folder of its
    own that :meth:`close` removes, or else the driver's exit (a pipeline whose ``release`` is
    never called must not leave a folder behind in every application's temporary files)."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="statetier-wakeups-"))
        self.path = self.directory / REQUEST_FILE
        self._last = 0
        self._remove = weakref.finalize(self, shutil.rmtree, self.directory, ignore_errors=True)

    def ask(self, wake: int | None) -> None:
        """Ask for a micro-batch at ``wake`` (wall-clock ms; None: none). A new request is
        always later than the last, so the source offers it even within the same ms."""
        if wake is not None:
            wake = self._last = max(wake, self._last + 1)
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.directory / f".{REQUEST_FILE}.{os.getpid()}"
        partial.write_text(json.dumps({"wake": wake}))
        partial.replace(self.path)

    def close(self) -> None:
        self._remove()


def emits_from_timers(factory: Any) -> bool:
    """Whether the functions ``factory`` makes can emit from their timers: their class (the
    factory itself, or the class a ``functools.partial`` makes) has an ``on_timer`` other
    than :class:`~statetier.backend.functions.KeyedProcessFunction`'s, which emits nothing. A
    factory that is not a class (a function, a lambda) is taken to."""
    made = factory.func if isinstance(factory, functools.partial) else factory
    if not isinstance(made, type):
        return True
    on_timer = getattr(made, "on_timer", None)
    return on_timer is not None and on_timer is not KeyedProcessFunction.on_timer


def with_wake_ups(df: DataFrame, wake_ups: WakeUps) -> DataFrame:
    """``df`` and the wake-up source, one streaming DataFrame (the source adds no row and no
    partition: a micro-batch of input reads as before)."""
    spark = df.sparkSession
    spark.dataSource.register(WakeUpSource)
    plain = StructType([StructField(f.name, f.dataType, True) for f in df.schema.fields])
    wake_ups_df = (
        spark.readStream.format(SOURCE_NAME).schema(plain).option("path", str(wake_ups.path)).load()
    )
    return df.unionByName(wake_ups_df)

"""Functions and data of the Spark tests (importable: workers and state hosts unpickle them)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.spark import Combiner, KeyGroupFunction, StatefulPipeline, current_task
from statetier.backend.spark.channel import connect
from statetier.backend.spark.protocol import RESULT
from statetier.backend.spark.registry import HostInfo

COUNT = ValueStateDescriptor[int]("count")


class WordCount(KeyedProcessFunction[str, None, tuple[str, int]]):
    """Per record: count the word, emit its running count."""

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(COUNT)

    def process(self, key: str, value: None, context: RuntimeContext) -> list[tuple[str, int]]:
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        return [(key, count)]


class VectorWordCount(KeyGroupFunction):
    """Per key group: count with Arrow, then one state update per distinct word."""

    fail_at: tuple[int, int] | None = None  # (epoch, partition) failing on the first attempt

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(COUNT)

    def process_key_group(
        self, key_group: int, records: Any, context: RuntimeContext
    ) -> Iterable[tuple[str, int]]:
        counts = records.group_by("word").aggregate([("word", "count")])
        set_key = context.keyed_state.set_current_key
        out = []
        for word, n in zip(
            counts["word"].to_pylist(), counts["word_count"].to_pylist(), strict=True
        ):
            set_key(word)
            total = (self.count.value() or 0) + n
            self.count.update(total)
            out.append((word, total))
        task = current_task()
        if self.fail_at == (task.epoch, task.partition_id) and task.attempt_number == 0:
            raise RuntimeError("injected failure in the middle of a batch")
        return out


class FailingWordCount(VectorWordCount):
    fail_at = (2, 1)


PAD = ValueStateDescriptor[str]("pad")
PAD_BYTES = 1024


class PaddedWordCount(VectorWordCount):
    """A word count that also keeps about 1 KiB per word: state of a size a memory test picks
    by the number of distinct words."""

    def open(self, context: RuntimeContext) -> None:
        super().open(context)
        self.pad = context.get_state(PAD)

    def process_key_group(
        self, key_group: int, records: Any, context: RuntimeContext
    ) -> Iterable[tuple[str, int]]:
        out = list(super().process_key_group(key_group, records, context))
        set_key = context.keyed_state.set_current_key
        for word, _ in out:
            set_key(word)
            if self.pad.value() is None:
                self.pad.update(word.ljust(PAD_BYTES, "."))
        return out


class CombinedWordCount(KeyGroupFunction):
    """A combiner (partial counts per map task) and one vectorized pass per range.

    Records that the combiner merged: each word reaches it once per epoch (``seen_twice`` would
    catch partial counts that were not merged).
    """

    combiner = Combiner({"n": ("word", "count"), "longest": ("word", "max")})
    fail_at: tuple[int, int] | None = None

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(COUNT)

    def process_range(self, records: Any, context: RuntimeContext) -> Any:
        words = records["word"].to_pylist()
        assert records.column_names == ["word", "__statetier_kg", "n", "longest"]
        assert len(set(words)) == len(words), "partial counts reached the function unmerged"
        assert records["longest"].to_pylist() == words  # max over a key's own values
        set_key = context.keyed_state.set_current_key
        totals = []
        for word, n in zip(words, records["n"].to_pylist(), strict=True):
            set_key(word)
            total = (self.count.value() or 0) + n
            self.count.update(total)
            totals.append(total)
        task = current_task()
        if self.fail_at == (task.epoch, task.partition_id) and task.attempt_number == 0:
            raise RuntimeError("injected failure in the middle of a batch")
        return pa.table({"count": pa.array(totals, pa.int64()), "word": records["word"]})

    def process_key_group(self, key_group: int, records: Any, context: RuntimeContext) -> Any:
        raise AssertionError("process_range is overridden: the host must not split key groups")


class FailingCombinedWordCount(CombinedWordCount):
    fail_at = (2, 1)


class MapSideCombinedWordCount(CombinedWordCount):
    """The same combiner applied in Arrow before the exchange; the host merges the partials."""

    combiner = Combiner({"n": ("word", "count"), "longest": ("word", "max")}, map_side=True)


class SnapshotFailsOnce(VectorWordCount):
    """Fails its first snapshot of epoch 2 (after its task has returned its outputs)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def snapshot_state(self, context: Any) -> None:
        if context.checkpoint_id == 2 and not os.path.exists(self.marker):
            with open(self.marker, "w"):
                pass
            raise RuntimeError("injected snapshot failure")


def zipf_words(n: int, vocabulary: int, seed: int) -> list[str]:
    """``n`` words drawn Zipf-like (weight 1/rank) from ``vocabulary`` words."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(vocabulary)]
    return [f"w{i}" for i in rng.choices(range(vocabulary), weights, k=n)]


def expected_counts(batches: Iterable[list[str]]) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for batch in batches:
        counts.update(batch)
    return dict(counts)


def fail_once_per_marker(marker: str, word: str) -> str:
    """A Python UDF step after the pipeline's in the same Spark task: the first task attempt to
    run it creates ``marker`` and fails (after it got its ranges' outputs from the hosts)."""
    if not os.path.exists(marker):
        Path(marker).touch()
        raise RuntimeError("injected failure after the outputs came")
    return word


def latest(outputs: dict[str, int], rows: Iterable[Any]) -> None:
    """Fold (word, running count) outputs: the latest count per word."""
    for word, count in rows:
        if count > outputs.get(word, 0):
            outputs[word] = count


def words_df(spark: SparkSession, words: list[str]) -> DataFrame:
    """``words`` as the one-column DataFrame (``word string``) the word counts read."""
    return spark.createDataFrame([(w,) for w in words], "word string")


def collecting(outputs: dict[str, int]) -> Callable[[DataFrame, int], None]:
    """A sink that keeps each word's latest count in ``outputs``."""

    def sink(out: DataFrame, epoch: int) -> None:
        latest(outputs, ((r.word, r["count"]) for r in out.collect()))

    return sink


def run_with_a_host_killed(
    spark: SparkSession, pipeline: StatefulPipeline, marker: Path
) -> tuple[list[list[str]], list[float]]:
    """Three epochs of a :class:`HostDiesInSnapshot` pipeline (its host dies in epoch 2's
    snapshot, ``marker`` says so), checked as on any session: one re-run of epoch 2 that
    restores the lost range, exact outputs. The batches and each epoch's seconds."""
    batches = [zipf_words(1000, 200, seed) for seed in range(3)]
    outputs: dict[str, int] = {}
    sink = collecting(outputs)
    seconds = []
    for epoch, words in enumerate(batches, start=1):
        started = time.monotonic()
        report = pipeline.run_epoch(words_df(spark, words), epoch, sink)
        seconds.append(time.monotonic() - started)
        assert report.epoch == epoch
    assert marker.exists()  # the host did die in epoch 2's snapshot
    assert [r.reruns for r in pipeline.reports] == [0, 1, 0]
    assert pipeline.reports[1].restored >= 1  # the re-run restored the lost range
    assert pipeline.store.epochs() == [1, 2, 3]
    assert outputs == expected_counts(batches)
    return batches, seconds


def host_pids(environ: str | None = None) -> set[int]:
    """Running state hosts (processes of ``statetier.backend.spark.host``); with ``environ``
    (``NAME=value``), only those whose environment has it: the hosts of one test's own Spark,
    not those of a test running beside it in another pytest worker."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            if b"statetier.backend.spark.host" not in cmdline:
                continue
            if environ is not None:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if environ.encode() not in f.read().split(b"\0"):
                        continue
        except OSError:
            continue
        found.add(int(entry))
    return found


__all__ = ["pc"]


class HostDiesInSnapshot(VectorWordCount):
    """Kills its state host while snapshotting range 0 of epoch 2 (after the task returned its
    outputs, before the range's result exists), once: the marker file says it happened."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.partition: int | None = None

    def process_key_group(
        self, key_group: int, records: Any, context: RuntimeContext
    ) -> Iterable[tuple[str, int]]:
        self.partition = current_task().partition_id
        return super().process_key_group(key_group, records, context)

    def snapshot_state(self, context: Any) -> None:
        if context.checkpoint_id == 2 and self.partition == 0 and not os.path.exists(self.marker):
            with open(self.marker, "w"):
                pass
            os.kill(os.getpid(), 9)


class WideRows(WordCount):
    """Emits rows of three values for a two-column output schema: a user's mistake."""

    def process(self, key: str, value: None, context: RuntimeContext) -> list[tuple[str, int]]:
        return [(key, 1, "extra")]  # type: ignore[list-item]


TTL_MS = 1000


class ExpiringWords(KeyedProcessFunction[str, None, tuple[str, int]]):
    """A word count in two value states with a 1 s TTL: ``cleaned`` asks compaction to drop
    expired entries, ``kept`` does not. Expired entries stay readable until cleaned up, and no
    other cleanup runs, so what a compacted base holds shows what compaction dropped."""

    def open(self, context: RuntimeContext) -> None:
        from statetier.backend import StateTtlConfig, StateVisibility

        def ttl(cleanup: bool) -> StateTtlConfig:
            return StateTtlConfig(
                TTL_MS,
                visibility=StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP,
                incremental_cleanup_size=0,
                cleanup_in_compaction=cleanup,
            )

        self.cleaned = context.get_state(ValueStateDescriptor[int]("cleaned", ttl=ttl(True)))
        self.kept = context.get_state(ValueStateDescriptor[int]("kept", ttl=ttl(False)))

    def process(self, key: str, value: None, context: RuntimeContext) -> list[tuple[str, int]]:
        for state in (self.cleaned, self.kept):
            state.update((state.value() or 0) + 1)
        return []


def run_available_now(writer: Any, checkpoint: Any, timeout: float = 180) -> None:
    """Run a streaming query over what its source has now, with its checkpoint at
    ``checkpoint``, and stop it."""
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination(timeout)
    query.stop()


def committed_counts(store: Any, epoch: int) -> dict[str, int]:
    """The word counts a :class:`VectorWordCount` pipeline committed in ``epoch``, each range
    restored from the checkpoint as a new state host would."""
    from statetier.backend.runtime import FunctionInstance

    manifest = store.manifest(epoch)
    counts: dict[str, int] = {}
    for index in range(manifest.parallelism):
        instance = FunctionInstance(
            cast(Any, VectorWordCount),  # a KeyGroupFunction: open() is all a restore needs
            index,
            manifest.parallelism,
            manifest.max_parallelism,
            store=store,
            restore_epoch=epoch,
        )
        state = cast(VectorWordCount, instance.function).count
        for key in instance.keyed.keys("count"):
            instance.keyed.set_current_key(key)
            counts[key] = state.value() or 0
        instance.close()
    return counts


def note_pid(path: str) -> None:
    """What unpickling a :class:`PidNote` runs: adds the unpickling process's pid to ``path``."""
    with open(path, "a") as notes:
        notes.write(f"{os.getpid()}\n")


class PidNote:
    """Pickles to a call of :func:`note_pid`: which process unpickled it (a pipeline's function
    bytes stand-in, for checks that unpickle them on an executor)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return note_pid, (self.path,)


@dataclass(frozen=True)
class WorkerHeap:
    """What one of Spark's Python workers holds for its collector: how many objects are frozen
    out of every collection, and how many a full collection walks."""

    pid: int
    frozen: int
    walked: int


def _worker_heap(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import gc

    for _ in batches:  # read the input: a worker whose task left it unread is killed
        pass
    gc.collect()
    heap = {"pid": os.getpid(), "frozen": gc.get_freeze_count(), "walked": len(gc.get_objects())}
    yield pa.RecordBatch.from_pylist([heap])


def python_workers_heaps(spark: SparkSession, tasks: int = 8) -> dict[int, WorkerHeap]:
    """Each Python worker's :class:`WorkerHeap` as ``tasks`` one-row ``mapInArrow`` tasks find
    it (Spark pools the workers of SQL's Python functions apart from those of RDDs, and hands a
    task the worker idle the longest, so these go round every idle worker of that pool)."""
    schema = "pid long, frozen long, walked long"
    rows = spark.range(tasks, numPartitions=tasks).mapInArrow(_worker_heap, schema).collect()
    return {row.pid: WorkerHeap(row.pid, row.frozen, row.walked) for row in rows}


def hosted_ranges(secret: bytes, hosts: Iterable[HostInfo]) -> dict[str, int]:
    """Pipeline name -> its ranges held in ``hosts``, as the hosts themselves count them (their
    ``stats`` request, authenticated with the application's ``secret``); a host that has gone
    holds none."""
    held: collections.Counter[str] = collections.Counter()
    for host in hosts:
        try:
            conn = connect(host.endpoints[0], secret)
        except OSError:
            continue
        with contextlib.closing(conn):
            conn.send_bytes(json.dumps({"op": "stats"}).encode())
            answer = conn.recv_bytes()
        assert answer[:1] == RESULT, answer
        held.update(json.loads(answer[1:])["ranges_by_pipeline"])
    return dict(held)

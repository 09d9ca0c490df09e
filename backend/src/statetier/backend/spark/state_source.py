"""The ``statetier`` Spark data source: committed keyed state, timers, operator state and the
change feed of a checkpoint or savepoint as a DataFrame (PySpark's Python Data Source API).

``spark.read.format("statetier").option("path", URI).option("state", NAME).load()``. The plan
is made once on the driver (:meth:`StateDataSource.schema`): the options are checked, the epoch
is fixed (the latest when none is given, so every task reads the same one) and the columns are
typed after a sample key. The read is split into key-group ranges (``partitions`` of them, by
default one per BYTES_PER_TASK of stored state, at most the job's parallelism), each a task that
reads its range from object storage on an executor through
:mod:`statetier.backend.snapshot.reading` (the restore's code) and hands Spark Arrow batches.
A range of key groups (``key_groups``, or a filter on ``key_group``) and a key (a filter
``key = ...``) narrow the ranges read: by filter pushdown when the session has
``spark.sql.python.filterPushdown.enabled`` on (Spark still applies the filters itself).
See docs/state-as-data.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from statetier.backend.descriptors import StateKind
from statetier.backend.keygroups import (
    KeyGroupRange,
    assign_to_key_group,
    key_group_range_for_instance,
)
from statetier.backend.serializers import serializer_by_id
from statetier.backend.snapshot.changes import DELETE, UPSERT, read_changes
from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.snapshot.reading import (
    TIMER_DOMAINS,
    StateColumns,
    StateDecoder,
    StateEntry,
    check_state,
    open_epoch,
    read_operator_state,
    read_state,
    read_state_columns,
    read_timers,
)
from statetier.backend.snapshot.store import SnapshotStore
from statetier.backend.spark.state_metadata import StateMetadataDataSource
from statetier.backend.spark.state_options import ReadOptions, open_store
from statetier.backend.spark.value_columns import KeyColumns, ValueColumns, value_columns_for
from statetier.backend.typed.schema import stored_value_schema

__all__ = [
    "PUSHDOWN_CONF",
    "StateDataSource",
    "StateReader",
    "register_data_sources",
]

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
BATCH_ROWS = 65536
# A task has a fixed cost (a Python worker, the manifest, its files downloaded and checked, its
# batches handed to the JVM) of the order of what handing Spark 2 MiB of decoded state costs, so a
# task takes 2 MiB before another pays: a million small entries (3.7 MB) read on a 2-core machine
# at load 6-8 (docs/benchmarks.md) in 2 tasks at 1.34x and 1.71x Spark's statestore, in 4 at
# 1.10x and in 1 at 0.81x (a single task leaves the other core idle).
BYTES_PER_TASK = 2 << 20
_TIMESTAMP = pa.timestamp("us", tz="UTC")


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """What every task of one read needs, fixed on the driver (pickled to the executors)."""

    options: ReadOptions
    mode: str  # "state", "changes", "timers" or "operator"
    epoch: int
    max_parallelism: int
    parallelism: int
    tasks: int  # the key-group ranges read when ``partitions`` is not given
    change_start: int
    kind: StateKind | None
    ttl: bool
    now_ms: int | None
    keys: KeyColumns
    user_keys: KeyColumns | None
    values: ValueColumns

    def fields(self) -> list[tuple[str, str]]:
        """The columns read: (name, Spark DDL type)."""
        if self.mode == "operator":
            return [("instance", "int"), ("mode", "string"), *self.values.fields]
        head = [("epoch", "bigint"), ("change_type", "string")] if self.mode == "changes" else []
        keys = [*head, ("key_group", "int"), *self.keys.fields]
        if self.mode == "timers":
            return [*keys, ("domain", "string"), ("timestamp", "bigint")]
        user_keys = self.user_keys.fields if self.user_keys else []
        expiry = [("expires_at", "timestamp")] if self.ttl else []
        return [*keys, *user_keys, *self.values.fields, *expiry]

    def ddl(self) -> str:
        return ", ".join(f"`{name}` {ddl}" for name, ddl in self.fields())


def make_plan(options: ReadOptions) -> ReadPlan:
    """Check ``options`` against the location and fix what the read reads."""
    store = open_store(options)
    manifest = open_epoch(store, options.change_end if options.change_feed else options.epoch)
    mode = _mode(options)
    kind, ttl, values, user_key_sample = None, False, value_columns_for(""), None
    key_sample: Any = None
    if mode in ("state", "changes"):
        assert options.state is not None
        meta = check_state(manifest, options.state, store.uri)
        kind, ttl = StateKind(meta["kind"]), meta["ttl"] is not None
        values = value_columns_for(meta["serializers"]["value"], stored_value_schema(meta))
        sample = _sample(store, manifest, options.state)
        key_sample, user_key_sample = (sample.key, sample.user_key) if sample else (None, None)
    elif mode == "timers":
        timer = next(iter(_first_range(store, manifest, None)), None)
        key_sample = timer.key if timer else None
    elif mode == "operator":
        assert options.state is not None
        first = next(iter(read_operator_state(store, manifest, options.state)), None)
        values = value_columns_for(first.serializer if first else "")
    as_json = options.key_format == "json"
    return ReadPlan(
        options=options,
        mode=mode,
        epoch=manifest.epoch,
        max_parallelism=manifest.max_parallelism,
        parallelism=manifest.parallelism,
        tasks=_tasks(manifest, set(TIMER_DOMAINS) if mode == "timers" else {options.state}),
        change_start=options.change_start or manifest.epoch,
        kind=kind,
        ttl=ttl,
        now_ms=None if options.include_expired else _judged_at(options, manifest),
        keys=KeyColumns(key_sample, as_json=as_json),
        user_keys=(
            KeyColumns(user_key_sample, as_json=as_json, name="user_key")
            if kind is StateKind.MAP
            else None
        ),
        values=values,
    )


def _tasks(manifest: Manifest, states: set[str | None]) -> int:
    """How many tasks read ``states`` by default: one per BYTES_PER_TASK of their files in the
    manifest, at least one and at most the job's parallelism (a task then reads whole files)."""
    stored = sum(f.size for f in manifest.keyed_files if f.state in states)
    return max(1, min(manifest.parallelism, -(-stored // BYTES_PER_TASK)))


def _mode(options: ReadOptions) -> str:
    if options.change_feed:
        return "changes"
    if options.timers:
        return "timers"
    return "operator" if options.operator_state else "state"


def _judged_at(options: ReadOptions, manifest: Manifest) -> int:
    """The processing time TTL expiry is judged at: the option's, else the epoch's commit."""
    return manifest.created_ms if options.processing_time is None else options.processing_time


def _first_range(store: SnapshotStore, manifest: Manifest, name: str | None) -> Iterable[Any]:
    """Rows of the first key-group range holding any: the sample the columns are typed by."""
    wanted = {name} if name else set(TIMER_DOMAINS)
    for chain in manifest.chains():
        if chain.state in wanted:
            key_groups = KeyGroupRange.parse(chain.key_groups)
            if name is None:
                rows: Iterable[Any] = read_timers(store, manifest, key_groups)
            else:
                rows = read_state(store, manifest, name, key_groups)
            yield from rows


def _sample(store: SnapshotStore, manifest: Manifest, name: str) -> StateEntry | None:
    sample: StateEntry | None = next(iter(_first_range(store, manifest, name)), None)
    return sample


class StateDataSource(DataSource):
    """``format("statetier")``: a state, its timers, its change feed or operator state."""

    plan: ReadPlan

    @classmethod
    def name(cls) -> str:
        return "statetier"

    def schema(self) -> str:
        self.plan = make_plan(ReadOptions.parse(self.options))
        return self.plan.ddl()

    def reader(self, schema: Any) -> DataSourceReader:
        return StateReader(self.plan)


class PushdownStateDataSource(StateDataSource):
    """:class:`StateDataSource` for a session with Python filter pushdown on."""

    def reader(self, schema: Any) -> DataSourceReader:
        return PushdownStateReader(self.plan)


class StateReader(DataSourceReader):
    """One task per key-group range; the range narrowed by ``key_groups`` and by a key."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan
        self.narrowed = plan.options.key_groups
        self.key: tuple[Any] | None = None  # the one key to read, as a 1-tuple

    def partitions(self) -> Sequence[InputPartition]:
        plan = self.plan
        if plan.mode == "operator":
            return [InputPartition(None)]
        count = min(plan.options.partitions or plan.tasks, plan.max_parallelism)
        wanted = self.narrowed or KeyGroupRange.of(plan.max_parallelism)
        if self.key is not None:
            group = assign_to_key_group(self.key[0], plan.max_parallelism)
            wanted = wanted.intersection(KeyGroupRange(group, group))
        ranges = [
            key_group_range_for_instance(plan.max_parallelism, count, i).intersection(wanted)
            for i in range(count)
        ]
        found = [InputPartition((r.start, r.end)) for r in ranges if len(r)]
        return found or [InputPartition((1, 0))]  # nothing to read: one empty task

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        plan = self.plan
        store = open_store(plan.options)
        if plan.mode == "operator":
            yield from _batches(_operator_rows(plan, store), plan, _operator_arrays)
            return
        start, end = partition.value
        key_groups = KeyGroupRange(start, end)
        if not len(key_groups):
            return
        key_bytes = None
        if self.key is not None:
            manifest = store.manifest(plan.epoch)
            key_bytes = serializer_by_id(manifest.key_serializer).dumps(self.key[0])
        if plan.mode == "timers":
            manifest = store.manifest(plan.epoch)
            timers = read_timers(store, manifest, key_groups, key_bytes)
            yield from _batches(timers, plan, _timer_arrays)
        elif plan.mode == "changes":
            yield from _batches(
                _change_rows(plan, store, key_groups, key_bytes), plan, _change_arrays
            )
        else:
            assert plan.options.state is not None
            manifest = store.manifest(plan.epoch)
            groups = read_state_columns(
                store,
                manifest,
                plan.options.state,
                key_groups,
                now_ms=plan.now_ms,
                key_bytes=key_bytes,
            )
            yield from _column_batches(groups, plan)


class PushdownStateReader(StateReader):
    """A StateReader that takes its key-group range and key from the query's filters."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 (Spark's)
        keys: dict[str, Any] = {}
        for found in filters:
            attribute: tuple[str, ...] = getattr(found, "attribute", ())
            column = attribute[0] if len(attribute) == 1 else ""
            if column == "key_group":
                self._narrow(found)
            elif isinstance(found, EqualTo) and column in dict(self.plan.keys.fields):
                keys[column] = found.value
        names = [name for name, _ in self.plan.keys.fields]
        if self.plan.mode != "operator" and not self.plan.keys.as_json and set(keys) == set(names):
            self.key = (self.plan.keys.to_key([keys[n] for n in names]),)
        return filters  # Spark applies them too: these only prune what is read

    def _narrow(self, found: Filter) -> None:
        value: Any = getattr(found, "value", None)
        bounds: tuple[int | None, int | None] | None = None
        if isinstance(found, EqualTo):
            bounds = (value, value)
        elif isinstance(found, GreaterThan):
            bounds = (value + 1, None)
        elif isinstance(found, GreaterThanOrEqual):
            bounds = (value, None)
        elif isinstance(found, LessThan):
            bounds = (None, value - 1)
        elif isinstance(found, LessThanOrEqual):
            bounds = (None, value)
        elif isinstance(found, In) and found.value:
            bounds = (min(found.value), max(found.value))
        if bounds is None:
            return
        whole = self.narrowed or KeyGroupRange.of(self.plan.max_parallelism)
        low, high = bounds
        self.narrowed = whole.intersection(
            KeyGroupRange(whole.start if low is None else low, whole.end if high is None else high)
        )


def _batches(rows: Iterable[Any], plan: ReadPlan, arrays: Any) -> Iterator[pa.RecordBatch]:
    """``rows`` in Arrow batches of at most BATCH_ROWS, their columns made by ``arrays``."""
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= BATCH_ROWS:
            yield pa.RecordBatch.from_arrays(arrays(plan, chunk), names=_names(plan))
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_arrays(arrays(plan, chunk), names=_names(plan))


def _column_batches(groups: Iterable[StateColumns], plan: ReadPlan) -> Iterator[pa.RecordBatch]:
    """Key groups' columns in Arrow batches of about BATCH_ROWS (a key group is not cut): each
    key group's arrays are made as it comes, and a batch's are joined by Arrow."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for columns in groups:
        if len(columns):
            pending.append(pa.RecordBatch.from_arrays(_columns_arrays(plan, columns), _names(plan)))
            rows += len(columns)
        if rows >= BATCH_ROWS:
            yield _joined(pending)
            pending, rows = [], 0
    if pending:
        yield _joined(pending)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _columns_arrays(plan: ReadPlan, columns: StateColumns) -> list[pa.Array]:
    out = [pa.array(columns.key_group, pa.int32())]
    out += plan.keys.arrays(columns.key)
    if plan.user_keys is not None:
        out += plan.user_keys.arrays(columns.user_key)
    out += plan.values.arrays(columns.value, columns.value_bytes)
    if plan.ttl:
        out.append(_expiry(columns.expires_at))
    return out


def _names(plan: ReadPlan) -> list[str]:
    return [name for name, _ in plan.fields()]


def _expiry(stamps: Sequence[int | None]) -> pa.Array:
    return pa.array([None if s is None else s * 1000 for s in stamps], _TIMESTAMP)


def _state_arrays(plan: ReadPlan, rows: Sequence[StateEntry]) -> list[pa.Array]:
    out = [pa.array([r.key_group for r in rows], pa.int32())]
    out += plan.keys.arrays([r.key for r in rows])
    if plan.user_keys is not None:
        out += plan.user_keys.arrays([r.user_key for r in rows])
    out += plan.values.arrays([r.value for r in rows], [r.value_bytes for r in rows])
    if plan.ttl:
        out.append(_expiry([r.expires_at for r in rows]))
    return out


def _timer_arrays(plan: ReadPlan, rows: Sequence[Any]) -> list[pa.Array]:
    return [
        pa.array([r.key_group for r in rows], pa.int32()),
        *plan.keys.arrays([r.key for r in rows]),
        pa.array([r.domain for r in rows], pa.string()),
        pa.array([r.timestamp for r in rows], pa.int64()),
    ]


def _operator_rows(plan: ReadPlan, store: SnapshotStore) -> Iterator[Any]:
    assert plan.options.state is not None
    yield from read_operator_state(store, store.manifest(plan.epoch), plan.options.state)


def _operator_arrays(plan: ReadPlan, rows: Sequence[Any]) -> list[pa.Array]:
    return [
        pa.array([r.instance for r in rows], pa.int32()),
        pa.array([r.mode for r in rows], pa.string()),
        *plan.values.arrays([r.element for r in rows], [r.element_bytes for r in rows]),
    ]


_NO_VALUE = StateEntry(0, None, None, None, None, None, None)  # type: ignore[arg-type]


def _change_rows(
    plan: ReadPlan, store: SnapshotStore, key_groups: KeyGroupRange, key_bytes: bytes | None
) -> Iterator[tuple[int, str, StateEntry]]:
    """(epoch, change type, row): an upsert's rows are its new value's (one per list element
    or map entry), a delete is one row with its key and no value."""
    assert plan.options.state is not None
    name = plan.options.state
    decoders: dict[int, StateDecoder] = {}
    changes = read_changes(store, name, plan.change_start, plan.epoch, key_groups, key_bytes)
    for change in changes:
        decoder = decoders.get(change.epoch)
        if decoder is None:
            decoder = decoders[change.epoch] = StateDecoder.of(store.manifest(change.epoch), name)
        if change.value_bytes is None:
            key = decoder.key_serializer.loads(change.key_bytes)
            row = _NO_VALUE._replace(key_group=change.key_group, key=key)
            yield change.epoch, DELETE, row
            continue
        entries = decoder.entries(change.key_group, change.key_bytes, change.value_bytes, None)
        for entry in entries:
            yield change.epoch, UPSERT, entry


def _change_arrays(plan: ReadPlan, rows: Sequence[tuple[int, str, StateEntry]]) -> list[pa.Array]:
    return [
        pa.array([r[0] for r in rows], pa.int64()),
        pa.array([r[1] for r in rows], pa.string()),
        *_nullable_state_arrays(plan, [r[2] for r in rows]),
    ]


def _nullable_state_arrays(plan: ReadPlan, rows: Sequence[StateEntry]) -> list[pa.Array]:
    """:func:`_state_arrays` where deletes hold no value (nulls, not JSON ``null``)."""
    out = _state_arrays(plan, rows)
    deleted = pa.array([r.value_bytes is None for r in rows])
    user_keys = len(plan.user_keys.fields) if plan.user_keys else 0
    first = 1 + len(plan.keys.fields) + user_keys  # after key_group, the keys, the user keys
    for at in range(first, first + len(plan.values.fields)):
        out[at] = pc.if_else(deleted, pa.scalar(None, out[at].type), out[at])
    return out


def register_data_sources(spark: SparkSession) -> None:
    """Register ``statetier`` and ``statetier-metadata`` with ``spark`` (PySpark 4 finds
    Python data sources by a ``pyspark_``-prefixed module of one source each, not by entry
    point, so they are registered here). With the session's ``PUSHDOWN_CONF`` on, the reader
    takes key-group ranges and a key from ``where`` filters; set it before calling this."""
    pushdown = str(spark.conf.get(PUSHDOWN_CONF, "false")).lower() == "true"
    source = PushdownStateDataSource if pushdown else StateDataSource
    spark.dataSource.register(source)
    spark.dataSource.register(StateMetadataDataSource)

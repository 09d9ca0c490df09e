"""``write_state``: a DataFrame's rows bootstrapped into one state, as a new committed epoch.

The rows are put in their key groups by Spark SQL (``pmod(xxhash64(keys), P)``, the
pipeline's own expression: no Python hash), and ``repartitionById`` sends key-group range ``i``
to partition ``i``, as the pipeline's exchange does. Each partition's task, on an executor,
writes its range's files with :func:`statetier.backend.snapshot.bootstrap.write_range` (the
state handles of a backend of that range, the snapshot writer's files) while it reads the
rows, and returns the range's part of the manifest as one row; the driver commits the epoch
from those rows. ``mapInArrow`` rather than a Python data source writer: the writer's commit
protocol would hand the driver the same messages, but a data source write needs a
registered source and cannot place range ``i`` in partition ``i`` itself, which the exchange
before ``mapInArrow`` does in one step.

Columns: the key columns (string, bigint or binary, as the pipeline's), ``value`` for value,
reducing and aggregating state, ``element`` for list state (one element a row, or an array
column: its elements, in order), ``user_key`` and ``value`` for map state. The pipeline's
``initial_state=`` writes through the same functions (:func:`write_epoch`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext, cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as sf
from pyspark.sql.types import ArrayType
from statetier.backend.descriptors import MapStateDescriptor, StateDescriptor, StateKind
from statetier.backend.integer_columns import int64_values
from statetier.backend.keygroups import (
    NullKeyError,
    compute_default_max_parallelism,
    key_group_range_for_instance,
    spark_key_group_expr,
)
from statetier.backend.serializers import SerializationError, serializer_by_id
from statetier.backend.snapshot import Manifest, SnapshotStore, SubtaskSnapshot, WriterLease
from statetier.backend.snapshot.bootstrap import (
    BootstrapError,
    BootstrapPlan,
    Chunk,
    StateRows,
    commit_bootstrap,
    plan_epoch,
    write_range,
)
from statetier.backend.spark.checks import check_key_columns
from statetier.backend.spark.functions import KEY_GROUP_COLUMN
from statetier.backend.spark.results import snapshot_from_dict, snapshot_to_dict
from statetier.backend.state.writable import UnwritableValueError

__all__ = [
    "StateColumns",
    "apply_initial_state",
    "state_columns",
    "write_epoch",
    "write_ranges",
    "write_state",
]

RESULT_SCHEMA = "range bigint, snapshot string, refused string"
# a row a task refuses (a key twice, a null, a value its serializer cannot write): returned as
# the task's result, not raised, so Spark does not retry what every attempt would refuse
ROW_ERRORS = (BootstrapError, NullKeyError, UnwritableValueError, SerializationError)
_RESULT_ARROW = pa.schema(
    [("range", pa.int64()), ("snapshot", pa.string()), ("refused", pa.string())]
)


@dataclasses.dataclass(frozen=True)
class StateColumns:
    """Which columns of a DataFrame hold one state's keys and values."""

    descriptor: StateDescriptor
    key: tuple[str, ...]
    value: str
    user_key: str | None = None
    elements: bool = False  # a list state's value column is an array: whole lists

    @property
    def names(self) -> list[str]:
        return [*self.key, *([self.user_key] if self.user_key else []), self.value]


def write_state(
    df: DataFrame,
    uri: str,
    descriptor: StateDescriptor,
    *,
    key: str | Sequence[str],
    value: str | None = None,
    user_key: str = "user_key",
    max_parallelism: int | None = None,
    parallelism: int | None = None,
    savepoint: bool = False,
    add_epoch: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> Manifest:
    """Write ``df``'s rows as ``descriptor``'s state in a new committed epoch at ``uri``,
    ``parallelism`` ranges (default: Spark's default parallelism) written by executors at
    once; a pipeline or LocalRunner on ``uri`` (or started from it, ``savepoint``) restores
    it at any parallelism. ``uri`` must hold no committed epoch unless ``add_epoch``, which
    commits the latest + 1, the other states carried over. The committed manifest."""
    columns = state_columns(df, descriptor, key, value, user_key)
    p = parallelism or df.sparkSession.sparkContext.defaultParallelism
    store = SnapshotStore(uri, **dict(storage_options or {}))
    max_p = max_parallelism or _existing_max_parallelism(store, add_epoch)
    plan = plan_epoch(
        store, max_p or compute_default_max_parallelism(p), savepoint=savepoint,
        add_epoch=add_epoch,
    )  # fmt: skip
    return write_epoch(df, plan, columns, p, storage_options or {})


def _existing_max_parallelism(store: SnapshotStore, add_epoch: bool) -> int | None:
    """An added epoch keeps the location's max parallelism unless told otherwise."""
    epochs = store.epochs() if add_epoch else []
    return store.manifest(epochs[-1]).max_parallelism if epochs else None


def state_columns(
    df: DataFrame,
    descriptor: StateDescriptor,
    key: str | Sequence[str],
    value: str | None = None,
    user_key: str = "user_key",
    where: str = "write_state",
) -> StateColumns:
    """The columns of ``descriptor``'s state in ``df``, checked: a missing column, or a key
    column of a type statetier does not key by, is a one-line BootstrapError naming it (and
    ``where`` the DataFrame was given)."""
    keys = (key,) if isinstance(key, str) else tuple(key)
    fields = [(f.name, f.dataType.simpleString()) for f in df.schema.fields]
    try:
        check_key_columns(fields, keys)
    except ValueError as exc:
        raise BootstrapError(f"{where}: {exc}") from None
    kind = descriptor.kind
    value = value or ("element" if kind is StateKind.LIST else "value")
    wanted = [value, *([user_key] if kind is StateKind.MAP else [])]
    names = [name for name, _ in fields]
    for column in wanted:
        if column not in names:
            raise BootstrapError(
                f"{where}: the {kind.value} state {descriptor.name!r} needs a column "
                f"{column!r}, which the DataFrame lacks (its columns: {', '.join(names)}); "
                "name the column with value= or user_key="
            )
    elements = kind is StateKind.LIST and isinstance(df.schema[value].dataType, ArrayType)
    return StateColumns(
        descriptor, keys, value, user_key if kind is StateKind.MAP else None, elements
    )


def write_epoch(
    df: DataFrame,
    plan: BootstrapPlan,
    columns: StateColumns,
    parallelism: int,
    storage_options: Mapping[str, Any],
    lease: WriterLease | None = None,
) -> Manifest:
    """Write ``columns``' state of ``df`` by range on the executors, then commit ``plan``."""
    snapshots = write_ranges(df, plan, columns, parallelism, storage_options)
    return commit_bootstrap(plan, snapshots, lease)


def write_ranges(
    df: DataFrame,
    plan: BootstrapPlan,
    columns: StateColumns,
    parallelism: int,
    storage_options: Mapping[str, Any],
) -> list[SubtaskSnapshot]:
    """Write ``columns``' state of ``df``, one task per range: the ranges' snapshots."""
    expr = spark_key_group_expr(columns.key, plan.max_parallelism)
    owner = sf.expr(
        f"CAST((`{KEY_GROUP_COLUMN}` * {parallelism}) div {plan.max_parallelism} AS INT)"
    )
    ranged = (
        df.select(*(sf.col(f"`{c}`") for c in columns.names))
        .withColumn(KEY_GROUP_COLUMN, sf.expr(expr))
        .repartitionById(parallelism, owner)
    )
    run = range_writer(plan, columns, parallelism, dict(storage_options))
    results = ranged.mapInArrow(run, RESULT_SCHEMA).collect()
    refused = sorted(row["refused"] for row in results if row["refused"])
    if refused:
        raise BootstrapError(f"write_state: {refused[0]}")
    return [snapshot_from_dict(json.loads(row["snapshot"])) for row in results]


def apply_initial_state(
    states: Mapping[StateDescriptor, DataFrame],
    key: Sequence[str],
    plan: BootstrapPlan,
    parallelism: int,
    storage_options: Mapping[str, Any],
    lease: WriterLease,
) -> Manifest:
    """A pipeline's ``initial_state=``: every state's rows written, then one epoch committed
    under the pipeline's lease (the ranges' parts of each state merged)."""
    by_range: dict[str, SubtaskSnapshot] = {}
    for descriptor, df in states.items():
        columns = state_columns(df, descriptor, key)
        for snapshot in write_ranges(df, plan, columns, parallelism, storage_options):
            merged = by_range.setdefault(str(snapshot.key_groups), snapshot)
            if merged is not snapshot:
                merged.states.update(snapshot.states)
                merged.keyed_files.extend(snapshot.keyed_files)
    return commit_bootstrap(plan, list(by_range.values()), lease, source="initial_state")


def range_writer(
    plan: BootstrapPlan,
    columns: StateColumns,
    parallelism: int,
    storage_options: dict[str, Any],
) -> Any:
    """The ``mapInArrow`` function of the tasks: partition ``i`` is range ``i``; its rows are
    written as they are read, and the range's manifest part is the one row it returns."""
    uri, epoch, max_p = plan.store.uri, plan.epoch, plan.max_parallelism
    shipped = ship_descriptor(columns.descriptor)
    columns = dataclasses.replace(columns, descriptor=None)  # type: ignore[arg-type]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        index = TaskContext.get().partitionId()  # type: ignore[union-attr]
        key_groups = key_group_range_for_instance(max_p, parallelism, index)
        chunks = (_chunk(batch, columns) for batch in batches)
        state = StateRows(landed_descriptor(shipped), elements=columns.elements, chunks=chunks)
        store = SnapshotStore(uri, **storage_options)
        try:
            snapshot = write_range(store, epoch, key_groups, max_p, [state])
        except ROW_ERRORS as exc:  # the files written so far belong to no manifest
            row = {"range": [index], "snapshot": [""], "refused": [str(exc)]}
            yield pa.RecordBatch.from_pydict(row, schema=_RESULT_ARROW)
            return
        encoded = json.dumps(snapshot_to_dict(snapshot))
        row = {"range": [index], "snapshot": [encoded], "refused": [None]}
        yield pa.RecordBatch.from_pydict(row, schema=_RESULT_ARROW)

    return run


def ship_descriptor(descriptor: StateDescriptor) -> bytes:
    """``descriptor`` pickled for the executors, its serializers by id: a serializer holds
    thread-local packers, which do not pickle, and the executors make their own."""
    serializers = {id(descriptor.serializer): descriptor.serializer.id}
    if isinstance(descriptor, MapStateDescriptor):
        serializers[id(descriptor.key_serializer)] = descriptor.key_serializer.id
    buffer = io.BytesIO()
    pickler = cloudpickle.CloudPickler(buffer)  # type: ignore[no-untyped-call]
    pickler.persistent_id = lambda obj: serializers.get(id(obj))  # type: ignore[method-assign]
    pickler.dump(descriptor)  # type: ignore[no-untyped-call]
    return buffer.getvalue()


def landed_descriptor(data: bytes) -> StateDescriptor:
    """The descriptor :func:`ship_descriptor` pickled, with this process's serializers."""
    unpickler = pickle.Unpickler(io.BytesIO(data))
    unpickler.persistent_load = serializer_by_id  # type: ignore[method-assign]
    descriptor: StateDescriptor = unpickler.load()
    return descriptor


def _chunk(batch: pa.RecordBatch, columns: StateColumns) -> Chunk:
    """A batch's rows as the bootstrap reads them: the keys (tuples of several key columns),
    their key groups (Spark's), then the user keys of a map state and the values; sorted by
    key group (by Arrow), so that the bulk writes take a key group's keys as one slice (half
    the time of a value or reducing state's chunk). A list's elements keep their order."""
    batch = batch.take(pc.array_sort_indices(batch.column(KEY_GROUP_COLUMN)))  # stable
    keys = columns.key
    if len(keys) == 1:
        key_values: list[Any] = batch.column(keys[0]).to_pylist()
    else:
        key_values = list(zip(*(batch.column(k).to_pylist() for k in keys), strict=True))
    rest = [batch.column(c).to_pylist() for c in columns.names[len(keys) :]]
    key_groups = int64_values(batch.column(KEY_GROUP_COLUMN))
    return Chunk(key_values, key_groups, rest)

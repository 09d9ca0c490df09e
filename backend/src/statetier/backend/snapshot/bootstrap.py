"""Bootstrap: keyed state written from data, not by a running function, as a committed epoch.

Flink's State Processor API writes a savepoint from a data set; this is the same for statetier:
rows of ``(key, value)`` (``(key, user_key, value)`` for map state) become one state's entries,
range by key-group range, and one manifest commits them. Each range's rows go through the state
handles of a :class:`KeyedStateBackend` of that range, and its files are written by the same
:class:`SubtaskWriter` every snapshot uses, so a pipeline or a ``LocalRunner`` restores them as
state it wrote itself (any parallelism: a restore reads key groups), TTL timestamps included:
a TTL state's entries are "written now" by the clock of the backend.

What a row means is what the handle does with it: a value state's ``update`` (a key given twice
is refused: which row wins would be an accident of ordering), a list's ``add`` (``add_all`` for
a row whose value is a whole list), a map's ``put`` (a user key given twice for one key is
refused), a reducing or aggregating state's ``add`` (rows of one key are reduced or aggregated
by the descriptor's function).

Where the epoch goes (:func:`plan_epoch`): a location without committed epochs gets epoch 1,
with a marker (``bootstrap.json``) that tells a streaming query its micro-batch 0 follows that
epoch. A location with epochs is refused unless ``add_epoch`` is asked for; then the epoch is
the latest + 1, states not written are carried over from the latest epoch as they are (their
files named again), nothing is deleted, and the marker records the epoch, so that a restarted
query's next micro-batch is the epoch after it (see epoch_offset). A savepoint destination
gets the savepoint marker.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from statetier.backend.descriptors import StateDescriptor, StateKind
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import (
    KeyGroupRange,
    assign_to_key_group,
    check_key,
    check_parallelism,
    instance_for_key_group,
    key_group_range_for_instance,
)
from statetier.backend.snapshot import codec as codecs
from statetier.backend.snapshot.commit import build_manifest
from statetier.backend.snapshot.epoch_offset import (
    MARKER,
    bootstrap_epoch,
    record_added_epoch,
    write_bootstrap_marker,
)
from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.snapshot.savepoint import MARKER as SAVEPOINT_MARKER
from statetier.backend.snapshot.savepoint import Savepoint, SavepointExistsError, read_savepoint
from statetier.backend.snapshot.store import SnapshotStore, WriterLease
from statetier.backend.snapshot.writer import SubtaskSnapshot, SubtaskWriter
from statetier.backend.ttl import Clock

__all__ = [
    "MARKER",
    "OWNER",
    "BootstrapError",
    "BootstrapPlan",
    "Chunk",
    "StateRows",
    "bootstrap",
    "bootstrap_epoch",
    "commit_bootstrap",
    "plan_epoch",
    "write_range",
]

log = logging.getLogger(__name__)

OWNER = "bootstrap"  # the writer segment of bootstrapped files (no lease token looks like it)


class BootstrapError(ValueError):
    """Rows that cannot become the state, or a destination that may not receive it."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Rows as columns: each key, its key group (computed already, e.g. by Spark SQL), then
    the map state's user keys and the values; a value or reducing state writes a chunk with
    the handles' bulk operations, without hashing its keys again."""

    keys: list[Any]
    key_groups: Iterable[int]  # one per key: a list, or the key-group column as a NumPy array
    columns: list[list[Any]]

    def rows(self) -> Iterable[tuple[Any, ...]]:
        return zip(self.keys, *self.columns, strict=True)


@dataclasses.dataclass(frozen=True)
class StateRows:
    """The rows of one state for one range: ``(key, value)``, for map state
    ``(key, user_key, value)``, or ``chunks`` of them as columns; ``elements``: a list state's
    values are whole lists."""

    descriptor: StateDescriptor
    rows: Iterable[tuple[Any, ...]] = ()
    elements: bool = False
    chunks: Iterable[Chunk] = ()


@dataclasses.dataclass(frozen=True)
class BootstrapPlan:
    """Where a bootstrap commits: ``epoch`` at ``store``, over ``carried`` (the latest epoch's
    manifest when states are added to a location that has epochs)."""

    store: SnapshotStore
    epoch: int
    max_parallelism: int
    carried: Manifest | None
    savepoint: bool


# ------------------------------------------------------------------ one range


def write_range(
    store: SnapshotStore,
    epoch: int,
    key_groups: KeyGroupRange,
    max_parallelism: int,
    states: Sequence[StateRows],
    *,
    clock: Clock | None = None,
    codec: str = codecs.ZSTD,
) -> SubtaskSnapshot:
    """Write the files of ``states``' rows for ``key_groups`` (every key in the range) and
    return what the range contributes to the epoch's manifest."""
    backend = KeyedStateBackend(key_groups, max_parallelism, clock=clock)
    for state in states:
        _apply(backend, state)
    writer = SubtaskWriter(backend, None, incremental=False, codec=codec)
    prepared = writer.prepare(store, epoch, OWNER, full=True)
    for upload in prepared.uploads:
        store.put(upload.entry.path, upload.data)
    return prepared.snapshot


def _apply(backend: KeyedStateBackend, state: StateRows) -> None:
    """Write the rows, then the chunks, through the state's handle."""
    handle: Any = backend.get_state(state.descriptor)
    _apply_rows(backend, handle, state, state.rows)
    bulk = state.descriptor.kind in (StateKind.VALUE, StateKind.REDUCING)
    for chunk in state.chunks:
        if bulk:
            _apply_chunk(backend, handle, state.descriptor, chunk)
        else:
            _apply_rows(backend, handle, state, chunk.rows())


def _apply_chunk(
    backend: KeyedStateBackend, handle: Any, descriptor: StateDescriptor, chunk: Chunk
) -> None:
    """A value or reducing state's chunk in one bulk write (``update_all``, ``add_each``):
    what writing its rows one by one does, in a fifth of the time."""
    values = chunk.columns[-1]
    if any(v is None for v in values):
        key = chunk.keys[values.index(None)]
        raise BootstrapError(f"state {descriptor.name!r}: key {key!r} has a null value")
    batch = backend.key_batch(chunk.keys, chunk.key_groups)
    if descriptor.kind is StateKind.REDUCING:
        handle.add_each(batch, values)
        return
    twice = len(set(chunk.keys)) != len(chunk.keys)
    if twice or any(v is not None for v in handle.values(batch)):
        seen: set[Any] = set()
        for key, old in zip(chunk.keys, handle.values(batch), strict=True):
            if key in seen or old is not None:
                raise _given_twice(descriptor, key)
            seen.add(key)
    handle.update_all(batch, values)


def _given_twice(descriptor: StateDescriptor, key: Any) -> BootstrapError:
    return BootstrapError(
        f"state {descriptor.name!r}: key {key!r} is given twice; a value state holds one "
        "value per key (deduplicate the rows, or use a reducing state)"
    )


def _apply_rows(
    backend: KeyedStateBackend, handle: Any, state: StateRows, rows: Iterable[tuple[Any, ...]]
) -> None:
    """Write each row through the state's handle, as a function's code would."""
    kind, name = state.descriptor.kind, state.descriptor.name
    set_key = backend.set_current_key
    if kind is StateKind.MAP:
        for key, user_key, value in rows:
            set_key(key)
            if handle.contains(user_key):
                raise BootstrapError(
                    f"state {name!r}: key {key!r} has user key {user_key!r} twice; a map holds "
                    "one value per user key (deduplicate the rows)"
                )
            handle.put(user_key, value)
        return
    if kind is StateKind.VALUE:
        for key, value in rows:
            set_key(key)
            if value is None:
                raise BootstrapError(f"state {name!r}: key {key!r} has a null value")
            if handle.value() is not None:
                raise _given_twice(state.descriptor, key)
            handle.update(value)
        return
    write = handle.add_all if kind is StateKind.LIST and state.elements else handle.add
    for key, value in rows:
        set_key(key)
        if value is None:
            raise BootstrapError(f"state {name!r}: key {key!r} has a null value")
        write(value)


# ------------------------------------------------------------------ the epoch


def plan_epoch(
    store: SnapshotStore,
    max_parallelism: int,
    *,
    savepoint: bool = False,
    add_epoch: bool = False,
) -> BootstrapPlan:
    """Where a bootstrap at ``store`` commits (see the module's docstring), or BootstrapError
    naming the location when it may not: nothing is written before this check."""
    check_parallelism(max_parallelism, 1)
    if read_savepoint(store) is not None:
        raise BootstrapError(
            f"{store.uri} holds a savepoint ({SAVEPOINT_MARKER}); write the state to a new location"
        )
    epochs = store.epochs()
    if not epochs:
        return BootstrapPlan(store, 1, max_parallelism, None, savepoint)
    if savepoint or not add_epoch:
        raise BootstrapError(
            f"{store.uri} holds committed epochs (latest {epochs[-1]}); write to an empty "
            "location"
            + (
                ""
                if savepoint
                else ", or pass add_epoch=True to commit the state as epoch "
                f"{epochs[-1] + 1} over the others"
            )
        )
    latest = store.manifest(epochs[-1])
    if latest.max_parallelism != max_parallelism:
        raise BootstrapError(
            f"{store.uri} has max parallelism {latest.max_parallelism}, not {max_parallelism}; "
            "a location's max parallelism is fixed: pass max_parallelism="
            f"{latest.max_parallelism}"
        )
    return BootstrapPlan(store, epochs[-1] + 1, max_parallelism, latest, savepoint)


def commit_bootstrap(
    plan: BootstrapPlan,
    snapshots: Sequence[SubtaskSnapshot],
    lease: WriterLease | None = None,
    source: str = "bootstrap",
) -> Manifest:
    """Commit the ranges' ``snapshots`` as ``plan.epoch`` (with the states the plan carries
    over), and write the marker a first epoch or a savepoint needs. An added epoch takes the
    location's writer lease unless given one: a query still writing there is fenced, and its
    commit of the same epoch and ours cannot both succeed."""
    store, epoch = plan.store, plan.epoch
    if lease is None and plan.carried is not None:
        lease = store.acquire_writer()  # fences a writer still running there
    manifest = build_manifest(epoch, snapshots, lease.owner if lease else OWNER)
    if plan.carried is not None:
        manifest = _carry_over(manifest, plan.carried)
    if epoch == 1:
        # before the manifest: a query that sees epoch 1 must know micro-batch 0 follows it
        # (a savepoint too: a location restored from it gets the marker)
        write_bootstrap_marker(store, epoch)
    elif plan.carried is not None:
        # before the manifest too: a restarted query's next micro-batch runs after this epoch
        record_added_epoch(store, epoch)
    store.commit(manifest, lease)
    if plan.savepoint:
        marker = Savepoint(source, epoch, _now_ms(), None, [])
        if store.conditional.create(store.full_path(SAVEPOINT_MARKER), marker.to_json()) is None:
            raise SavepointExistsError(f"{store.uri} got a savepoint from another writer meanwhile")
    return manifest


def _carry_over(manifest: Manifest, latest: Manifest) -> Manifest:
    """``manifest`` plus the states of ``latest`` it does not write, and its operator state."""
    written = set(manifest.states)
    states = {n: m for n, m in latest.states.items() if n not in written} | manifest.states
    kept = [f for f in latest.keyed_files if f.state not in written]
    return dataclasses.replace(
        manifest,
        states=states,
        keyed_files=[*kept, *manifest.keyed_files],
        operator_files=list(latest.operator_files),
        # the operator files are the latest's, of its parallelism
        parallelism=latest.parallelism if latest.operator_files else manifest.parallelism,
    )


def bootstrap(
    store: SnapshotStore,
    states: Sequence[StateRows],
    *,
    max_parallelism: int,
    parallelism: int = 1,
    savepoint: bool = False,
    add_epoch: bool = False,
    clock: Clock | None = None,
) -> Manifest:
    """Write ``states`` (rows of any key) at ``store`` in one process: the rows are put in their
    key groups here, ``parallelism`` ranges written one after the other, then committed."""
    plan = plan_epoch(store, max_parallelism, savepoint=savepoint, add_epoch=add_epoch)
    by_range: list[list[StateRows]] = [[] for _ in range(parallelism)]
    for state in states:
        rows: list[list[tuple[Any, ...]]] = [[] for _ in range(parallelism)]
        for row in state.rows:
            check_key(row[0])
            group = assign_to_key_group(row[0], max_parallelism)
            rows[instance_for_key_group(max_parallelism, parallelism, group)].append(row)
        for index in range(parallelism):
            by_range[index].append(dataclasses.replace(state, rows=rows[index]))
    snapshots = [
        write_range(
            store,
            plan.epoch,
            key_group_range_for_instance(max_parallelism, parallelism, index),
            max_parallelism,
            by_range[index],
            clock=clock,
        )
        for index in range(parallelism)
    ]
    return commit_bootstrap(plan, snapshots)


def _now_ms() -> int:
    return int(time.time() * 1000)

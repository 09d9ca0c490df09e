"""The keyed state backend: the state of one key-group range, and the current key.

One backend serves one function instance (one Spark partition, one range of key groups). The
runtime sets the current key before each record; the user's handles then read and write that
key's state. The backend owns one :class:`~statetier.backend.state.table.StateTable` per
registered state and knows nothing about files: snapshots and restores are done by the objects
in :mod:`statetier.backend.snapshot`, which read and fill the tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

import numpy as np
import pyarrow as pa
from statetier.backend.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    ValueStateDescriptor,
)
from statetier.backend.integer_columns import int64_values
from statetier.backend.keygroups import (
    KeyGroupRange,
    assign_str_to_key_group,
    assign_to_key_group,
    check_key,
    check_parallelism,
    unhashable_key_error,
)
from statetier.backend.serializers import DEFAULT_SERIALIZER, Serializer
from statetier.backend.state import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    State,
    ValueState,
)
from statetier.backend.state.context import KeyContext
from statetier.backend.state.heap import (
    HeapAggregatingState,
    HeapListState,
    HeapMapState,
    HeapReducingState,
    HeapValueState,
    KeyGroupHandle,
    KeyGroupMaps,
)
from statetier.backend.state.key_batch import KeyBatch, as_list
from statetier.backend.state.table import StateTable
from statetier.backend.state.ttl_cleanup import IncrementalCleanup
from statetier.backend.state.ttl_states import make_ttl_state
from statetier.backend.state.writable import accept, value_checks, write_check
from statetier.backend.ttl import Clock, SystemClock, check_ttl_compatible
from statetier.backend.typed.evolution import schema_change_refusal

__all__ = [
    "EVENT_TIMER_STATE",
    "PROCESSING_TIMER_STATE",
    "KeyGroupOutOfRangeError",
    "KeyedStateBackend",
    "StateRegistrationError",
    "TouchedKeys",
]

T = TypeVar("T")

# The keyed states that hold timers (statetier.backend.timers), named as Flink names its timer
# queues ("_timer_state/<domain>_<service>"). Being states, they spill, checkpoint, restore and
# rescale with their key groups; users cannot register these two names.
EVENT_TIMER_STATE = "_timer_state/event_user-timers"
PROCESSING_TIMER_STATE = "_timer_state/processing_user-timers"
RESERVED_STATE_NAMES = frozenset({EVENT_TIMER_STATE, PROCESSING_TIMER_STATE})


class StateRegistrationError(ValueError):
    """A state name is registered twice with different kinds, or differs from its checkpoint."""


class KeyGroupOutOfRangeError(KeyError):
    """A key belongs to a key group this backend does not own."""


@dataclasses.dataclass
class RestoredState:
    """A state read from a snapshot whose descriptor has not been registered yet.

    Its entries stay as bytes until the user registers the state, because only the descriptor
    knows how to decode them. A state never registered again is written back as it was. A
    restore hands a mapping that decodes a key group's pairs from the checkpoint's blocks when
    it is first read (``statetier.backend.snapshot.lazy``), so restoring costs the download.
    """

    meta: dict[str, Any]
    entries: Mapping[int, Sequence[tuple[bytes, bytes]]]  # key group -> [(key, value) bytes]


class KeyedStateBackend:
    """Keyed state for the key groups ``key_groups`` out of ``max_parallelism``."""

    def __init__(
        self,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        *,
        clock: Clock | None = None,
        key_serializer: Serializer = DEFAULT_SERIALIZER,
    ) -> None:
        check_parallelism(max_parallelism, 1)
        if key_groups.start < 0 or key_groups.end >= max_parallelism or not len(key_groups):
            raise ValueError(
                f"key groups {key_groups} are not a range within 0..{max_parallelism - 1}"
            )
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self.clock: Clock = clock or SystemClock()
        self.key_serializer = key_serializer
        self.context = KeyContext()
        self.tables: dict[str, StateTable] = {}
        self.restored: dict[str, RestoredState] = {}
        self._handles: dict[str, State] = {}
        # Keys touched since the last drain_touched_keys(), with their slot. Doubles as the
        # key-group memo of the per-record path and as the change log of incremental snapshots:
        # every write happens under set_current_key, so a changed key is always in here.
        self._touched: dict[Any, int] = {}
        # The key batches made with their key groups, and batches used again after a drain,
        # are in self.context.batch_log: their keys are touched too, logged apart (key_batch).
        self._first = key_groups.start
        self._slots = len(key_groups)
        self._cleanups: list[IncrementalCleanup] = []
        self._hits: list[int] = []  # records per slot, while the spill tier counts
        self._counting = False
        self._on_poll: Callable[[], None] = lambda: None

    # ------------------------------------------------------------------ current key

    def set_current_key(self, key: Any) -> None:
        """Make ``key`` the key all state handles read and write."""
        try:  # free for hashable keys; an unhashable one is named, not Python's bare words
            slot = self._touched.get(key)
        except TypeError:
            raise unhashable_key_error(key) from None
        ctx = self.context
        # index first: a refused key must leave the previous key current, not half-switched
        ctx.index = self.log_key(key) if slot is None else slot
        ctx.key = key

    def plain_change_log(self) -> dict[Any, int] | None:
        """The change log (key -> slot), while making a key current does nothing more than
        :meth:`set_current_key` (no spill counting, no per-record hooks); else None.

        With it, a caller that already knows a key's slot (the timer queue, firing) makes the
        key current without a call per key: ``context.index``, ``context.key``, and the key
        logged under its slot. A per-record hook added meanwhile shows in
        ``context.per_record_work``, which such a caller checks per key."""
        return None if self.context.per_record_work else self._touched

    def _set_current_key_and_run_hooks(self, key: Any) -> None:
        """``set_current_key`` once a state needs per-record work (TTL cleanup per record)."""
        KeyedStateBackend.set_current_key(self, key)
        for hook in self.context.record_hooks:
            hook()

    def _set_current_key_counting(self, key: Any) -> None:
        """``set_current_key`` that also counts the record for its key group (spill tier).

        It runs for every record while spilling is on, so it is the plain path plus one list
        increment and one test; states with per-record hooks get the variant below.
        """
        try:
            slot = self._touched.get(key)
        except TypeError:
            raise unhashable_key_error(key) from None
        ctx = self.context
        ctx.index = slot = self.log_key(key) if slot is None else slot
        ctx.key = key
        hits = self._hits
        n = hits[slot] + 1
        hits[slot] = n
        if not n & 63:
            self._on_poll()

    def _set_current_key_counting_and_run_hooks(self, key: Any) -> None:
        """Counting ``set_current_key`` once a state needs per-record work."""
        KeyedStateBackend._set_current_key_counting(self, key)
        for hook in self.context.record_hooks:
            hook()

    def add_record_hook(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` on every record; the hook-free fast path is kept until the first one."""
        self.context.record_hooks.append(hook)
        self._select_record_path()

    def count_hits(
        self, hits: list[int] | None, on_poll: Callable[[], None] = lambda: None
    ) -> None:
        """Count records per key-group slot into ``hits``; ``None`` stops counting.

        The spill tier's request rates, cheaper than a record hook (no call per record).
        ``on_poll`` runs at every 64th record of a slot: the spill tier's cue to look at memory.
        """
        self._hits = [] if hits is None else hits
        self._counting = hits is not None
        self._on_poll = on_poll
        self._select_record_path()

    def _select_record_path(self) -> None:
        """The per-record path: the plain one unless counting or hooks need more."""
        self.context.per_record_work = self._counting or bool(self.context.record_hooks)
        if self._counting and self.context.record_hooks:
            self.set_current_key = self._set_current_key_counting_and_run_hooks  # type: ignore[method-assign]
        elif self._counting:
            self.set_current_key = self._set_current_key_counting  # type: ignore[method-assign]
        elif self.context.record_hooks:
            self.set_current_key = self._set_current_key_and_run_hooks  # type: ignore[method-assign]
        else:
            self.__dict__.pop("set_current_key", None)

    def log_key(self, key: Any) -> int:
        """The slot of a hashable key not in the change log (``plain_change_log``), which it
        logs under it: the per-record miss path. A key of a type keys cannot have, or outside
        this backend's range, is refused (as by :meth:`set_current_key`) and not logged."""
        slot = self._hashed_slot(key)
        self._touched[key] = slot
        return slot

    def _hashed_slot(self, key: Any) -> int:
        """The slot of ``key``'s key group, hashed; KeyGroupOutOfRangeError outside the range."""
        if type(key) is str:  # most keys are strings
            key_group = assign_str_to_key_group(key, self.max_parallelism)
        else:
            check_key(key)
            key_group = assign_to_key_group(key, self.max_parallelism)
        slot = key_group - self._first
        if not 0 <= slot < self._slots:
            raise KeyGroupOutOfRangeError(
                f"key {key!r} is in key group {key_group}, outside this backend's range "
                f"{self.key_groups} (max parallelism {self.max_parallelism}); records must be "
                "partitioned by key group before they reach the backend"
            )
        return slot

    def key_batch(self, keys: Iterable[Any], key_groups: Iterable[int] | None = None) -> KeyBatch:
        """Many keys at once, for the bulk reads and writes of the state handles.

        ``keys`` is any iterable or an Arrow array. ``key_groups``, when given, is each key's
        key group in the same order (the pipeline's key-group column): then no key is hashed
        here but a sample, which must agree, so a column out of step with the keys fails
        instead of filing state under the wrong key group. The keys count as touched (the next
        incremental snapshot writes them) and as requests of their key groups (the spill
        tier's rates), as ``set_current_key`` counts each; the current key does not change.
        """
        batch_keys = as_list(keys)
        if key_groups is None:
            memo, log_key = self._touched.get, self.log_key
            slots = [s if (s := memo(key)) is not None else log_key(key) for key in batch_keys]
            batch = KeyBatch(batch_keys, slots, self.context)
        else:
            given = self._given_slots(batch_keys, key_group_array(key_groups))
            batch = KeyBatch.from_slot_array(batch_keys, given, self.context)
            # logged as they are: inserting every key into _touched, a dict of the whole
            # epoch's keys, costs a cache miss per key; drain_touched_keys groups them later
            self.context.batch_log.append(batch)
        if self.context.record_hooks:
            for _ in batch_keys:
                for hook in self.context.record_hooks:
                    hook()
        if self._counting:
            self._count_hits(batch)
            self._on_poll()
        return batch

    def _count_hits(self, batch: KeyBatch) -> None:
        """Count ``batch``'s keys as requests of their key groups (a run at a time when it is
        sorted by key group)."""
        hits = self._hits
        if batch.runs is not None:
            for slot, start, stop in batch.runs:
                hits[slot] += stop - start
            return
        for slot in batch.slots:
            hits[slot] += 1

    def _given_slots(self, keys: list[Any], key_groups: np.ndarray) -> np.ndarray:
        """The slots of ``key_groups``, checked against the keys' own key groups: for string,
        bytes and int keys those of a sample (every 1/16th) and of the smallest and largest
        int (an int must fit in 64 bits); keys of any other type (None, bool, tuples, ...)
        are hashed one by one, as ``set_current_key`` would refuse or place them. The checks
        of the whole column are numpy's: no Python step per key."""
        if len(key_groups) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(key_groups)} key groups")
        if not keys:
            return key_groups
        low, high = int(key_groups.min()), int(key_groups.max())
        if low < self.key_groups.start or high > self.key_groups.end:
            bad = low if low < self.key_groups.start else high
            raise KeyGroupOutOfRangeError(
                f"key group {bad} is outside this backend's range {self.key_groups}"
            )
        types = set(map(type, keys))
        checked = range(len(keys)) if types - {str, bytes, int} else self._sample(keys, types)
        for i in checked:
            key, given = keys[i], int(key_groups[i])
            hashed = self._first + self._hashed_slot(key)  # logged with the batch
            if hashed != given:
                raise ValueError(
                    f"key {key!r} is in key group {hashed}, but its key group was given as "
                    f"{given}: the key-group column is not in step with the keys"
                )
        return key_groups - self._first

    @staticmethod
    def _sample(keys: list[Any], types: set[type]) -> list[int]:
        """Positions of every 1/16th key, and of the smallest and largest int key."""
        positions = list(range(0, len(keys), max(1, len(keys) // 16)))
        ints = [i for i, key in enumerate(keys) if type(key) is int] if int in types else []
        if ints:
            positions += [min(ints, key=keys.__getitem__), max(ints, key=keys.__getitem__)]
        return positions

    @property
    def current_key(self) -> Any:
        return self.context.key

    @property
    def current_key_group(self) -> int:
        return self.key_groups.start + self.context.index

    # ------------------------------------------------------------------ registration

    @overload
    def get_state(self, descriptor: ValueStateDescriptor[T]) -> ValueState[T]: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]: ...
    @overload
    def get_state(self, descriptor: ReducingStateDescriptor[T]) -> ReducingState[T]: ...
    @overload
    def get_state(
        self, descriptor: AggregatingStateDescriptor[Any, Any, T]
    ) -> AggregatingState[Any, T]: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState[Any, Any]: ...
    @overload
    def get_state(self, descriptor: StateDescriptor) -> State: ...

    def get_state(self, descriptor: StateDescriptor) -> State:
        """The handle of ``descriptor``'s state, registering (and restoring) it on first use."""
        if descriptor.name in RESERVED_STATE_NAMES:
            raise StateRegistrationError(
                f"state name {descriptor.name!r} is taken by statetier's timers (keyed state "
                "too); choose another name"
            )
        return self.register_internal_state(descriptor)

    def register_internal_state(self, descriptor: StateDescriptor) -> State:
        """``get_state`` without the reserved-name check: for the runtime's own keyed state
        (timers), which must spill, checkpoint and restore like user state."""
        name = descriptor.name
        existing = self.tables.get(name)
        if existing is not None:
            self._check_same(existing.descriptor, descriptor)
            return self._handles[name]
        table = StateTable(descriptor, self.key_groups)
        restored = self.restored.get(name)
        if restored is not None:
            # Check before taking it: a refused registration must not lose the restored state.
            check_restored_compatible(restored.meta, descriptor)
            self._fill(table, restored)
            del self.restored[name]
        handle = self._make_handle(table)
        self.tables[name] = table
        self._handles[name] = handle
        return handle

    @staticmethod
    def _check_same(registered: StateDescriptor, requested: StateDescriptor) -> None:
        if registered is requested:
            return
        if registered.kind is not requested.kind or type(registered) is not type(requested):
            raise StateRegistrationError(
                f"state {requested.name!r} is already registered as {registered.kind.value} "
                f"state; cannot register it again as {requested.kind.value} state"
            )
        if registered.ttl != requested.ttl:
            raise StateRegistrationError(
                f"state {requested.name!r} is already registered with TTL {registered.ttl}; "
                f"cannot register it again with TTL {requested.ttl}"
            )

    def _fill(self, table: StateTable, restored: RestoredState) -> None:
        key_loads = self.key_serializer.loads
        decode = table.codec.decode
        for key_group, pairs in restored.entries.items():
            kg_map = table.map_for(key_group)
            for key_bytes, value_bytes in pairs:
                kg_map[key_loads(key_bytes)] = decode(value_bytes)

    def _make_handle(self, table: StateTable) -> State:
        """The handle of ``table``'s state, checking what it writes (state.writable)."""
        handle = self._plain_handle(table)
        descriptor = table.descriptor
        user_keys = (
            descriptor.key_serializer if isinstance(descriptor, MapStateDescriptor) else None
        )
        values, records = value_checks(descriptor.serializer, descriptor.name, self.context)
        handle.check_writes(
            values,
            write_check(user_keys, descriptor.name, "map key", self.context)
            if user_keys is not None
            else accept,
            records,
        )
        return handle  # type: ignore[return-value]

    def _plain_handle(self, table: StateTable) -> KeyGroupHandle:
        descriptor, ctx, maps = table.descriptor, self.context, table.maps
        if descriptor.ttl is not None:
            cleanup = IncrementalCleanup(
                descriptor.kind,
                descriptor.ttl,
                self.clock,
                maps,
                len(self.key_groups),
                on_change=self._touched_by_cleanup,
            )
            self._cleanups.append(cleanup)
            if descriptor.ttl.cleanup_per_record:
                self.add_record_hook(cleanup.on_record)
            return make_ttl_state(descriptor, ctx, maps, self.clock, cleanup)
        if isinstance(descriptor, ReducingStateDescriptor):
            return HeapReducingState(ctx, maps, descriptor)
        if isinstance(descriptor, AggregatingStateDescriptor):
            return HeapAggregatingState(ctx, maps, descriptor)
        handle_types: dict[StateKind, Callable[[KeyContext, KeyGroupMaps], KeyGroupHandle]] = {
            StateKind.VALUE: HeapValueState,
            StateKind.LIST: HeapListState,
            StateKind.MAP: HeapMapState,
        }
        return handle_types[descriptor.kind](ctx, maps)

    # ------------------------------------------------------------------ change tracking

    def drain_touched_keys(self) -> dict[int, list[Any]]:
        """Keys whose state may have changed since the last call, by key group; resets the log.

        A superset of the changed keys: every key set as current (read or written), plus keys
        removed by TTL cleanup. Incremental snapshots write these keys' values or tombstones.
        """
        return self.drain_touched().by_group

    def drain_touched(self) -> TouchedKeys:
        """:meth:`drain_touched_keys`, and for each key group whose keys all came from one key
        batch (each once, nothing else touched it) where they are in that batch: a table the
        batch wrote last holds the values the batch recorded (``TouchedKeys.written``)."""
        groups: list[list[Any]] = [[] for _ in range(self._slots)]
        appends = [group.append for group in groups]
        for key, slot in self._touched.items():
            appends[slot](key)
        ctx = self.context
        batches, first = ctx.batch_log, self.key_groups.start
        if batches:
            for batch in batches:
                _file_by_slot(batch, groups)
            # a key may be in several batches and in _touched: once each, first seen first
            groups = [list(dict.fromkeys(group)) for group in groups]
            ctx.batch_log = []
        ctx.drains += 1
        only = batches[0] if len(batches) == 1 and batches[0].written else None
        runs: dict[int, tuple[int, int]] = {}
        if only is not None and only.runs is not None:
            per_key_slots = set(self._touched.values())
            for slot, start, stop in only.runs:
                if slot not in per_key_slots and len(groups[slot]) == stop - start:
                    runs[first + slot] = (start, stop)
        by_group = {first + slot: keys for slot, keys in enumerate(groups) if keys}
        self._touched = {}
        if ctx.index >= 0:  # the current key stays valid for the handles
            self._touched[ctx.key] = ctx.index
        return TouchedKeys(by_group, only, runs)

    def _touched_by_cleanup(self, key: Any, slot: int) -> None:
        self._touched[key] = slot

    # ------------------------------------------------------------------ inspection

    def keys(self, state_name: str) -> Iterator[Any]:
        """Keys that have a value in ``state_name`` (over a copy)."""
        return self.tables[state_name].keys()

    def state_names(self) -> list[str]:
        """Registered and restored-but-unregistered states."""
        return sorted({*self.tables, *self.restored})

    def estimate_size(self, key_group: int) -> int:
        """Approximate heap bytes of ``key_group`` over all states."""
        return sum(table.estimate_size(key_group) for table in self.tables.values())


@dataclasses.dataclass(frozen=True)
class TouchedKeys:
    """One epoch's change log, as an incremental snapshot reads it: the keys touched, by key
    group, and, when the epoch made one key batch with recorded writes, the key groups whose
    keys are exactly one run of it (``runs``: start and stop in ``batch``), so that the values
    its last bulk write left need not be looked up key by key (about half of a delta's time, in
    a word count of 76k touched keys a range)."""

    by_group: dict[int, list[Any]]
    batch: KeyBatch | None = None
    runs: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def written(self, maps: KeyGroupMaps, key_group: int) -> list[Any] | None:
        """The values of ``by_group[key_group]``, in order, in the table of ``maps``, as the
        batch's bulk write recorded them; None when they must be looked up."""
        run = self.runs.get(key_group)
        if run is None or self.batch is None:
            return None
        values = self.batch.written_to(maps)
        return None if values is None else values[run[0] : run[1]]


def state_meta(descriptor: StateDescriptor) -> dict[str, Any]:
    """What a snapshot records about a state so that a restore can check it: a typed state's
    value schemas too (``schemas``, absent for schemaless serializers, as in older manifests)."""
    meta = {
        "kind": descriptor.kind.value,
        "ttl": descriptor.ttl.to_json() if descriptor.ttl else None,
        "serializers": descriptor.serializer_ids(),
    }
    schemas = descriptor.value_schemas()
    if schemas:
        meta["schemas"] = {slot: schema.to_json() for slot, schema in schemas.items()}
    return meta


def check_restored_compatible(meta: dict[str, Any], descriptor: StateDescriptor) -> None:
    """Refuse a descriptor whose kind, TTL or serializers differ from the snapshot's."""
    name = descriptor.name
    if meta["kind"] != descriptor.kind.value:
        raise StateRegistrationError(
            f"state {name!r} was checkpointed as {meta['kind']} state but is registered as "
            f"{descriptor.kind.value} state"
        )
    check_ttl_compatible(name, meta["ttl"], descriptor.ttl)
    if meta["serializers"] != descriptor.serializer_ids():
        raise StateRegistrationError(
            f"state {name!r} was checkpointed with serializers {meta['serializers']} but is "
            f"registered with {descriptor.serializer_ids()}"
        )
    refusal = schema_change_refusal(meta.get("schemas", {}), descriptor.value_schemas())
    if refusal is not None:
        raise StateRegistrationError(
            f"state {name!r} cannot be restored as its new value type: {refusal}; keep the "
            "stored type, or migrate the state (docs/evolving-state.md)"
        )


def key_group_array(key_groups: Any) -> np.ndarray:
    """A key-group column (Arrow, numpy or any iterable of ints) as a numpy int64 array; a
    column of another type, or with nulls, is refused."""
    if isinstance(key_groups, (pa.Array, pa.ChunkedArray)):
        if not pa.types.is_integer(key_groups.type) or key_groups.null_count:
            raise TypeError(
                f"key groups must be ints (the pipeline's key-group column), not "
                f"{key_groups.type}{' with nulls' if key_groups.null_count else ''}"
            )
        return int64_values(key_groups)
    if isinstance(key_groups, np.ndarray):
        if key_groups.dtype.kind not in "iu":
            raise TypeError(f"key groups must be ints, not {key_groups.dtype}")
        return key_groups.astype(np.int64, copy=False)
    groups = as_list(key_groups)
    if not set(map(type, groups)) <= {int}:
        raise TypeError("key groups must be ints (the pipeline's key-group column)")
    try:
        return np.array(groups, np.int64)
    except OverflowError:
        raise KeyGroupOutOfRangeError(
            f"a key group of {max(groups, key=abs)} is outside any backend's range"
        ) from None


def _file_by_slot(batch: KeyBatch, groups: list[list[Any]]) -> None:
    """Add each key of ``batch`` to the group of its slot, in order: a key group's keys in one
    slice when the batch is sorted by key group (a Python step per key made up a third of an
    incremental snapshot's cost)."""
    keys = batch.keys
    if batch.runs is not None:
        for slot, start, stop in batch.runs:
            groups[slot].extend(keys[start:stop])
        return
    appends = [group.append for group in groups]
    for key, slot in zip(keys, batch.slots, strict=True):
        appends[slot](key)

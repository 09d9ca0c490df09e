"""Committed state read back as entries: what a tool or a Spark data source shows of a state.

A checkpoint (or a savepoint, which has a checkpoint's layout) is read through the restore's own
code: the manifest of one epoch, :func:`~statetier.backend.snapshot.restore.read_key_groups` for
the key groups asked (base plus deltas, every file checked), and the state's
:class:`~statetier.backend.state.codec.StateCodec` for each stored value, so this module knows
the file format only through them. What it adds is the flattening a reader wants: one entry per
list element and per map entry (each has its own TTL timestamp), the TTL timestamp beside the
value, expired entries left out unless asked, and timers (two internal keyed states) and
operator state (per-instance lists) in their own shapes.

Errors a user can make (a location with nothing committed, an epoch that is not there, a state
that is not) raise :class:`StateReadError` with one line naming the value and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import struct
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pyarrow as pa
from statetier.backend.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    StateKind,
    ValueStateDescriptor,
)
from statetier.backend.keyed_backend import (
    EVENT_TIMER_STATE,
    PROCESSING_TIMER_STATE,
    RESERVED_STATE_NAMES,
)
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.serializers import (
    MsgpackSerializer,
    SerializationError,
    Serializer,
    serializer_by_id,
)
from statetier.backend.snapshot import columns as block_columns
from statetier.backend.snapshot.columns import Columns
from statetier.backend.snapshot.format import decode_operator_file
from statetier.backend.snapshot.lazy import FlatPairs, LazyEntries
from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.snapshot.restore import read_key_groups
from statetier.backend.snapshot.store import NoSnapshotError, SnapshotStore
from statetier.backend.state.codec import StateCodec
from statetier.backend.ttl import StateTtlConfig
from statetier.backend.typed.schema import stored_value_schema
from statetier.backend.typed.serializer import TYPED_SERIALIZER_ID, TypedSerializer

__all__ = [
    "OperatorElement",
    "StateDecoder",
    "StateEntry",
    "StateColumns",
    "StateReadError",
    "Timer",
    "open_epoch",
    "operator_state_summaries",
    "read_operator_state",
    "read_group_columns",
    "read_groups",
    "read_state",
    "read_state_columns",
    "read_stored",
    "read_timers",
    "state_summaries",
    "user_state_names",
]

TIMER_DOMAINS = {EVENT_TIMER_STATE: "event-time", PROCESSING_TIMER_STATE: "processing-time"}


class StateReadError(ValueError):
    """A read asked for something the location does not hold (one line: what, and the fix)."""


class StateEntry(NamedTuple):
    """One row of a state: for a list state one element, for a map state one entry.

    ``value_bytes`` are the state serializer's bytes of ``value`` (for a value its serializer
    can read and JSON cannot hold); ``timestamp`` is the TTL's last-write time in ms (None
    without TTL) and ``expires_at`` when it expires."""

    key_group: int
    key: Any
    user_key: Any
    value: Any
    value_bytes: bytes
    timestamp: int | None
    expires_at: int | None


class Timer(NamedTuple):
    key_group: int
    key: Any
    domain: str  # "event-time" or "processing-time"
    timestamp: int


class OperatorElement(NamedTuple):
    instance: int  # the index of the function instance that wrote it
    mode: str  # its redistribution: "split" (even split) or "union"
    serializer: str  # the id of the serializer of its elements
    element: Any
    element_bytes: bytes


def open_epoch(store: SnapshotStore, epoch: int | None = None) -> Manifest:
    """The manifest of ``epoch`` (default: the latest) at ``store``, or a StateReadError
    naming the location, the epochs it holds and the fix."""
    epochs = store.epochs()
    if not epochs:
        raise StateReadError(
            f"no committed epoch under {store.uri}: give the checkpoint.uri of a job that "
            "committed at least one epoch, or a savepoint's location"
        )
    if epoch is not None and epoch not in epochs:
        raise StateReadError(
            f"epoch {epoch} is not committed under {store.uri} (committed: "
            f"{_epoch_list(epochs)}); give one of those, or leave the epoch out for the latest"
        )
    try:
        return store.manifest(epoch)
    except NoSnapshotError as exc:  # removed by retention since it was listed
        raise StateReadError(f"{exc}; read a newer epoch") from None


def _epoch_list(epochs: list[int]) -> str:
    if epochs == list(range(epochs[0], epochs[-1] + 1)) and len(epochs) > 2:
        return f"{epochs[0]}..{epochs[-1]}"
    return ", ".join(map(str, epochs))


def user_state_names(manifest: Manifest) -> list[str]:
    """The keyed states a function declared (timers are internal states and not listed)."""
    return sorted(name for name in manifest.states if name not in RESERVED_STATE_NAMES)


def check_state(manifest: Manifest, name: str, where: str) -> dict[str, Any]:
    """The manifest's meta of keyed state ``name``; a StateReadError with a did-you-mean."""
    if name in manifest.states and name not in RESERVED_STATE_NAMES:
        return manifest.states[name]
    known = user_state_names(manifest)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise StateReadError(
        f"no keyed state {name!r} in epoch {manifest.epoch} of {where}; {hint}its states: "
        f"{', '.join(known) or 'none'}"
    )


def _stored_serializer(meta: dict[str, Any], slot: str) -> Serializer:
    """The serializer of ``slot``'s stored bytes. A typed one is made with the schema the
    manifest records, so that it reads records as dicts of exactly that schema (an ``int``
    stored before a widening as a ``float``) and writes them back (the bytes of one map entry
    or list element), which a TypedSerializer without a type cannot."""
    serializer_id = meta["serializers"][slot]
    schema = stored_value_schema(meta, slot)
    if serializer_id == TYPED_SERIALIZER_ID and schema is not None:
        return TypedSerializer(schema)
    return serializer_by_id(serializer_id)


def _layout_descriptor(name: str, meta: dict[str, Any]) -> StateDescriptor:
    """A descriptor with the stored layout of ``meta``'s state: a StateCodec lays out lists
    and maps on their own and every other kind (reducing, aggregating) as a value, so the
    user's functions, which a reader does not have, are not needed to decode it."""
    value = _stored_serializer(meta, "value")
    ttl = StateTtlConfig.from_json(meta["ttl"]) if meta["ttl"] else None
    kind = StateKind(meta["kind"])
    if kind is StateKind.MAP:
        user_key = _stored_serializer(meta, "user_key")
        return MapStateDescriptor(name, serializer=value, key_serializer=user_key, ttl=ttl)
    if kind is StateKind.LIST:
        return ListStateDescriptor(name, serializer=value, ttl=ttl)
    return ValueStateDescriptor(name, serializer=value, ttl=ttl)


@dataclasses.dataclass
class StateDecoder:
    """Stored (key bytes, value bytes) of one state into :class:`StateEntry` rows."""

    kind: StateKind
    key_serializer: Serializer
    value_serializer: Serializer
    codec: StateCodec
    ttl: StateTtlConfig | None

    @classmethod
    def of(cls, manifest: Manifest, name: str) -> StateDecoder:
        meta = manifest.states[name]
        descriptor = _layout_descriptor(name, meta)
        return cls(
            StateKind(meta["kind"]),
            serializer_by_id(manifest.key_serializer),
            descriptor.serializer,
            StateCodec(descriptor),
            descriptor.ttl,
        )

    def entries(
        self, key_group: int, key_bytes: bytes, value_bytes: bytes, now_ms: int | None
    ) -> list[StateEntry]:
        """The rows of one stored key; with ``now_ms``, those expired then are left out."""
        key = self.key_serializer.loads(key_bytes)
        if self.kind is StateKind.LIST or self.kind is StateKind.MAP:
            return self._collection(key_group, key, value_bytes, now_ms)
        if self.ttl is None:  # the stored bytes are the serializer's own
            value = self.value_serializer.loads(value_bytes)
            return [StateEntry(key_group, key, None, value, value_bytes, None, None)]
        value, stamp = self.codec.decode(value_bytes)
        return self._rows(key_group, key, [(None, value, stamp)], now_ms)

    def _collection(
        self, key_group: int, key: Any, value_bytes: bytes, now_ms: int | None
    ) -> list[StateEntry]:
        stored = self.codec.decode(value_bytes)
        items: list[tuple[Any, Any, int | None]]
        if self.kind is StateKind.LIST:
            items = [(None, *e) for e in stored] if self.ttl else [(None, e, None) for e in stored]
        elif self.ttl:
            items = [(k, v, ts) for k, (v, ts) in stored.items()]
        else:
            items = [(k, v, None) for k, v in stored.items()]
        return self._rows(key_group, key, items, now_ms)

    def _rows(
        self,
        key_group: int,
        key: Any,
        items: list[tuple[Any, Any, int | None]],
        now_ms: int | None,
    ) -> list[StateEntry]:
        dumps, ttl = self.value_serializer.dumps, self.ttl
        rows = []
        for user_key, value, stamp in items:
            expires = None if ttl is None or stamp is None else stamp + ttl.ttl_ms
            if expires is not None and now_ms is not None and expires <= now_ms:
                continue
            rows.append(StateEntry(key_group, key, user_key, value, dumps(value), stamp, expires))
        return rows


def _only_state(manifest: Manifest, name: str) -> Manifest:
    """``manifest`` narrowed to one state, so a restore reads that state's files only."""
    return dataclasses.replace(
        manifest,
        states={name: manifest.states[name]},
        keyed_files=[f for f in manifest.keyed_files if f.state == name],
    )


def _restored(
    store: SnapshotStore, manifest: Manifest, name: str, key_groups: KeyGroupRange
) -> LazyEntries:
    """State ``name``'s entries in ``key_groups``, read as a restore reads them (undecoded)."""
    entries = read_key_groups(store, _only_state(manifest, name), key_groups)[name].entries
    assert isinstance(entries, LazyEntries)
    return entries


def read_groups(
    store: SnapshotStore,
    manifest: Manifest,
    name: str,
    key_groups: KeyGroupRange,
    key_bytes: bytes | None = None,
) -> Iterator[tuple[int, list[bytes], list[bytes]]]:
    """(key group, its keys' bytes, their values' bytes) of state ``name`` in ``key_groups``
    at the manifest's epoch, read as a restore reads them; only ``key_bytes`` when given."""
    if name not in manifest.states:
        return
    entries = _restored(store, manifest, name, key_groups)
    for key_group in sorted(entries):
        if key_bytes is not None:
            found = entries.lookup(key_group, key_bytes)
            if found is not None:
                yield key_group, [key_bytes], [found]
            continue
        pairs = entries[key_group]
        if isinstance(pairs, FlatPairs):
            yield key_group, pairs.keys(), pairs.values()
        else:
            yield key_group, [k for k, _ in pairs], [v for _, v in pairs]


def read_group_columns(
    store: SnapshotStore,
    manifest: Manifest,
    name: str,
    key_groups: KeyGroupRange,
    key_bytes: bytes | None = None,
) -> Iterator[tuple[int, Columns]]:
    """:func:`read_groups` as Arrow columns (keys and values), merged from the blocks without
    a Python object per entry."""
    if key_bytes is not None:
        for key_group, keys, values in read_groups(store, manifest, name, key_groups, key_bytes):
            yield key_group, block_columns.from_lists(keys, values)
        return
    if name not in manifest.states:
        return
    entries = _restored(store, manifest, name, key_groups)
    for key_group in sorted(entries):
        yield key_group, entries.columns(key_group)


def read_stored(
    store: SnapshotStore,
    manifest: Manifest,
    name: str,
    key_groups: KeyGroupRange,
    key_bytes: bytes | None = None,
) -> Iterator[tuple[int, bytes, bytes]]:
    """:func:`read_groups` entry by entry: (key group, key bytes, value bytes)."""
    for key_group, keys, values in read_groups(store, manifest, name, key_groups, key_bytes):
        for key, value in zip(keys, values, strict=True):
            yield key_group, key, value


@dataclasses.dataclass
class StateColumns:
    """:class:`StateEntry` rows as columns (a list per field), for bulk readers."""

    key_group: list[int] = dataclasses.field(default_factory=list)
    key: list[Any] = dataclasses.field(default_factory=list)
    user_key: list[Any] = dataclasses.field(default_factory=list)
    value: list[Any] = dataclasses.field(default_factory=list)
    # the stored column of a plain value's bytes, a list of each entry's bytes otherwise
    value_bytes: list[bytes] | pa.Array = dataclasses.field(default_factory=list)
    timestamp: list[int | None] = dataclasses.field(default_factory=list)
    expires_at: list[int | None] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.key_group)

    def add(self, entries: list[StateEntry]) -> None:
        if entries:
            for field, column in zip(StateEntry._fields, zip(*entries, strict=True), strict=True):
                getattr(self, field).extend(column)


def bulk_loads(serializer: Serializer) -> Callable[[pa.LargeBinaryArray], list[Any]]:
    """``serializer.loads`` of each item of an Arrow binary column, in one call. msgpack items
    are decoded as one msgpack array of them (an array header, then the column's bytes end to
    end): one C call, no bytes object and no Python call per item, and exactly the values
    ``loads`` gives each (a count that does not match fails the decode, and the items are then
    read one by one, for ``loads``'s error)."""
    loads = serializer.loads
    if not isinstance(serializer, MsgpackSerializer):
        return lambda column: list(map(loads, column.to_pylist()))

    def loads_all(column: pa.LargeBinaryArray) -> list[Any]:
        head = _ARRAY_HEAD.pack(0xDD, len(column))
        try:
            found: list[Any] = loads(b"".join((head, block_columns.joined(column))))
            return found
        except SerializationError:
            return list(map(loads, column.to_pylist()))

    return loads_all


_ARRAY_HEAD = struct.Struct(">BI")  # msgpack's array 32: 0xdd, then the count


def read_state_columns(
    store: SnapshotStore,
    manifest: Manifest,
    name: str,
    key_groups: KeyGroupRange,
    *,
    now_ms: int | None = None,
    key_bytes: bytes | None = None,
) -> Iterator[StateColumns]:
    """:func:`read_state` a key group at a time, as columns. A plain value (no list, map or
    TTL) is its serializer's bytes: the key group's Arrow columns are decoded in bulk, with no
    row object per entry, and its values' bytes are the stored column itself (the common case,
    and the bulk of a read)."""
    check_state(manifest, name, store.uri)
    decoder = StateDecoder.of(manifest, name)
    plain = decoder.kind not in (StateKind.LIST, StateKind.MAP) and decoder.ttl is None
    key_loads, value_loads = (
        bulk_loads(decoder.key_serializer),
        bulk_loads(decoder.value_serializer),
    )
    if plain:
        for key_group, found in read_group_columns(store, manifest, name, key_groups, key_bytes):
            count = len(found)
            yield StateColumns(
                key_group=[key_group] * count,
                key=key_loads(found.keys),
                user_key=[None] * count,
                value=value_loads(found.values),
                value_bytes=found.values,
                timestamp=[None] * count,
                expires_at=[None] * count,
            )
        return
    for key_group, keys, values in read_groups(store, manifest, name, key_groups, key_bytes):
        columns = StateColumns()
        for key, value in zip(keys, values, strict=True):
            columns.add(decoder.entries(key_group, key, value, now_ms))
        yield columns


def read_state(
    store: SnapshotStore,
    manifest: Manifest,
    name: str,
    key_groups: KeyGroupRange,
    *,
    now_ms: int | None = None,
    key_bytes: bytes | None = None,
) -> Iterator[StateEntry]:
    """The rows of keyed state ``name`` in ``key_groups``; those whose TTL expired at
    ``now_ms`` are left out (None: every stored one)."""
    check_state(manifest, name, store.uri)
    decoder = StateDecoder.of(manifest, name)
    for key_group, key, value in read_stored(store, manifest, name, key_groups, key_bytes):
        yield from decoder.entries(key_group, key, value, now_ms)


def read_timers(
    store: SnapshotStore,
    manifest: Manifest,
    key_groups: KeyGroupRange,
    key_bytes: bytes | None = None,
) -> Iterator[Timer]:
    """The registered timers in ``key_groups``: one per key, domain and timestamp."""
    for name, domain in TIMER_DOMAINS.items():
        if name not in manifest.states:
            continue
        decoder = StateDecoder.of(manifest, name)
        for key_group, key, value in read_stored(store, manifest, name, key_groups, key_bytes):
            (entry,) = decoder.entries(key_group, key, value, None)
            for stamp in entry.value:
                yield Timer(key_group, entry.key, domain, stamp)


def read_operator_state(
    store: SnapshotStore, manifest: Manifest, name: str
) -> Iterator[OperatorElement]:
    """The elements of operator state ``name``, per instance that wrote them."""
    files = sorted(manifest.operator_files, key=lambda f: f.operator_index or 0)
    found = False
    names: set[str] = set()
    for entry, data in zip(files, store.read_many(files), strict=True):
        states = decode_operator_file(data, store.full_path(entry.path))
        names.update(states)
        part = states.get(name)
        if part is None:
            continue
        found = True
        serializer = str(part["serializer"])
        loads = serializer_by_id(serializer).loads
        index, mode = entry.operator_index or 0, str(part["mode"])
        for element in part["elements"]:
            yield OperatorElement(index, mode, serializer, loads(element), element)
    if not found:
        close = difflib.get_close_matches(name, sorted(names), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise StateReadError(
            f"no operator state {name!r} in epoch {manifest.epoch} of {store.uri}; {hint}its "
            f"operator states: {', '.join(sorted(names)) or 'none'}"
        )


def operator_state_summaries(store: SnapshotStore, manifest: Manifest) -> Iterator[dict[str, Any]]:
    """One summary per operator state of the manifest (reads its operator files)."""
    found: dict[str, dict[str, Any]] = {}
    files = manifest.operator_files
    for entry, data in zip(files, store.read_many(files), strict=True):
        for name, part in decode_operator_file(data, store.full_path(entry.path)).items():
            summary = found.setdefault(
                name, {"mode": str(part["mode"]), "serializer": str(part["serializer"]), "n": 0}
            )
            summary["n"] += len(part["elements"])
    for name in sorted(found):
        yield {
            **_summary(manifest, name, "operator", found[name]["serializer"]),
            "redistribution": found[name]["mode"],
            "elements": found[name]["n"],
        }


def _summary(manifest: Manifest, name: str, kind: str, serializer: str) -> dict[str, Any]:
    return {
        "epoch": manifest.epoch,
        "state": name,
        "kind": kind,
        "internal": name in RESERVED_STATE_NAMES,
        "value_serializer": serializer,
        "user_key_serializer": None,
        "key_serializer": manifest.key_serializer,
        "ttl_ms": None,
        "ttl_update_type": None,
        "max_parallelism": manifest.max_parallelism,
        "parallelism": manifest.parallelism,
        "files": 0,
        "bytes": 0,
        "redistribution": None,
        "elements": None,
    }


def state_summaries(manifest: Manifest) -> Iterator[dict[str, Any]]:
    """One summary per keyed state of the manifest (timers included, marked internal)."""
    sizes: dict[str, tuple[int, int]] = {}
    for entry in manifest.keyed_files:
        files, size = sizes.get(entry.state or "", (0, 0))
        sizes[entry.state or ""] = (files + 1, size + entry.size)
    for name in sorted(manifest.states):
        meta = manifest.states[name]
        ttl = meta["ttl"]
        files, size = sizes.get(name, (0, 0))
        yield {
            **_summary(manifest, name, meta["kind"], meta["serializers"]["value"]),
            "user_key_serializer": meta["serializers"].get("user_key"),
            "ttl_ms": ttl["ttl_ms"] if ttl else None,
            "ttl_update_type": ttl["update_type"] if ttl else None,
            "files": files,
            "bytes": size,
        }

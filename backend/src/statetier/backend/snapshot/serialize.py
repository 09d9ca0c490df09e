"""Turning live state into file bytes: the synchronous part of a snapshot.

Everything here runs on the processing thread between records, so what it produces is a
consistent copy of the state at the end of the epoch; uploads then run in the background on the
bytes while processing goes on. Spilled key groups are read through the same mapping interface
(the spill tier gives snapshots a consistent view of them).

A base holds every entry of a range (expired TTL entries dropped when the state asks for cleanup
on full snapshots); a delta holds the keys touched since the previous epoch, with a tombstone for
those no longer present.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import zlib
from collections.abc import Callable, Mapping
from typing import Any, cast

from statetier.backend.keyed_backend import KeyedStateBackend, RestoredState, TouchedKeys
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.operator_state import OperatorStateBackend
from statetier.backend.serializers import PackMany, SerializationError, bulk_dumps, pack_many
from statetier.backend.snapshot.columns import Items, Packed, ValueItems
from statetier.backend.snapshot.format import (
    BASE,
    DELTA,
    encode_data_file,
    encode_data_file_columns,
    encode_operator_file,
)
from statetier.backend.snapshot.manifest import FileEntry
from statetier.backend.state.table import StateTable
from statetier.backend.state.ttl_cleanup import purge_expired
from statetier.backend.state.writable import UnwritableValueError, unwritable_message

__all__ = [
    "PreparedFile",
    "encode_operator_state",
    "encode_restored_base",
    "encode_table",
    "keyed_entry",
]

# (key group, keys, values): two columns, no tuple per entry (see encode_data_file_columns)
Blocks = list[tuple[int, Items, ValueItems]]


@dataclasses.dataclass(frozen=True)
class PreparedFile:
    """A file ready to upload: its manifest entry (size and checksum known) and its bytes."""

    entry: FileEntry
    data: bytes


def keyed_entry(
    name: str, data: bytes, state: str, key_groups: KeyGroupRange | str, kind: str, epoch: int
) -> FileEntry:
    return FileEntry(
        path=name,
        size=len(data),
        crc32=zlib.crc32(data),
        state=state,
        key_groups=str(key_groups),
        kind=kind,
        epoch=epoch,
    )


def _header(
    state: str,
    key_groups: KeyGroupRange | str,
    epoch: int,
    kind: str,
    max_parallelism: int,
    codec: str,
) -> dict[str, Any]:
    return {
        "state": state,
        "key_groups": str(key_groups),
        "epoch": epoch,
        "kind": kind,
        "max_parallelism": max_parallelism,
        "codec": codec,
    }


@dataclasses.dataclass(frozen=True)
class ColumnWriter:
    """Writes a column of keys or values: all in one call where the serializer can
    (``pack_many``: no bytes object per item), else item by item with ``dumps``."""

    dumps: Callable[[Any], bytes | None]
    many: PackMany | None = None

    def column(self, items: list[Any]) -> Items:
        packed = self.many(items) if self.many is not None else None
        if packed is not None:
            return Packed(*packed)
        return cast(list[bytes], list(map(self.dumps, items)))


def encode_table(
    backend: KeyedStateBackend,
    table: StateTable,
    epoch: int,
    touched: TouchedKeys | None,
    codec: str,
) -> bytes:
    """A base of ``table`` (``touched`` None) or a delta of the ``touched`` keys, its blocks
    compressed with ``codec``."""
    serializer, values = backend.key_serializer, table.codec
    kind = BASE if touched is None else DELTA
    header = _header(table.name, backend.key_groups, epoch, kind, backend.max_parallelism, codec)
    try:
        keys_out = ColumnWriter(bulk_dumps(serializer), pack_many(serializer))
        values_out = ColumnWriter(values.bulk_encoder(), values.bulk_packer())
        blocks = _table_blocks(backend, table, touched, keys_out, values_out)
    except Exception:
        # the bulk encoders' errors are raw; the checked ones name the value that failed
        keys_out, values_out = ColumnWriter(serializer.dumps), ColumnWriter(values.encode)
        try:
            blocks = _table_blocks(backend, table, touched, keys_out, values_out)
        except Exception as exc:
            raise _unwritable_entry(table, exc) from None
    return encode_data_file_columns(header, blocks)


def _unwritable_entry(table: StateTable, error: Exception) -> Exception:
    """The error of the first entry of ``table`` whose value its serializer cannot write, naming
    the state and the key (writes check what they can, state.writable; a big int or what
    another serializer refuses is found here), or ``error`` when every value can be written."""
    encode = table.codec.encode
    for kg_map in table.maps:
        for key, stored in list(kg_map.items()):
            try:
                encode(stored)
            except Exception as exc:
                reason = str(exc) if isinstance(exc, SerializationError) else _fix_for(table, exc)
                return UnwritableValueError(unwritable_message(table.name, key, "value", reason))
    return error


def _fix_for(table: StateTable, error: Exception) -> str:
    """The reason and fix of a value another serializer than the default one refused."""
    serializer = table.descriptor.serializer.id
    return (
        f"the {serializer} serializer cannot write it ({error}); store a value it can write "
        "(no locks, sockets, open files or local functions)"
    )


def _table_blocks(
    backend: KeyedStateBackend,
    table: StateTable,
    touched: TouchedKeys | None,
    keys_out: ColumnWriter,
    values_out: ColumnWriter,
) -> Blocks:
    """Each key group's keys and values as bytes, in two columns; a delta writes None for a
    cleared key."""
    ttl = table.descriptor.ttl
    if ttl is not None and ttl.cleanup_full_snapshot:
        kind, now = table.descriptor.kind, backend.clock.now_ms()
        plain = values_out.dumps

        def encode_live(stored: Any) -> bytes | None:
            live = purge_expired(kind, stored, ttl, now)
            return None if live is None else plain(live)

        values_out = ColumnWriter(encode_live)
    if touched is None:
        return [_base_block(kg, table, keys_out, values_out) for kg in backend.key_groups]
    by_group, maps = touched.by_group, table.maps
    return [
        _delta_block(kg, by_group[kg], touched.written(maps, kg), table, keys_out, values_out)
        for kg in sorted(by_group)
    ]


def _base_block(
    key_group: int, table: StateTable, keys_out: ColumnWriter, values_out: ColumnWriter
) -> tuple[int, Items, ValueItems]:
    """Every entry of ``key_group``; one whose value ``encode`` drops (expired) is not written."""
    keys, stored = _keys_and_values(table.map_for(key_group))
    values: ValueItems = values_out.column(stored)
    if not isinstance(values, Packed) and any(map(operator.is_, values, itertools.repeat(None))):
        live = list(map(operator.is_not, values, itertools.repeat(None)))
        keys = list(itertools.compress(keys, live))
        values = list(itertools.compress(values, live))
    return key_group, keys_out.column(keys), values


def _keys_and_values(kg_map: Mapping[Any, Any]) -> tuple[list[Any], list[Any]]:
    """A key group's keys and values in two lists, read in one pass: a dict's from its own
    views, a spilled map's from one scan of ``items()`` (its ``values()`` would look every key
    up again)."""
    if type(kg_map) is dict:
        return list(kg_map), list(kg_map.values())
    keys: list[Any] = []
    values: list[Any] = []
    for key, value in kg_map.items():
        keys.append(key)
        values.append(value)
    return keys, values


def _delta_block(
    key_group: int,
    keys: list[Any],
    written: list[Any] | None,
    table: StateTable,
    keys_out: ColumnWriter,
    values_out: ColumnWriter,
) -> tuple[int, Items, ValueItems]:
    """The touched ``keys`` of ``key_group``: their values, or None (a tombstone) where a key
    has none any more; ``written`` when a key batch's bulk write recorded them."""
    stored = list(map(table.map_for(key_group).get, keys)) if written is None else written
    values: ValueItems
    if any(map(operator.is_, stored, itertools.repeat(None))):
        encode = values_out.dumps
        values = [None if value is None else encode(value) for value in stored]
    else:
        values = values_out.column(stored)
    return key_group, keys_out.column(keys), values


def encode_restored_base(
    key_groups: KeyGroupRange,
    name: str,
    restored: RestoredState,
    epoch: int,
    max_p: int,
    codec: str,
) -> bytes:
    """A base of a state restored but not registered again: its entries, as they were read."""
    blocks = [(kg, list(restored.entries.get(kg, []))) for kg in key_groups]
    return encode_data_file(_header(name, key_groups, epoch, BASE, max_p, codec), blocks)


def encode_operator_state(backend: OperatorStateBackend) -> bytes:
    states: dict[str, dict[str, Any]] = {}
    for name, registered in backend.states.items():
        dumps = registered.descriptor.serializer.dumps
        states[name] = {
            "mode": registered.mode.value,
            "serializer": registered.descriptor.serializer.id,
            "elements": [dumps(e) for e in registered.state.elements],
        }
    for name, (mode, serializer_id, elements) in backend.restored.items():
        states[name] = {"mode": mode.value, "serializer": serializer_id, "elements": elements}
    return encode_operator_file(states)

"""Bytes for stored state values: what the spill tier and checkpoints write per key.

The heap keeps a state's value as the Python object the handle stored: the user value, a list,
a dict, and with TTL ``(value, timestamp)`` pairs in place of values. A codec turns exactly that
stored form into bytes and back, using the descriptor's serializers for the user's parts, so a
key's value can be written, merged and read without knowing anything else about the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
from statetier.backend.descriptors import MapStateDescriptor, StateDescriptor, StateKind
from statetier.backend.serializers import (
    PackMany,
    SerializationError,
    Serializer,
    bulk_dumps,
    pack_many,
)
from statetier.backend.ttl import StateTtlConfig

_packer = msgpack.Packer(use_bin_type=True)


def _pack(value: Any) -> bytes:
    data: bytes = _packer.pack(value)
    return data


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=True, raw=False)


class StateCodec:
    """Encodes and decodes the stored value of one key of one state."""

    def __init__(self, descriptor: StateDescriptor) -> None:
        self.kind = descriptor.kind
        self.ttl = descriptor.ttl is not None
        self._values: Serializer = descriptor.serializer
        self._user_keys: Serializer | None = (
            descriptor.key_serializer if isinstance(descriptor, MapStateDescriptor) else None
        )

    def encode(self, stored: Any) -> bytes:
        dumps = self._values.dumps
        if self.kind is StateKind.LIST:
            if self.ttl:
                return _pack([[ts, dumps(v)] for v, ts in stored])
            return _pack([dumps(v) for v in stored])
        if self.kind is StateKind.MAP:
            assert self._user_keys is not None
            kdumps = self._user_keys.dumps
            if self.ttl:
                return _pack([[kdumps(k), ts, dumps(v)] for k, (v, ts) in stored.items()])
            return _pack([[kdumps(k), dumps(v)] for k, v in stored.items()])
        if self.ttl:
            value, ts = stored
            return _pack([ts, dumps(value)])
        encoded: bytes = dumps(stored)
        return encoded

    def bulk_encoder(self) -> Callable[[Any], bytes]:
        """:meth:`encode` for many values in a row on one thread: a plain value (no list, map
        or TTL) is the serializer's bytes, so its bulk ``dumps`` does it without the dispatch.
        Errors may come out raw; :meth:`encode` of the value gives the message."""
        if self.kind in (StateKind.LIST, StateKind.MAP) or self.ttl:
            return self.encode
        return bulk_dumps(self._values)

    def bulk_packer(self) -> PackMany | None:
        """The serializer's ``pack_many`` for plain values (the bytes of :meth:`encode` of
        each, in one call), None for lists, maps and TTL values."""
        if self.kind in (StateKind.LIST, StateKind.MAP) or self.ttl:
            return None
        return pack_many(self._values)

    def decode(self, data: bytes) -> Any:
        loads = self._values.loads
        try:
            if self.kind is StateKind.LIST:
                if self.ttl:
                    return [(loads(v), ts) for ts, v in _unpack(data)]
                return [loads(v) for v in _unpack(data)]
            if self.kind is StateKind.MAP:
                assert self._user_keys is not None
                kloads = self._user_keys.loads
                if self.ttl:
                    return {kloads(k): (loads(v), ts) for k, ts, v in _unpack(data)}
                return {kloads(k): loads(v) for k, v in _unpack(data)}
            if self.ttl:
                ts, value = _unpack(data)
                return (loads(value), ts)
            return loads(data)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise SerializationError(
                f"cannot decode a stored {self.kind.value} value: {exc}"
            ) from exc


def expired_purger(
    kind: StateKind, ttl: StateTtlConfig, now_ms: int
) -> Callable[[bytes], bytes | None]:
    """What compaction's TTL cleanup does to one stored value's bytes (a TTL state's, as
    :meth:`StateCodec.encode` lays them out): the same bytes when nothing in it has expired at
    ``now_ms``, the bytes of what is left when some list elements or map entries have (each
    expires on its own, as on the heap), None when nothing is left. Only timestamps are read,
    never the user's serializers, so a compaction worker needs none of the job's code."""
    expired = ttl.expired

    def value(data: bytes) -> bytes | None:
        return None if expired(_unpack(data)[0], now_ms) else data

    def elements(data: bytes, at: int) -> bytes | None:
        items = _unpack(data)
        live = [item for item in items if not expired(item[at], now_ms)]
        if len(live) == len(items):
            return data
        return _pack(live) if live else None

    if kind is StateKind.LIST:
        return lambda data: elements(data, 0)  # [[timestamp, value], ...]
    if kind is StateKind.MAP:
        return lambda data: elements(data, 1)  # [[user key, timestamp, value], ...]
    return value  # [timestamp, value]

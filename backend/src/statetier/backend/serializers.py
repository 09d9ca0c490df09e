"""Serializers turn keys and state values into bytes for the spill tier and checkpoints.

A serializer is a small protocol (``id``, ``dumps``, ``loads``); implementations are found by id
through a registry, so a checkpoint records which serializer wrote it and a restore can refuse a
mismatch instead of misreading bytes. Heap state is never serialized: values stay Python objects
until a key group is spilled or snapshotted.

The default, :class:`MsgpackSerializer`, is fast for the common Python types and round-trips them
exactly (tuples stay tuples, sets stay sets). Anything else is refused with the type's name;
:class:`PickleSerializer` takes any picklable object at a cost in speed and portability.
"""

from __future__ import annotations

import itertools
import pickle
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import msgpack
import numpy as np

__all__ = [
    "MsgpackSerializer",
    "PickleSerializer",
    "RawBytesSerializer",
    "Serializer",
    "SerializationError",
    "PackMany",
    "bulk_dumps",
    "first_unwritable",
    "short_repr",
    "unwritable_reason",
    "pack_many",
    "register_serializer",
    "serializer_by_id",
]


class SerializationError(TypeError):
    """A value cannot be written (unsupported type) or read (malformed bytes)."""


# what the default serializer writes as it is, and the containers it writes element by element
_SCALARS = frozenset({str, int, float, bool, bytes, bytearray, memoryview, type(None)})
_SEQUENCES = frozenset({list, tuple, set, frozenset})
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1  # int64 and uint64
WRITABLE = object()  # first_unwritable's answer for a value it can write whole


def first_unwritable(value: Any) -> Any:
    """The first part of ``value`` (itself or a nested element, key or value) that the default
    serializer cannot write, or :data:`WRITABLE`: what a write checks before it stores a value
    whose bytes are only made later (spill, checkpoint). It runs on every write of a container
    to state, so a container's scalars are looked at in its own loop, with no call each."""
    kind = type(value)
    if kind is int:
        return WRITABLE if _INT_MIN <= value <= _INT_MAX else value
    if kind in _SCALARS:
        return WRITABLE
    if kind in _SEQUENCES:
        parts: Any = value
    elif kind is dict:
        parts = itertools.chain.from_iterable(value.items())
    else:
        return value
    for part in parts:
        kind = type(part)
        if kind is int:
            if not _INT_MIN <= part <= _INT_MAX:
                return part
        elif kind not in _SCALARS:
            bad = first_unwritable(part)
            if bad is not WRITABLE:
                return bad
    return WRITABLE


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unwritable_reason(part: Any) -> str:
    """Why the default serializer cannot write ``part`` (from :func:`first_unwritable`), and
    what to do, in one sentence."""
    shown = short_repr(part)
    if type(part) is int:
        return (
            f"the int {shown} is outside the 64-bit range the default serializer writes "
            "(-2**63 to 2**64-1); store it as a str (str(n)) or declare the state with "
            "serializer=PickleSerializer()"
        )
    return (
        f"the default serializer cannot write {type(part).__name__} values ({shown}); store "
        "None, bool, int, float, str, bytes, or a list/tuple/dict/set of those (a datetime as "
        ".timestamp() or .isoformat()), or declare the state with serializer=PickleSerializer()"
    )


@runtime_checkable
class Serializer(Protocol):
    """Turns one value into bytes and back. ``id`` names the format in checkpoints."""

    @property
    def id(self) -> str: ...

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


# msgpack's header bytes of a str by its UTF-8 length (fixstr, str8, str16, str32) and the size
# of an int (fixint, int8/uint8, 16, 32, 64 bits) by its value, as searchsorted tables: the
# limits are the last length or value of each size
_STR_LIMITS = np.array([31, 255, 65535])
_STR_HEADS = np.array([1, 2, 3, 5])
_INT_LIMITS = np.array([-(1 << 31) - 1, -32769, -129, -33, 127, 255, 65535, (1 << 32) - 1])
_INT_SIZES = np.array([9, 5, 3, 2, 1, 2, 3, 5, 9])

_EXT_TUPLE = 1
_EXT_SET = 2
_EXT_FROZENSET = 3


class MsgpackSerializer:
    """None, bool, int (64-bit), float, str, bytes, and list/tuple/dict/set/frozenset of those."""

    id = "msgpack"

    def __init__(self) -> None:
        # A Packer keeps a buffer between calls, so each thread gets its own: checkpoint
        # uploads, the spill tier and the state host serialize from several threads.
        self._local = threading.local()

    @property
    def _packer(self) -> Any:
        packer = getattr(self._local, "packer", None)
        if packer is None:
            packer = msgpack.Packer(default=self._pack_ext, strict_types=True, use_bin_type=True)
            self._local.packer = packer
        return packer

    def _pack_ext(self, value: Any) -> msgpack.ExtType:
        # A nested value needs its own Packer: this runs inside self._packer.pack(), and a
        # Packer is not reentrant (the inner pack() would hand back and reset the outer buffer).
        if isinstance(value, tuple):
            return msgpack.ExtType(_EXT_TUPLE, self._pack_nested(list(value)))
        if isinstance(value, frozenset):
            return msgpack.ExtType(_EXT_FROZENSET, self._pack_nested(_ordered(value)))
        if isinstance(value, set):
            return msgpack.ExtType(_EXT_SET, self._pack_nested(_ordered(value)))
        raise SerializationError(unwritable_reason(value))

    def _pack_nested(self, items: list[Any]) -> bytes:
        packed: bytes = msgpack.packb(
            items, default=self._pack_ext, strict_types=True, use_bin_type=True
        )
        return packed

    @staticmethod
    def _unpack_ext(code: int, data: bytes) -> Any:
        items = msgpack.unpackb(data, ext_hook=MsgpackSerializer._unpack_ext, strict_map_key=False)
        if code == _EXT_TUPLE:
            return tuple(items)
        if code == _EXT_SET:
            return set(items)
        if code == _EXT_FROZENSET:
            return frozenset(items)
        raise SerializationError(f"unknown msgpack extension type {code}")

    def bulk_dumps(self) -> Callable[[Any], bytes]:
        """This thread's packer, for a loop over many values: no per-call lookups, and errors
        come out raw (``TypeError``, ``OverflowError``, ``ValueError``), so a caller that gets
        one calls :meth:`dumps` on the value for the message that names the problem."""
        pack: Callable[[Any], bytes] = self._packer.pack
        return pack

    def pack_many(self, items: list[Any]) -> tuple[np.ndarray, memoryview] | None:
        """``items`` written end to end in one call, and each one's length: the bytes of
        ``dumps`` of each, joined, without a bytes object per item (a snapshot's keys and values;
        half the time of one call per item and a join). For a list of ``str`` or of ``int``
        (as its first item says); None for any other, which the caller then writes item by item.

        The lengths are worked out from the items (a str's characters, an int's magnitude), and
        checked against what the packer wrote. No item is shorter than worked out (a str is at
        least as long in UTF-8 as in characters; any other sized item, a float or a bool in an
        int's place, packs to at least as many bytes), so a total that matches means every
        length does; else None."""
        count = len(items)
        try:
            if count and type(items[0]) is str:
                lengths = np.fromiter(map(len, items), np.int64, count)
                lengths += _STR_HEADS[np.searchsorted(_STR_LIMITS, lengths)]
            elif count and type(items[0]) is int:
                lengths = _INT_SIZES[np.searchsorted(_INT_LIMITS, np.fromiter(items, np.int64))]
            else:
                return None
        except (TypeError, ValueError, OverflowError):  # an item of another kind, a big int
            return None
        packed: bytes = self._packer.pack(items)
        head = 1 if count < 16 else 3 if count < 1 << 16 else 5  # the array's header
        if int(lengths.sum()) != len(packed) - head:
            return None
        return lengths, memoryview(packed)[head:]

    def direct_codec(self) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
        """``(encode, decode)`` writing and reading this serializer's bytes without its per-call
        wrapper (a property and a thread-local lookup per write: a fifth of a spilled
        read-modify-write of a counter), for one thread's per-record path.

        ``encode`` is a packer of its own with this serializer's settings, so it writes the same
        bytes; it raises what :meth:`dumps` turns into SerializationError, so its caller wraps
        the error itself. It must stay on one thread at a time (a Packer keeps a buffer).
        ``decode`` falls back to :meth:`loads` only to raise its error.
        """
        encode: Callable[[Any], bytes] = msgpack.Packer(
            default=self._pack_ext, strict_types=True, use_bin_type=True
        ).pack
        unpackb = msgpack.unpackb
        ext_hook = self._unpack_ext
        loads = self.loads

        def decode(data: bytes) -> Any:
            try:
                return unpackb(data, ext_hook=ext_hook, strict_map_key=False)
            except Exception:  # the serializer raises its own error
                return loads(data)

        return encode, decode

    def dumps(self, value: Any) -> bytes:
        try:
            data: bytes = self._packer.pack(value)
            return data
        except SerializationError:
            raise
        except (TypeError, OverflowError, ValueError) as exc:
            try:
                bad = first_unwritable(value)
            except RecursionError:
                bad = WRITABLE  # too deep to look into: msgpack's own error says so
            if bad is not WRITABLE:
                raise SerializationError(unwritable_reason(bad)) from None
            raise SerializationError(
                f"the default serializer cannot write {type(value).__name__}: {exc}"
            ) from None

    def loads(self, data: bytes) -> Any:
        try:
            return msgpack.unpackb(data, ext_hook=self._unpack_ext, strict_map_key=False)
        except (ValueError, msgpack.UnpackException) as exc:
            raise SerializationError(f"malformed msgpack data: {exc}") from None


def bulk_dumps(serializer: Serializer) -> Callable[[Any], bytes]:
    """A ``dumps`` for writing many values in a row on one thread (checkpoints, spills): the
    serializer's own fast path if it has one (see :meth:`MsgpackSerializer.bulk_dumps`), else
    its ``dumps``."""
    fast = getattr(serializer, "bulk_dumps", None)
    return fast() if callable(fast) else serializer.dumps


# a serializer's pack_many (see MsgpackSerializer.pack_many)
PackMany = Callable[[list[Any]], "tuple[np.ndarray, memoryview] | None"]


def pack_many(serializer: Serializer) -> PackMany | None:
    """The serializer's way to write many items in one call, if it has one (see
    :meth:`MsgpackSerializer.pack_many`), else None."""
    many = getattr(serializer, "pack_many", None)
    return many if callable(many) else None


def _ordered(items: set[Any] | frozenset[Any]) -> list[Any]:
    """A set's elements in a stable order where they can be sorted: a set of strings iterates in
    an order that depends on PYTHONHASHSEED, and a retried task must write the same bytes."""
    try:
        return sorted(items)
    except TypeError:
        return list(items)


class PickleSerializer:
    """Any picklable value. Slower, and only for trusted checkpoints."""

    id = "pickle"

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class RawBytesSerializer:
    """Values that already are bytes, stored as they are."""

    id = "bytes"

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise SerializationError(f"RawBytesSerializer takes bytes, got {type(value).__name__}")
        return bytes(value)

    def loads(self, data: bytes) -> Any:
        return bytes(data)


_REGISTRY: dict[str, Callable[[], Serializer]] = {
    MsgpackSerializer.id: MsgpackSerializer,
    PickleSerializer.id: PickleSerializer,
    RawBytesSerializer.id: RawBytesSerializer,
}


def register_serializer(serializer_id: str, factory: Callable[[], Serializer]) -> None:
    """Make a custom serializer known, so checkpoints written with it can be read back."""
    _REGISTRY[serializer_id] = factory


def serializer_by_id(serializer_id: str) -> Serializer:
    """A new instance of the serializer registered as ``serializer_id``."""
    try:
        return _REGISTRY[serializer_id]()
    except KeyError:
        raise SerializationError(
            f"unknown serializer {serializer_id!r}; known: {', '.join(sorted(_REGISTRY))} "
            "(register custom ones with register_serializer)"
        ) from None


DEFAULT_SERIALIZER = MsgpackSerializer()

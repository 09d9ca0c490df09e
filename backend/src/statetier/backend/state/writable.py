"""Refuse a value at the write when the state's serializer could not write it later.

Heap state holds Python objects; their bytes are made only when a key group spills or is
checkpointed. A value the serializer cannot write (a ``datetime`` under the default serializer)
would be taken by ``update()`` and fail the epoch at commit, after the sink wrote, naming neither
the state nor the key. The handles therefore check what they store, where the user wrote it.

The check must cost nothing on the per-record path: a handle looks at the value's type only, and a
type in :data:`PLAIN` (what most state holds) needs nothing more. A value state's list or dict (a
record, rewritten per record) is looked at by the default serializer's packer, called by the handle
itself (:func:`value_checks`). Any other value is looked at in full here. An int of a plain type may
still be too large for 64 bits: it is found when its bytes are made, and the snapshot's error names
the state and the key too (snapshot.serialize). Only the default serializer and typed ones are
checked here (a typed value is checked against its declared type, field by field); what another
serializer (pickle, a custom one) refuses is named at the snapshot, since finding out would mean
serializing every value twice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from statetier.backend.serializers import (
    WRITABLE,
    MsgpackSerializer,
    SerializationError,
    Serializer,
    first_unwritable,
    short_repr,
    unwritable_reason,
)
from statetier.backend.state.context import KeyContext
from statetier.backend.typed.serializer import TypedSerializer

__all__ = [
    "PLAIN",
    "UnwritableValueError",
    "WriteCheck",
    "accept",
    "check_each",
    "unwritable_message",
    "value_checks",
    "write_check",
]

# the types a handle stores without a closer look (int: its range is checked at the snapshot)
PLAIN = frozenset({str, int, float, bool, bytes})

CURRENT = object()  # a check's key: the context's current key


class WriteCheck(Protocol):
    """Raises :class:`UnwritableValueError` for a value the state cannot store, naming ``key``
    (by default the current key)."""

    def __call__(self, value: Any, key: Any = CURRENT) -> None: ...


class UnwritableValueError(SerializationError):
    """A value written to a state is one its serializer cannot write."""


def accept(value: Any, key: Any = CURRENT) -> None:
    """The check of a state whose serializer is not the default one: nothing to look at."""


def unwritable_message(state: str, key: Any, what: str, reason: str) -> str:
    """The one-line error of a ``what`` (``"value"``, ``"map key"``) that cannot be written:
    the state, the key, the reason and the fix."""
    where = "" if what == "value" else f" ({what})"
    return f"state {state!r}, key {short_repr(key)}{where}: {reason}"


def write_check(serializer: Serializer, state: str, what: str, ctx: KeyContext) -> WriteCheck:
    """The check a handle of ``state`` calls on a written ``what`` (``"value"``, ``"map key"``)
    whose type is not in :data:`PLAIN`: it raises :class:`UnwritableValueError` naming the state
    and the current key when the default serializer cannot write it."""
    if isinstance(serializer, TypedSerializer) and serializer.schema is not None:
        return _typed_check(serializer, state, what, ctx)
    if not isinstance(serializer, MsgpackSerializer):
        return accept
    return _packing_check(serializer.direct_codec()[0], state, what, ctx)


def value_checks(
    serializer: Serializer, state: str, ctx: KeyContext
) -> tuple[WriteCheck, Callable[[Any], object]]:
    """A value handle's two checks: :func:`write_check`'s for a written value, and what the
    handle calls first on a written list or dict (a record: a session's [start, end, clicks]).
    For the default serializer that is the check's own packer, called by the handle directly;
    for any other serializer, the check itself. What the packer refuses the handle gives to
    the check, which names the state, the key and the reason.

    The packer writes what a snapshot will write, so it accepts exactly what the check does;
    called directly, it spares the handle a Python call per write (a session's click: 25,063
    instructions to 24,406)."""
    if isinstance(serializer, MsgpackSerializer):
        encode = serializer.direct_codec()[0]
        return _packing_check(encode, state, "value", ctx), encode
    check = write_check(serializer, state, "value", ctx)
    return check, check


def _packing_check(
    encode: Callable[[Any], bytes], state: str, what: str, ctx: KeyContext
) -> WriteCheck:
    """The default serializer's check, around ``encode``, the serializer's own packer (one per
    handle, used on its thread as the handle is): a list or dict it packs is one the snapshot
    will write, found in C. A session's [start, end, clicks] takes 150 ns this way, 250-450 ns
    in a Python loop over its scalars."""

    def check(value: Any, key: Any = CURRENT) -> None:
        kind = type(value)
        if kind is list or kind is dict:
            try:
                encode(value)
                return
            except Exception:  # refused: first_unwritable finds what and why
                pass
        elif kind is tuple:  # packed through a Python hook: its scalars are looked at here
            for part in value:
                kind = type(part)
                if kind is int:
                    if not -0x8000_0000_0000_0000 <= part <= 0xFFFF_FFFF_FFFF_FFFF:
                        break
                elif kind is not str and kind is not float and kind is not bool:
                    break
            else:
                return
        try:
            bad = first_unwritable(value)
        except RecursionError:  # nested past Python's limit: the snapshot names it
            return
        if bad is not WRITABLE:
            named = ctx.key if key is CURRENT else key
            reason = unwritable_reason(bad)
            raise UnwritableValueError(unwritable_message(state, named, what, reason))

    return check


def _typed_check(serializer: TypedSerializer, state: str, what: str, ctx: KeyContext) -> WriteCheck:
    """A typed state's check: the value against its declared type, so that a value of the
    wrong shape is refused where it is written, naming the field, not at the next snapshot."""

    def check(value: Any, key: Any = CURRENT) -> None:
        try:
            serializer.check(value)
        except SerializationError as exc:
            named = ctx.key if key is CURRENT else key
            raise UnwritableValueError(unwritable_message(state, named, what, str(exc))) from None

    return check


def check_each(check: WriteCheck, values: list[Any], keys: list[Any]) -> None:
    """Check the values of a bulk write (``keys[i]`` writes ``values[i]``), naming the key of
    the first that cannot be written: a C-level pass over the types when all are plain."""
    if check is accept or PLAIN.issuperset(map(type, values)):
        return
    for key, value in zip(keys, values, strict=True):
        if value is not None and type(value) not in PLAIN:
            check(value, key)

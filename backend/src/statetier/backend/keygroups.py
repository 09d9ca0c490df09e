"""Key groups: the unit in which keyed state is partitioned, spilled, checkpointed and moved.

As in Flink, every key maps to one of ``max_parallelism`` key groups by a stable hash, and each
of ``parallelism`` instances of a function (Flink's operator subtasks) owns a contiguous range of
key groups. Rescaling never rehashes a key; it only hands whole key groups to other owners.

The hash is 64-bit xxHash (seed 42) over the key's canonical bytes, chained over the fields of a
tuple key. It is exactly what Spark SQL's ``xxhash64(col, ...)`` computes, so the Spark pipeline
can put every record in its key group without Python::

    pmod(xxhash64(word), 128)           -- Spark SQL
    assign_to_key_group("word", 128)    -- Python

Canonical bytes per type (the Spark column type that hashes the same in brackets):
``str`` UTF-8 (StringType), ``bytes`` as is (BinaryType), ``int`` 8 bytes little-endian
(LongType: cast integer keys to bigint), ``None`` leaves the seed unchanged (NULL; only as a
field of a tuple key: keyed state refuses a bare ``None`` key, see :func:`check_key`). Booleans are
refused: ``True == 1`` in Python but Spark hashes them differently. Python's built-in ``hash``
is never used: it changes with PYTHONHASHSEED.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator, Sequence

import xxhash

__all__ = [
    "DEFAULT_LOWER_BOUND_MAX_PARALLELISM",
    "SEED",
    "UPPER_BOUND_MAX_PARALLELISM",
    "KeyGroupRange",
    "NullKeyError",
    "assign_str_to_key_group",
    "assign_to_key_group",
    "check_key",
    "compute_default_max_parallelism",
    "key_group_range_for_instance",
    "key_hash",
    "instance_for_key_group",
    "raise_if_unhashable",
    "spark_key_group_expr",
]

SEED = 42
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 1 << 7
UPPER_BOUND_MAX_PARALLELISM = 1 << 15

_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1
_LONG = struct.Struct("<q")
_xxh64 = xxhash.xxh64_intdigest


class NullKeyError(ValueError):
    """A record's key is None: keyed state needs a key (Flink refuses a null key too)."""


def check_key(key: object) -> None:
    """Refuse a ``None`` key, as Flink does ("Assigned key must not be null!").

    A None field inside a tuple key is fine (it hashes like Spark's NULL); a bare None would put
    every keyless record into one key group and share one state among them by accident.
    """
    if key is None:
        raise NullKeyError(
            "a record's key is None: keyed state needs a key (filter out or replace null keys "
            "before the keyed function, e.g. with coalesce)"
        )


def unhashable_key_error(key: object) -> TypeError:
    """The error for a record's key that cannot be a dict key (a list, a dict, a set): what it
    is and how to make it one, instead of Python's ``unhashable type: 'list'``."""
    shown = repr(key) if len(repr(key)) <= 40 else repr(key)[:37] + "..."
    return TypeError(
        f"a record's key is a {type(key).__name__} ({shown}), and keys must be hashable: use "
        "a str, bytes, int, or a tuple of those (tuple(key) for a list)"
    )


def raise_if_unhashable(key: object) -> None:
    """Raise :func:`unhashable_key_error` if ``key`` cannot be a dict key: for a loop over
    records that catches a TypeError once, around the loop, and asks whether the record's key
    or the function raised it. Only whether ``hash`` raises is used, never its value (which
    Python randomizes per process)."""
    try:
        hash(key)
    except TypeError:
        raise unhashable_key_error(key) from None


def _hash_field(field: object, seed: int) -> int:
    """One field's contribution; ``seed`` and the result are unsigned 64-bit."""
    if isinstance(field, str):
        return _xxh64(field.encode("utf-8"), seed)
    if isinstance(field, bool):  # before int: bool is an int subclass
        # True == 1 in Python, so a dict cannot tell them apart, while Spark hashes booleans as
        # 4 bytes and longs as 8: refuse rather than risk one key in two key groups.
        raise TypeError("cannot key by bool (True == 1 in Python); use an int or a str")
    if isinstance(field, int):
        if not -_I64_MAX - 1 <= field <= _I64_MAX:
            raise TypeError(f"integer key {field} does not fit in 64 bits (Spark LongType)")
        return _xxh64(_LONG.pack(field), seed)
    if isinstance(field, (bytes, bytearray, memoryview)):
        return _xxh64(bytes(field), seed)
    if field is None:
        return seed
    raise TypeError(
        f"cannot key by {type(field).__name__}: keys are str, bytes, int, None "
        "or tuples of those (these hash the same in Spark SQL and Python)"
    )


def key_hash(key: object) -> int:
    """Signed 64-bit hash of ``key``; equals Spark SQL ``xxhash64(...)`` over the same fields."""
    if isinstance(key, str):  # the common case, without the dispatch
        h = _xxh64(key.encode("utf-8"), SEED)
    elif isinstance(key, tuple):
        h = SEED
        for field in key:
            h = _hash_field(field, h)
    else:
        h = _hash_field(key, SEED)
    return h - _U64 if h > _I64_MAX else h


def assign_to_key_group(key: object, max_parallelism: int) -> int:
    """The key group of ``key``: ``pmod(xxhash64(key), max_parallelism)``."""
    return key_hash(key) % max_parallelism


def assign_str_to_key_group(key: str, max_parallelism: int) -> int:
    """The key group of a ``str`` key, without :func:`assign_to_key_group`'s type dispatch.

    The backend's path for a key it has not seen yet: most keys are strings, and this one call
    replaces two (the hash is the same, so the key group is).
    """
    h = _xxh64(key.encode(), SEED)  # UTF-8, strict: the default, without parsing arguments
    return (h if h <= _I64_MAX else h - _U64) % max_parallelism


def compute_default_max_parallelism(parallelism: int) -> int:
    """Flink's default: 1.5x the parallelism rounded up to a power of two, in [128, 32768].

    A parallelism above 32768 is refused rather than given a max parallelism below it: Flink
    checks ``parallelism <= max parallelism <= 32768`` for every operator, since an instance
    without a key group of its own cannot hold keyed state.
    """
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, got {parallelism}")
    if parallelism > UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(
            f"parallelism {parallelism} is above the largest max parallelism "
            f"({UPPER_BOUND_MAX_PARALLELISM}): every instance needs at least one key group"
        )
    wanted = parallelism + parallelism // 2
    rounded = 1 << max(wanted - 1, 0).bit_length()
    return min(max(rounded, DEFAULT_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)


def check_parallelism(max_parallelism: int, parallelism: int) -> None:
    """Raise ValueError unless ``1 <= parallelism <= max_parallelism <= 32768``."""
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(
            f"max parallelism must be in 1..{UPPER_BOUND_MAX_PARALLELISM}, got {max_parallelism}"
        )
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism must be in 1..max parallelism ({max_parallelism}), got {parallelism}"
        )


def instance_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The index of the instance that owns ``key_group``: ``key_group * parallelism //
    max_parallelism`` (Flink's ``computeOperatorIndexForKeyGroup``)."""
    return key_group * parallelism // max_parallelism


@dataclasses.dataclass(frozen=True, order=True)
class KeyGroupRange:
    """An inclusive range of key groups ``[start, end]``; empty when ``end < start``."""

    start: int
    end: int

    @classmethod
    def of(cls, max_parallelism: int) -> KeyGroupRange:
        """All key groups."""
        return cls(0, max_parallelism - 1)

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        return KeyGroupRange(max(self.start, other.start), min(self.end, other.end))

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"

    @classmethod
    def parse(cls, text: str) -> KeyGroupRange:
        """Inverse of ``str()``: ``"0-31"``."""
        start, _, end = text.partition("-")
        return cls(int(start), int(end))


def key_group_range_for_instance(
    max_parallelism: int, parallelism: int, index: int
) -> KeyGroupRange:
    """Key groups owned by instance ``index`` of ``parallelism`` (Flink's
    ``computeKeyGroupRangeForOperatorIndex``)."""
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= index < parallelism:
        raise ValueError(f"instance index must be in 0..{parallelism - 1}, got {index}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism + parallelism - 1) // parallelism - 1
    return KeyGroupRange(start, end)


def spark_key_group_expr(columns: Sequence[str], max_parallelism: int) -> str:
    """The Spark SQL expression that computes the same key group as :func:`assign_to_key_group`.

    Integer key columns must be LongType (``CAST(c AS BIGINT)``): Spark hashes IntegerType as
    4 bytes, Python ints are hashed as 8.
    """
    if not columns:
        raise ValueError("at least one key column is needed")
    quoted = ", ".join(f"`{c.replace('`', '``')}`" for c in columns)
    return f"pmod(xxhash64({quoted}), {max_parallelism})"

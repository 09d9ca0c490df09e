"""Snapshot encoding: the bulk encoders write the same bytes as the checked ones, and a value
the serializer cannot write still fails with the message that names its type."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest
from statetier.backend import ValueStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.serializers import DEFAULT_SERIALIZER, SerializationError
from statetier.backend.snapshot import serialize
from statetier.backend.snapshot.columns import Packed
from statetier.backend.snapshot.format import BASE, DELTA, encode_data_file

P = 16


@dataclasses.dataclass
class Point:
    x: int
    y: int


def _backend(values: dict[str, object]) -> KeyedStateBackend:
    backend = KeyedStateBackend(KeyGroupRange.of(P), P)
    state = backend.get_state(ValueStateDescriptor[object]("v"))
    for key, value in values.items():
        backend.set_current_key(key)
        state.update(value)
    return backend


# Keys and values whose columns are written in one call (str and int: pack_many) or item by item
# (anything else, a non-ASCII str, an int past int64), and mixes of both in one column
KEYS: dict[str, Callable[[int], Any]] = {
    "ascii": lambda i: f"k{i}",
    "some non-ascii": lambda i: f"clé{i}" if i % 9 == 0 else f"k{i}",
    "ints": lambda i: i * 7919 - 10**6,
}
VALUES: dict[str, Callable[[int], Any]] = {
    "containers": lambda i: [i, (i, "x"), {"n": i * 1.5}],
    "ints of every size": lambda i: (-1) ** i * 7 ** (i % 23),
    "uint64, floats, bools": lambda i: 2**64 - 1 - i if i % 7 == 0 else i * 0.5 if i % 3 else i,
    "strings": lambda i: "é" * (i % 40) if i % 5 == 0 else "s" * i,
}


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("keys", list(KEYS))
@pytest.mark.parametrize("values", list(VALUES))
def test_bulk_encoding_writes_what_the_checked_encoders_write(
    delta: bool, codec: str, keys: str, values: str
) -> None:
    key_of, value_of = KEYS[keys], VALUES[values]
    backend = _backend({key_of(i): value_of(i) for i in range(300)})
    table = backend.tables["v"]
    if delta:  # and a tombstone in every other key group
        backend.drain_touched_keys()
        for i in range(0, 300, 7):
            backend.set_current_key(key_of(i))
            backend.get_state(ValueStateDescriptor[object]("v")).update(value_of(i + 1))
        backend.set_current_key(key_of(3))
        backend.get_state(ValueStateDescriptor[object]("v")).clear()
    touched = backend.drain_touched() if delta else None
    groups = touched.by_group if touched else {kg: list(table.map_for(kg)) for kg in range(P)}

    def encoded(kg: int, key: Any) -> bytes | None:
        stored = table.map_for(kg)
        return table.codec.encode(stored[key]) if key in stored else None

    checked = [  # entry by entry through the checked encoders, as (key, value) pairs
        (kg, [(DEFAULT_SERIALIZER.dumps(k), encoded(kg, k)) for k in keys])
        for kg, keys in sorted(groups.items())
    ]
    header = serialize._header("v", backend.key_groups, 1, DELTA if delta else BASE, P, codec)
    expected = encode_data_file(header, checked)
    assert serialize.encode_table(backend, table, 1, touched, codec) == expected


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"p": Point(1, 2)}, "cannot write Point values"),
        ([2**64], "the int 18446744073709551616 is outside the 64-bit range"),
        # msgpack's own error, raw from the bulk packer, gets the checked message too
        (_nested(3000), "cannot write list: recursion limit"),
    ],
)
def test_an_unwritable_value_is_named_when_snapshotting(value: object, named: str) -> None:
    """A value changed in place after its write (the write checks what it is given, see
    test_user_errors) is named with its state and key when the snapshot cannot write it."""
    backend = _backend({"ok": 1, "bad": [0]})
    backend.set_current_key("bad")
    backend.get_state(ValueStateDescriptor[object]("v")).value()[0] = value  # type: ignore[index]
    with pytest.raises(SerializationError, match=rf"^state 'v', key 'bad': .*{re.escape(named)}"):
        serialize.encode_table(backend, backend.tables["v"], 1, None, "none")


EDGE_INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1]
EDGE_INTS += [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]


@pytest.mark.parametrize(
    "items",
    [
        EDGE_INTS,
        [i * 37 - 1000 for i in range(70_000)],  # an array header of 5 bytes
        ["", "a", "x" * 31, "x" * 32, "y" * 255, "y" * 256, "z" * 65535, "z" * 65536],
        ["a"] * 15 + ["b"],  # 16 items: the array header grows
        ["a", [1, 2, 3], "c"],  # a sized item exactly as long as a str's length says
    ],
    ids=["int edges", "70k ints", "str edges", "16 strs", "mixed sizes"],
)
def test_pack_many_writes_each_items_bytes_end_to_end(items: list[Any]) -> None:
    packed = DEFAULT_SERIALIZER.pack_many(items)
    assert packed is not None
    lengths, data = packed
    expected = [DEFAULT_SERIALIZER.dumps(item) for item in items]
    assert lengths.tolist() == list(map(len, expected))
    assert bytes(data) == b"".join(expected)
    assert Packed(lengths, data).to_list() == expected


@pytest.mark.parametrize(
    "items",
    [[], ["clé", "a"], [2**64 - 1], [1, 2.5], [1, "a"], ["a", 1], ["a", None], [None], [1.0]],
)
def test_pack_many_declines_what_it_cannot_size(items: list[Any]) -> None:
    """Non-ASCII text, ints past int64, floats and mixes are written item by item."""
    assert DEFAULT_SERIALIZER.pack_many(items) is None

"""Snapshot encoding: the bulk encoders write the same bytes as the checked ones, and a value
the serializer cannot write still fails with the message that names its type."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from statetier.backend import ValueStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.serializers import DEFAULT_SERIALIZER, SerializationError
from statetier.backend.snapshot import serialize
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


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("delta", [False, True])
def test_bulk_encoding_writes_what_the_checked_encoders_write(delta: bool, codec: str) -> None:
    backend = _backend({f"k{i}": [i, (i, "x"), {"n": i * 1.5}] for i in range(300)})
    table = backend.tables["v"]
    touched: dict[int, list[Any]] | None = backend.drain_touched_keys() if delta else None
    groups = touched if touched is not None else {kg: list(table.map_for(kg)) for kg in range(P)}
    checked = [  # entry by entry through the checked encoders, as (key, value) pairs
        (
            kg,
            [(DEFAULT_SERIALIZER.dumps(k), table.codec.encode(table.map_for(kg)[k])) for k in keys],
        )
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
        ({"p": Point(1, 2)}, "cannot write Point"),
        ([2**64], "cannot write int"),
        # msgpack's own error, raw from the bulk packer, gets the checked message too
        (_nested(3000), "cannot write list: recursion limit"),
    ],
)
def test_an_unwritable_value_is_named_when_snapshotting(value: object, named: str) -> None:
    backend = _backend({"ok": 1, "bad": value})
    with pytest.raises(SerializationError, match=named):
        serialize.encode_table(backend, backend.tables["v"], 1, None, "none")

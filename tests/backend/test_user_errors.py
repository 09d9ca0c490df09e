"""A user's mistake gets a one- or two-line error naming what is wrong and the fix, raised where
the mistake is made (issue 45): each case runs the real code path and checks the message."""

from __future__ import annotations

import datetime
import decimal
import enum
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from statetier.backend import (
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    MsgpackSerializer,
    PickleSerializer,
    ReducingStateDescriptor,
    RuntimeContext,
    SerializationError,
    Serializer,
    StateDescriptor,
    ValueStateDescriptor,
)
from statetier.backend.config import ConfigError, load_config
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.serializers import DEFAULT_SERIALIZER, WRITABLE, first_unwritable
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.state.writable import UnwritableValueError
from statetier.tools.wordcount import WordCount


def one_or_two_lines(message: str) -> str:
    """``message``, checked to be an error a user reads at a glance."""
    assert 0 < len(message.splitlines()) <= 2, message
    return message


@pytest.mark.parametrize("chain", ["file://{root}/a::file:{root}/b", "memory://x::file://{root}"])
def test_a_chained_checkpoint_uri_is_refused_before_anything_is_written(
    tmp_path: Path, chain: str
) -> None:
    uri = chain.format(root=tmp_path)
    with pytest.raises(ConfigError) as info:
        LocalRunner(WordCount, 1, checkpoint_uri=uri)
    message = one_or_two_lines(str(info.value))
    assert repr(uri) in message and "'::'" in message and "give one location" in message
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ values state cannot hold


class Stores(KeyedProcessFunction[Any, Any, Any]):
    """Writes each record's value into the state of the kind the test names, through the
    public handle API a user calls."""

    def __init__(self, kind: str, serializer: Serializer = DEFAULT_SERIALIZER) -> None:
        self.kind = kind
        self.serializer = serializer

    def open(self, context: RuntimeContext) -> None:
        descriptors: dict[str, StateDescriptor] = {
            "value": ValueStateDescriptor("last", serializer=self.serializer),
            "list": ListStateDescriptor("seen", serializer=self.serializer),
            "map": MapStateDescriptor("by_kind", serializer=self.serializer),
            "map_key": MapStateDescriptor("by_kind", key_serializer=self.serializer),
            "reducing": ReducingStateDescriptor(
                "latest", reduce_function=lambda a, b: b, serializer=self.serializer
            ),
        }
        self.state: Any = context.get_state(descriptors[self.kind])

    def process(self, key: Any, value: Any, context: RuntimeContext) -> Iterable[Any]:
        if self.kind == "value":
            self.state.update(value)
        elif self.kind in ("list", "reducing"):
            self.state.add(value)
        elif self.kind == "map":
            self.state.put("k", value)
        else:
            self.state.put(value, 1)
        return ()


class Level(enum.IntEnum):
    """An int subclass: the default serializer refuses it (strict types)."""

    LOW = 1


def _runner(tmp_path: Path, kind: str, **kwargs: Any) -> LocalRunner:
    return LocalRunner(lambda: Stores(kind, **kwargs), 2, checkpoint_uri=f"file://{tmp_path}")


@pytest.mark.parametrize(
    ("kind", "value", "type_name"),
    [
        ("value", datetime.datetime(2024, 5, 1, 12, 0), "datetime"),
        ("value", (1, datetime.date(2024, 5, 1)), "date"),  # nested
        ("list", decimal.Decimal("1.5"), "Decimal"),
        ("map", {"at": datetime.datetime(2024, 5, 1)}, "datetime"),
        ("map_key", datetime.date(2024, 5, 1), "date"),
        ("reducing", [1, {2: object()}], "object"),
    ],
)
def test_a_value_the_default_serializer_cannot_write_fails_at_the_write(
    tmp_path: Path, kind: str, value: Any, type_name: str
) -> None:
    """Before: the epoch failed at commit, after the sink wrote, with a 64-line
    CorruptFileError naming neither state nor key."""
    runner = _runner(tmp_path, kind)
    try:
        runner.run_epoch([("ok", 1), ("user-7", 2)])  # epoch 1 commits
        with pytest.raises(UnwritableValueError) as info:
            runner.run_epoch([("user-7", value)])
        # raised by the handle's write, in the user's process(), not at the checkpoint
        frames = [frame.name for frame in info.traceback]
        assert "process" in frames and "checkpoint" not in frames, frames
        message = one_or_two_lines(str(info.value))
        state = {"value": "last", "list": "seen", "reducing": "latest"}.get(kind, "by_kind")
        assert message.startswith(f"state {state!r}, key 'user-7'"), message
        assert f"cannot write {type_name} values" in message
        assert "serializer=PickleSerializer()" in message
        assert ("(map key)" in message) == (kind == "map_key")
    finally:
        runner.close()
    assert SnapshotStore(f"file://{tmp_path}").epochs() == [1]  # nothing committed is lost


def test_an_int_beyond_64_bits_is_named_with_its_state_key_and_fix(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "value")
    try:
        with pytest.raises(UnwritableValueError) as info:
            runner.run_epoch([("big", 2**70), ("small", 1)])
    finally:
        runner.close()
    message = one_or_two_lines(str(info.value))
    assert message.startswith("state 'last', key 'big': the int 1180591620717411303424 is ")
    assert "outside the 64-bit range" in message and "str(n)" in message


def test_a_value_pickle_cannot_write_is_named_with_its_state_and_key(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "value", serializer=PickleSerializer())
    try:
        with pytest.raises(UnwritableValueError) as info:
            runner.run_epoch([("a", 1), ("locked", threading.Lock())])
    finally:
        runner.close()
    message = one_or_two_lines(str(info.value))
    assert message.startswith("state 'last', key 'locked': the pickle serializer cannot write")
    assert "'_thread.lock'" in message


def test_a_bulk_write_names_the_key_of_the_value_it_cannot_write() -> None:
    backend = KeyedStateBackend(KeyGroupRange.of(8), 8)
    state = backend.get_state(ValueStateDescriptor[Any]("last"))
    batch = backend.key_batch(["a", "b", "c"])
    with pytest.raises(UnwritableValueError, match=r"^state 'last', key 'b': .* datetime "):
        state.update_all(batch, [1, datetime.datetime(2024, 1, 1), None])
    state.update_all(batch, [1, (2, "x"), None])  # plain, nested plain and a clear pass


CHECKED_VALUES = [
    None,
    True,
    0,
    -(2**63),
    2**64 - 1,
    2**64,
    -(2**63) - 1,
    1.5,
    "s",
    b"b",
    bytearray(b"x"),
    [1, "a"],
    (1, (2, [3])),
    {1: {"a": (2**65,)}},
    {frozenset({1}): 2},
    {1, 2},
    datetime.date(2024, 1, 1),
    [datetime.time()],
    {"k": object()},
    decimal.Decimal(1),
    Level.LOW,
    np.int64(3),
]


@pytest.mark.parametrize("value", CHECKED_VALUES)
def test_the_write_check_agrees_with_the_serializer(value: Any) -> None:
    """first_unwritable says WRITABLE exactly when the default serializer writes the value."""
    try:
        MsgpackSerializer().dumps(value)
        writes = True
    except SerializationError:
        writes = False
    assert (first_unwritable(value) is WRITABLE) == writes


def _fields(fields: list[Any]) -> dict[str, Any]:
    return {f"f{i}": field for i, field in enumerate(fields)}


def _write_and_read(backend: KeyedStateBackend, kind: str) -> Callable[[Any], Any]:
    """Write a value through the handle of a state of ``kind`` (named 'last'), as a user
    does, and read back what was stored."""
    if kind == "value":
        value = backend.get_state(ValueStateDescriptor[Any]("last"))
        return lambda stored: (value.update(stored), value.value())[1]
    if kind == "list":
        elements = backend.get_state(ListStateDescriptor[Any]("last"))
        return lambda stored: (elements.add(stored), list(elements.get())[-1])[1]
    entries = backend.get_state(MapStateDescriptor("last"))
    return lambda stored: (entries.put("row", stored), entries.get("row"))[1]


@pytest.mark.parametrize("value", CHECKED_VALUES)
@pytest.mark.parametrize("record", [list, tuple, _fields])
@pytest.mark.parametrize("kind", ["value", "list", "map"])
def test_a_stored_record_is_refused_exactly_when_the_serializer_cannot_write_it(
    value: Any, record: Callable[[list[Any]], Any], kind: str
) -> None:
    """A list, dict or tuple written to a state (a session's [start, end, clicks], a row
    appended to a list or kept in a map) goes through the handle's first look (the packer in C
    for lists and dicts, a loop over a tuple's scalars) before first_unwritable: they must
    agree with the serializer."""
    backend = KeyedStateBackend(KeyGroupRange.of(8), 8)
    write = _write_and_read(backend, kind)
    backend.set_current_key("k")
    stored = record([1, "a", value, 2.5])
    try:
        DEFAULT_SERIALIZER.dumps(stored)
        writes = True
    except SerializationError:
        writes = False
    if writes:
        assert write(stored) == stored
    else:
        with pytest.raises(UnwritableValueError, match=r"^state 'last', key 'k': "):
            write(stored)


@pytest.mark.parametrize(
    ("source", "key", "meant"),
    [
        ("spark", "spark.statetiers.checkpoint.uri", "spark.statetier.checkpoint.uri"),
        ("spark", "spark.statetire.spill.dir", "spark.statetier.spill.dirs"),
        ("env", "STATETIERS_CHECKPOINT_URI", "STATETIER_CHECKPOINT_URI"),
    ],
)
def test_a_mistyped_prefix_is_warned_about_with_the_key_meant(
    caplog: pytest.LogCaptureFixture, source: str, key: str, meant: str
) -> None:
    """Such a key is not under statetier's prefix, so nothing refused it: the setting kept its
    default (for checkpoint.uri, the working directory) without a word."""
    given = {key: "file:///tmp/x"}
    with caplog.at_level(logging.WARNING, logger="statetier.config"):
        config = load_config(env=given if source == "env" else {}, spark_conf=given)
    assert config.source("checkpoint.uri") == "default"
    (record,) = [r for r in caplog.records if r.name == "statetier.config"]
    message = one_or_two_lines(record.getMessage())
    what = "Spark conf key" if source == "spark" else "environment variable"
    assert message.startswith(f"{what} {key} is not a statetier setting"), message
    assert f"did you mean {meant}?" in message


def test_keys_of_other_components_are_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.state.store": "x",
        "spark.statetier.spill.dirs": "/x",
    }
    with caplog.at_level(logging.WARNING, logger="statetier.config"):
        load_config(env={"STATE_DIR": "x", "PATH": "/bin"}, spark_conf=conf)
    assert [r for r in caplog.records if r.name == "statetier.config"] == []


@pytest.mark.parametrize(("key", "type_name"), [([1, 2], "list"), ({"user": 7}, "dict")])
def test_an_unhashable_key_names_its_type_and_the_fix(key: Any, type_name: str) -> None:
    runner = LocalRunner(WordCount, 2)
    with pytest.raises(TypeError) as info:
        runner.run_epoch([("fine", 1), (key, 1)])
    message = one_or_two_lines(str(info.value))
    assert message.startswith(f"a record's key is a {type_name} ({key!r})"), message
    assert "keys must be hashable" in message and "tuple(key)" in message


@pytest.mark.parametrize("counting", [False, True])  # the plain path; the spill tier's counting
@pytest.mark.parametrize(("key", "type_name"), [([1, 2], "list"), ({3}, "set")])
def test_an_unhashable_current_key_names_its_type_and_the_fix(
    key: Any, type_name: str, counting: bool
) -> None:
    backend = KeyedStateBackend(KeyGroupRange.of(8), 8)
    count = backend.get_state(ValueStateDescriptor[int]("count"))
    if counting:
        backend.count_hits([0] * 8)
    backend.set_current_key("fine")
    count.update(1)
    with pytest.raises(TypeError) as info:
        backend.set_current_key(key)
    message = one_or_two_lines(str(info.value))
    assert message.startswith(f"a record's key is a {type_name} ({key!r})"), message
    assert "keys must be hashable" in message and "tuple(key)" in message
    assert backend.context.key == "fine" and count.value() == 1  # still the last key

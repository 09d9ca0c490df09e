"""Keyed state semantics without TTL: every state type, scoping, registration, serializers."""

from __future__ import annotations

import collections
import dataclasses
import fractions
from typing import Any

import pytest
from statetier.backend import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    MsgpackSerializer,
    NoCurrentKeyError,
    NullKeyError,
    PickleSerializer,
    RawBytesSerializer,
    ReducingStateDescriptor,
    SerializationError,
    StateRegistrationError,
    StateTtlConfig,
    ValueStateDescriptor,
    register_serializer,
)
from statetier.backend.keyed_backend import KeyedStateBackend, KeyGroupOutOfRangeError
from statetier.backend.keygroups import (
    KeyGroupRange,
    assign_to_key_group,
    key_group_range_for_instance,
)
from statetier.backend.serializers import serializer_by_id
from statetier.backend.snapshot import (
    SnapshotStore,
    commit_snapshot,
    restore_keyed_state,
    snapshot_subtask,
)
from statetier.backend.snapshot.layout import state_dir

P = 128


def full_backend() -> KeyedStateBackend:
    return KeyedStateBackend(KeyGroupRange.of(P), P)


class Average:
    """AggregateFunction[int, tuple[int, int], float]: accumulator differs from in and out."""

    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, accumulator: tuple[int, int]) -> tuple[int, int]:
        return (accumulator[0] + value, accumulator[1] + 1)

    def get_result(self, accumulator: tuple[int, int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


class DistinctWords:
    """AggregateFunction[str, set[str], str] with a mutable accumulator."""

    def create_accumulator(self) -> set[str]:
        return set()

    def add(self, value: str, accumulator: set[str]) -> set[str]:
        accumulator.add(value)
        return accumulator

    def get_result(self, accumulator: set[str]) -> str:
        return ",".join(sorted(accumulator))

    def merge(self, a: set[str], b: set[str]) -> set[str]:
        return a | b


# --------------------------------------------------------------------------- value


def test_value_state() -> None:
    b = full_backend()
    v = b.get_state(ValueStateDescriptor[int]("count"))
    b.set_current_key("a")
    assert v.value() is None
    v.update(1)
    assert v.value() == 1
    v.update(v.value() + 1)  # type: ignore[operator]
    assert v.value() == 2
    v.clear()
    assert v.value() is None
    v.update(5)
    v.update(None)  # None clears, as in Flink
    assert v.value() is None
    assert list(b.keys("count")) == []
    v.update(0)  # falsy values are values
    assert v.value() == 0
    assert list(b.keys("count")) == ["a"]


# --------------------------------------------------------------------------- list


def test_list_state() -> None:
    b = full_backend()
    lst = b.get_state(ListStateDescriptor[str]("events"))
    b.set_current_key("k")
    assert lst.get() == []
    lst.add("a")
    lst.add_all(["b", "c"])
    lst.add_all([])
    assert lst.get() == ["a", "b", "c"]
    got = lst.get()
    got.append("mutated")  # a copy: the state does not change
    assert lst.get() == ["a", "b", "c"]
    lst.update(["x"])
    assert lst.get() == ["x"]
    lst.update([])
    assert lst.get() == [] and list(b.keys("events")) == []
    lst.add("y")
    lst.clear()
    assert lst.get() == []
    with pytest.raises(ValueError, match="None"):
        lst.add(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="None"):
        lst.add_all(["ok", None])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="None"):
        lst.update([None])  # type: ignore[list-item]
    assert lst.get() == []  # a refused add_all adds nothing


def test_list_state_add_does_not_alias_caller_lists() -> None:
    b = full_backend()
    lst = b.get_state(ListStateDescriptor[int]("l"))
    b.set_current_key("k")
    source = [1, 2]
    lst.update(source)
    source.append(3)
    lst.add_all(source)
    source.append(4)
    assert lst.get() == [1, 2, 1, 2, 3]


# --------------------------------------------------------------------------- reducing


def test_reducing_state() -> None:
    b = full_backend()
    r = b.get_state(ReducingStateDescriptor[int]("max", reduce_function=max))
    s = b.get_state(
        ReducingStateDescriptor[str]("concat", reduce_function=lambda old, new: old + new)
    )
    b.set_current_key(1)
    assert r.get() is None
    for x in (3, 9, 2):
        r.add(x)
        s.add(str(x))
    assert r.get() == 9
    assert s.get() == "392"  # reduce(old, new): order preserved
    r.clear()
    assert r.get() is None
    r.add(-4)
    assert r.get() == -4  # first value after clear is taken as is
    with pytest.raises(ValueError, match="None"):
        r.add(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- aggregating


def test_aggregating_state_accumulator_differs_from_input_and_output() -> None:
    b = full_backend()
    avg = b.get_state(
        AggregatingStateDescriptor[int, tuple[int, int], float]("avg", aggregate_function=Average())
    )
    b.set_current_key("k")
    assert avg.get() is None
    for x in (1, 2, 6):
        avg.add(x)
    assert avg.get() == 3.0
    stored = b.tables["avg"].map_for(assign_to_key_group("k", P))["k"]
    assert stored == (9, 3)  # the accumulator is stored, the result computed on get
    avg.clear()
    assert avg.get() is None
    avg.add(10)
    assert avg.get() == 10.0


def test_aggregating_state_with_mutable_accumulator() -> None:
    b = full_backend()
    words = b.get_state(AggregatingStateDescriptor("w", aggregate_function=DistinctWords()))
    b.set_current_key("doc1")
    for w in ("b", "a", "b"):
        words.add(w)
    b.set_current_key("doc2")
    words.add("z")
    assert words.get() == "z"
    b.set_current_key("doc1")
    assert words.get() == "a,b"


# --------------------------------------------------------------------------- map


def test_map_state() -> None:
    b = full_backend()
    m = b.get_state(MapStateDescriptor("m"))
    b.set_current_key("k")
    assert m.is_empty()
    assert m.get("x") is None and not m.contains("x")
    assert list(m.items()) == [] and list(m.keys()) == [] and list(m.values()) == []
    m.put("x", 1)
    m.put_all({"y": 2, "z": 3})
    m.put_all({})
    assert not m.is_empty()
    assert m.get("x") == 1 and m.contains("y")
    assert dict(m.items()) == {"x": 1, "y": 2, "z": 3}
    assert sorted(m.keys()) == ["x", "y", "z"]
    assert sorted(m.values()) == [1, 2, 3]
    m.put("x", 10)  # overwrite
    assert m.get("x") == 10
    m.remove("y")
    m.remove("absent")  # no error
    assert dict(m.items()) == {"x": 10, "z": 3}
    m.remove("x")
    m.remove("z")
    assert m.is_empty()
    assert list(b.keys("m")) == []  # a key whose map becomes empty is gone
    m.put_all({"a": 1, "b": 2})
    m.clear()
    assert m.is_empty() and m.get("a") is None


def test_map_state_iteration_is_over_a_copy() -> None:
    b = full_backend()
    m = b.get_state(MapStateDescriptor("m"))
    b.set_current_key("k")
    m.put_all({i: i * i for i in range(10)})
    for user_key, _ in m.items():
        m.remove(user_key)  # mutating while iterating must not fail
    assert m.is_empty()


def test_map_state_none_values_and_odd_user_keys() -> None:
    b = full_backend()
    m = b.get_state(MapStateDescriptor("m"))
    b.set_current_key("k")
    m.put("n", None)
    assert m.contains("n") and m.get("n") is None and not m.is_empty()
    m.put((1, "t"), "tuple key")
    m.put(3, "int key")
    assert m.get((1, "t")) == "tuple key" and m.get(3) == "int key"


# --------------------------------------------------------------------------- scoping


def test_state_is_scoped_to_the_current_key() -> None:
    b = full_backend()
    v = b.get_state(ValueStateDescriptor[str]("v"))
    lst = b.get_state(ListStateDescriptor[int]("l"))
    m = b.get_state(MapStateDescriptor("m"))
    r = b.get_state(ReducingStateDescriptor[int]("r", reduce_function=lambda a, c: a + c))
    agg = b.get_state(AggregatingStateDescriptor("a", aggregate_function=Average()))
    keys: list[Any] = ["a", "b", 7, b"raw", ("t", 1), ("n", None)]
    for n, key in enumerate(keys):
        b.set_current_key(key)
        v.update(f"v{n}")
        lst.add_all(range(n))
        m.put("n", n)
        r.add(n)
        r.add(n)
        agg.add(n)
    for n, key in reversed(list(enumerate(keys))):
        b.set_current_key(key)
        assert b.current_key == key
        assert b.current_key_group == assign_to_key_group(key, P)
        assert v.value() == f"v{n}"
        assert lst.get() == list(range(n))
        assert dict(m.items()) == {"n": n}
        assert r.get() == 2 * n
        assert agg.get() == float(n)
    b.set_current_key("a")
    v.clear()
    lst.clear()
    m.clear()
    r.clear()
    agg.clear()
    b.set_current_key("b")
    assert v.value() == "v1" and lst.get() == [0] and m.get("n") == 1 and r.get() == 2
    assert sorted(b.keys("v"), key=repr) == sorted(keys[1:], key=repr)


def test_str_and_bytes_keys_with_equal_bytes_are_distinct_keys() -> None:
    b = full_backend()
    v = b.get_state(ValueStateDescriptor[str]("v"))
    b.set_current_key("ab")
    v.update("str")
    b.set_current_key(b"ab")
    assert v.value() is None  # same key group, different key
    v.update("bytes")
    b.set_current_key("ab")
    assert v.value() == "str"


def test_several_named_states_are_independent() -> None:
    b = full_backend()
    first = b.get_state(ValueStateDescriptor[int]("first"))
    second = b.get_state(ValueStateDescriptor[int]("second"))
    assert b.state_names() == ["first", "second"]
    b.set_current_key("k")
    first.update(1)
    assert second.value() is None
    second.update(2)
    assert first.value() == 1
    # Registering the same name and kind again returns the same handle.
    assert b.get_state(ValueStateDescriptor[int]("first")) is first


@pytest.mark.parametrize(
    "other",
    [
        ListStateDescriptor[int]("dup"),
        MapStateDescriptor("dup"),
        ReducingStateDescriptor[int]("dup", reduce_function=max),
        AggregatingStateDescriptor("dup", aggregate_function=Average()),
    ],
)
def test_duplicate_name_with_another_kind_is_refused(other: Any) -> None:
    b = full_backend()
    b.get_state(ValueStateDescriptor[int]("dup"))
    with pytest.raises(StateRegistrationError) as err:
        b.get_state(other)
    message = str(err.value)
    assert "'dup'" in message and "value" in message and other.kind.value in message
    assert isinstance(err.value, ValueError)


def test_duplicate_name_with_other_ttl_is_refused() -> None:
    b = full_backend()
    b.get_state(ValueStateDescriptor[int]("v", ttl=StateTtlConfig(1000)))
    with pytest.raises(StateRegistrationError, match="TTL"):
        b.get_state(ValueStateDescriptor[int]("v"))
    with pytest.raises(StateRegistrationError, match="TTL"):
        b.get_state(ValueStateDescriptor[int]("v", ttl=StateTtlConfig(2000)))
    b.get_state(ValueStateDescriptor[int]("v", ttl=StateTtlConfig(1000)))  # equal: fine


ODD_NAMES = [
    *["", " x", "x ", "a/b", ".", "..", "../up", "~7e", "%2F", "名前", "a\nb", "_timer"],
    *["n" * 1000, "名" * 100],  # longer than a file name may be
]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_any_string_is_a_state_name(name: str, tmp_path: Any) -> None:
    """Flink's StateDescriptor only requires a name (checkNotNull); uniqueness is the one rule.
    Every such name checkpoints into its own files and restores."""
    b = full_backend()
    v = b.get_state(ValueStateDescriptor[int](name))
    other = b.get_state(ValueStateDescriptor[int](name + "!"))
    b.set_current_key("k")
    v.update(1)
    other.update(2)
    store = SnapshotStore(f"file://{tmp_path}")
    manifest = commit_snapshot(store, 1, [snapshot_subtask(store, 1, b)])
    paths = [f.path for f in manifest.keyed_files]
    assert len(set(paths)) == 2
    for path in paths:  # every file stays inside the epoch's directory
        segments = path.split("/")
        assert segments[:3] == ["data", "epoch-0000000001", "w"] and len(segments) == 5
        assert segments[3] not in ("", ".", "..")
    restored = full_backend()
    restore_keyed_state(store, restored)
    restored.set_current_key("k")
    assert restored.get_state(ValueStateDescriptor[int](name)).value() == 1
    assert restored.get_state(ValueStateDescriptor[int](name + "!")).value() == 2


def test_state_dirs_of_different_names_differ() -> None:
    names = [*ODD_NAMES, "~", "~2e", "%7E", "x", "X", "...", "~2e2e", "n" * 1001, "n" * 200]
    dirs = [state_dir(name) for name in names]
    assert len(set(dirs)) == len(names)
    assert all("/" not in d and d.strip(".") and len(d) <= 200 for d in dirs)


def test_a_state_name_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="state name must be a str, got int 5"):
        ValueStateDescriptor[int](5)  # type: ignore[arg-type]


def test_a_none_key_is_refused_with_a_clear_error() -> None:
    """Flink refuses a null key (KeyGroupRangeAssignment: "Assigned key must not be null!");
    a None field inside a tuple key stays allowed (Spark's NULL in a composite key)."""
    b = full_backend()
    v = b.get_state(ValueStateDescriptor[int]("v"))
    b.set_current_key("a")
    v.update(1)
    with pytest.raises(NullKeyError, match="key is None") as err:
        b.set_current_key(None)
    assert isinstance(err.value, ValueError)
    assert b.current_key == "a" and v.value() == 1  # the previous key stays current
    b.set_current_key(("a", None))
    assert v.value() is None


# --------------------------------------------------------------------------- errors


def test_no_current_key_error_for_every_state_type() -> None:
    b = full_backend()
    v = b.get_state(ValueStateDescriptor[int]("v"))
    lst = b.get_state(ListStateDescriptor[int]("l"))
    m = b.get_state(MapStateDescriptor("m"))
    r = b.get_state(ReducingStateDescriptor[int]("r", reduce_function=max))
    agg = b.get_state(AggregatingStateDescriptor("a", aggregate_function=Average()))
    tv = b.get_state(ValueStateDescriptor[int]("tv", ttl=StateTtlConfig(10)))
    tm = b.get_state(MapStateDescriptor("tm", ttl=StateTtlConfig(10)))
    calls = [
        v.value,
        lambda: v.update(1),
        v.clear,
        lst.get,
        lambda: lst.add(1),
        m.is_empty,
        lambda: m.put(1, 1),
        lambda: m.get(1),
        r.get,
        lambda: r.add(1),
        agg.get,
        lambda: agg.add(1),
        tv.value,
        lambda: tv.update(1),
        lambda: tm.put(1, 1),
        tm.is_empty,
    ]
    for call in calls:
        with pytest.raises(NoCurrentKeyError, match="set_current_key"):
            call()


def test_key_group_out_of_range() -> None:
    kg_range = key_group_range_for_instance(P, 4, 1)
    b = KeyedStateBackend(kg_range, P)
    v = b.get_state(ValueStateDescriptor[int]("v"))
    inside = next(f"k{i}" for i in range(1000) if assign_to_key_group(f"k{i}", P) in kg_range)
    outside = next(f"k{i}" for i in range(1000) if assign_to_key_group(f"k{i}", P) not in kg_range)
    b.set_current_key(inside)
    v.update(1)
    with pytest.raises(KeyGroupOutOfRangeError) as err:
        b.set_current_key(outside)
    message = str(err.value)
    assert repr(outside) in message and str(kg_range) in message
    assert str(assign_to_key_group(outside, P)) in message
    # The failed call leaves the previous key in place.
    assert b.current_key == inside and v.value() == 1
    # And it keeps failing (no caching of refused keys).
    with pytest.raises(KeyGroupOutOfRangeError):
        b.set_current_key(outside)


def test_unhashable_or_unsupported_key_types_are_refused() -> None:
    b = full_backend()
    for key in (1.5, True, [1], 2**70):
        with pytest.raises(TypeError):
            b.set_current_key(key)


def test_backend_range_is_checked() -> None:
    with pytest.raises(ValueError, match="range"):
        KeyedStateBackend(KeyGroupRange(0, 128), P)
    with pytest.raises(ValueError, match="range"):
        KeyedStateBackend(KeyGroupRange(5, 4), P)
    with pytest.raises(ValueError, match="max parallelism"):
        KeyedStateBackend(KeyGroupRange(0, 0), 0)


# --------------------------------------------------------------------------- serializers


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


ROUND_TRIP_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -(2**63),
    2**64 - 1,
    1.5,
    -0.0,
    "",
    "ünï",
    b"",
    b"\x00\xff",
    [],
    (),
    (1,),
    (1, "a", b"b", None),
    {1, 2, 3},
    set(),
    frozenset({"a", "b"}),
    {"a": 1, 2: "b", (1, 2): [3, (4, 5)]},
    [1, (2, (3, (4,))), {5}, {"k": frozenset({(6, 7)})}],
    {"nested": {"deep": ({"x": (1, 2)}, [set(), ()])}},
    ("tuple", ["with", ("list", {"and": {"set"}})]),
]


@pytest.mark.parametrize(
    "value",
    ROUND_TRIP_VALUES,
    ids=[f"{i}-{type(v).__name__}" for i, v in enumerate(ROUND_TRIP_VALUES)],
)
def test_msgpack_round_trip_keeps_types(value: Any) -> None:
    s = MsgpackSerializer()
    back = s.loads(s.dumps(value))
    assert back == value
    assert _types(back) == _types(value)


def _types(value: Any) -> Any:
    """The type structure of a value, to tell tuples from lists and sets from frozensets."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_types(v) for v in value])
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, sorted(repr(_types(v)) for v in value))
    if isinstance(value, dict):
        return ("dict", sorted((repr(_types(k)), repr(_types(v))) for k, v in value.items()))
    return type(value).__name__


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (Point(1, 2), "Point"),
        (collections.OrderedDict(a=1), "OrderedDict"),
        (fractions.Fraction(1, 3), "Fraction"),
        ([1, {"deep": Point(0, 0)}], "Point"),
        ((1, (2, Point(0, 0))), "Point"),
        (2**64, "int"),
    ],
)
def test_msgpack_refuses_unsupported_types_naming_them(value: Any, type_name: str) -> None:
    with pytest.raises(SerializationError, match=type_name) as err:
        MsgpackSerializer().dumps(value)
    assert isinstance(err.value, TypeError)


def test_msgpack_malformed_bytes() -> None:
    with pytest.raises(SerializationError, match="malformed"):
        MsgpackSerializer().loads(b"\xc1")


def test_serializer_survives_a_failed_dump() -> None:
    s = MsgpackSerializer()
    with pytest.raises(SerializationError):
        s.dumps([1, (2, Point(0, 0))])
    assert s.loads(s.dumps({"a": (1, 2)})) == {"a": (1, 2)}


def test_pickle_and_raw_serializers() -> None:
    p = PickleSerializer()
    value = {"p": Point(1, 2), "f": fractions.Fraction(1, 3)}
    assert p.loads(p.dumps(value)) == value
    raw = RawBytesSerializer()
    assert raw.loads(raw.dumps(bytearray(b"xy"))) == b"xy"
    with pytest.raises(SerializationError, match="str"):
        raw.dumps("text")


def test_serializer_registry() -> None:
    assert isinstance(serializer_by_id("msgpack"), MsgpackSerializer)
    assert isinstance(serializer_by_id("pickle"), PickleSerializer)
    with pytest.raises(SerializationError, match="unknown serializer 'nope'"):
        serializer_by_id("nope")

    class Upper:
        id = "upper-test"

        def dumps(self, value: Any) -> bytes:
            return str(value).upper().encode()

        def loads(self, data: bytes) -> Any:
            return data.decode()

    register_serializer("upper-test", Upper)
    assert serializer_by_id("upper-test").dumps("a") == b"A"


def test_descriptor_serializer_ids() -> None:
    d = MapStateDescriptor("m", serializer=PickleSerializer(), key_serializer=RawBytesSerializer())
    assert d.serializer_ids() == {"value": "pickle", "user_key": "bytes"}
    assert ValueStateDescriptor[int]("v").serializer_ids() == {"value": "msgpack"}


# --------------------------------------------------------------------------- size estimate


def test_size_estimate_grows_with_state() -> None:
    b = full_backend()
    lst = b.get_state(ListStateDescriptor[str]("l"))
    v = b.get_state(ValueStateDescriptor[str]("v"))
    key_group = assign_to_key_group("k0", P)
    keys = [f"k{i}" for i in range(5000) if assign_to_key_group(f"k{i}", P) == key_group]
    assert b.estimate_size(key_group) == 0
    b.set_current_key(keys[0])
    v.update("x")
    one = b.estimate_size(key_group)
    assert one > 0
    lst.add_all(["y" * 100] * 50)
    bigger = b.estimate_size(key_group)
    assert bigger > one + 50 * 100  # the list's elements are counted
    for key in keys[1:]:
        b.set_current_key(key)
        v.update("x")
    many = b.estimate_size(key_group)
    assert many > bigger
    other = (key_group + 1) % P
    assert b.estimate_size(other) == 0  # per key group
    b.set_current_key(keys[0])
    lst.clear()
    assert b.estimate_size(key_group) < many

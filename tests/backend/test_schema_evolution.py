"""Schema evolution of typed state values, through the LocalRunner and a real checkpoint.

Each case writes values of one type, checkpoints, and restores the state declared as another
type, in both directions of each change. An accepted change reads every old value in the new
shape: on the heap right after the restore, from key groups spilled to disk (spilled before the
old checkpoint and again after the restore), and restored from the checkpoint the new type
wrote (which rewrites the state in a base, and records the new schema in the manifest). A
refused change fails the restore naming the state, the field and both types, and the state is
still there for the old type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from statetier.backend import (
    ListStateDescriptor,
    MapStateDescriptor,
    SerializationError,
    StateRegistrationError,
    StateTtlConfig,
    TypedSerializer,
    ValueStateDescriptor,
    record_type,
)
from statetier.backend.config import load_config
from statetier.backend.descriptors import StateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.local_runner import LocalRunner

READ = "read"
KEYS = [f"k{i}" for i in range(24)]


@dataclasses.dataclass
class V1:
    user: str
    clicks: int


@dataclasses.dataclass
class WithScore:  # V1 and a field with a default
    user: str
    clicks: int
    score: float = 0.5


@dataclasses.dataclass
class UserOnly:  # V1 without clicks
    user: str


@dataclasses.dataclass
class FloatClicks:  # V1 with clicks widened
    user: str
    clicks: float


@dataclasses.dataclass
class Reordered:
    clicks: int
    user: str


@dataclasses.dataclass
class NullableClicks:
    user: str
    clicks: int | None


@dataclasses.dataclass
class WithCountry:  # V1 and a field without a default
    user: str
    clicks: int
    country: str


@dataclasses.dataclass
class Renamed:  # V1 with clicks renamed
    user: str
    count: int


@dataclasses.dataclass
class IntUser:  # V1 with user narrowed from str to int
    user: int
    clicks: int


@dataclasses.dataclass
class Visit:
    page: str
    ms: int


@dataclasses.dataclass
class Visit2:  # Visit with ms widened and a field with a default
    page: str
    ms: float
    referrer: str = "-"


@dataclasses.dataclass
class Session:
    user: str
    last: Visit
    pages: dict[str, int]


@dataclasses.dataclass
class Session2:
    user: str
    last: Visit2
    pages: dict[str, float]


@dataclasses.dataclass
class IntPages:  # Session whose map's keys changed type
    user: str
    last: Visit
    pages: dict[int, int]


SAMPLES: dict[Any, Callable[[int], Any]] = {
    V1: lambda i: V1(f"u{i}", i),
    WithScore: lambda i: WithScore(f"u{i}", i, i / 4),
    UserOnly: lambda i: UserOnly(f"u{i}"),
    FloatClicks: lambda i: FloatClicks(f"u{i}", i + 0.5),
    Reordered: lambda i: Reordered(i, f"u{i}"),
    NullableClicks: lambda i: NullableClicks(f"u{i}", None if i % 3 else i),
    WithCountry: lambda i: WithCountry(f"u{i}", i, "fr"),
    Renamed: lambda i: Renamed(f"u{i}", i),
    IntUser: lambda i: IntUser(i, i),
    Session: lambda i: Session(f"u{i}", Visit(f"/p{i}", i), {"/": i, "/a": 2}),
    Session2: lambda i: Session2(f"u{i}", Visit2(f"/p{i}", i + 0.5, "r"), {"/": 1.5}),
    IntPages: lambda i: IntPages(f"u{i}", Visit("/", i), {i: i}),
    int: lambda i: i,
    float: lambda i: i + 0.25,
}

# (stored type, declared type, the declared value expected of each stored one)
ACCEPTED: dict[str, tuple[Any, Any, Callable[[Any], Any]]] = {
    "add a field with a default": (V1, WithScore, lambda v: WithScore(v.user, v.clicks)),
    "drop a field": (WithScore, V1, lambda v: V1(v.user, v.clicks)),
    "drop a field (2)": (V1, UserOnly, lambda v: UserOnly(v.user)),
    "widen int to float": (V1, FloatClicks, lambda v: FloatClicks(v.user, float(v.clicks))),
    "reorder": (V1, Reordered, lambda v: Reordered(v.clicks, v.user)),
    "reorder back": (Reordered, V1, lambda v: V1(v.user, v.clicks)),
    "make optional": (V1, NullableClicks, lambda v: NullableClicks(v.user, v.clicks)),
    "drop a field without a default": (WithCountry, V1, lambda v: V1(v.user, v.clicks)),
    "nested: add, widen in a record and in map values": (
        Session,
        Session2,
        lambda v: Session2(
            v.user,
            Visit2(v.last.page, float(v.last.ms)),
            {page: float(n) for page, n in v.pages.items()},
        ),
    ),
    "widen the value itself": (int, float, float),
}

# (stored type, declared type, what the error names: the field and both types)
REFUSED: dict[str, tuple[Any, Any, tuple[str, ...]]] = {
    "narrow float to int": (FloatClicks, V1, ("'clicks'", "stored as float", "declared as int")),
    "narrow optional": (NullableClicks, V1, ("'clicks'", "optional<int>", "declared as int")),
    "add a field without a default": (V1, WithCountry, ("'country'", "(str)", "no default")),
    "rename": (V1, Renamed, ("'count'", "(int)", "no default")),
    "rename back": (Renamed, V1, ("'clicks'", "(int)", "no default")),
    "str to int": (V1, IntUser, ("'user'", "stored as str", "declared as int")),
    "int to str": (IntUser, V1, ("'user'", "stored as int", "declared as str")),
    "nested narrowing": (Session2, Session, ("'last.ms'", "stored as float", "declared as int")),
    "map key type": (Session, IntPages, ("'pages{key}'", "stored as str", "declared as int")),
    "map key type back": (IntPages, Session, ("'pages{key}'", "stored as int", "as str")),
    "record to a scalar": (V1, int, ("the value", "record V1", "declared as int")),
    "scalar to a record": (int, V1, ("the value", "stored as int", "declared as record V1")),
    "narrow the value itself": (float, int, ("the value", "stored as float", "declared as int")),
}


class Probe(KeyedProcessFunction[str, Any, Any]):
    """Writes each record's value into its key's state; a ``READ`` record emits the value."""

    def __init__(self, descriptor: StateDescriptor) -> None:
        self.descriptor = descriptor

    def open(self, context: RuntimeContext) -> None:
        self.state: Any = context.get_state(self.descriptor)

    def process(self, key: str, value: Any, context: RuntimeContext) -> Iterable[Any]:
        if value == READ:
            return [(key, self.state.value())]
        self.state.update(value)
        return ()


def _runner(uri: str, value_type: Any, spill: Path | None = None) -> LocalRunner:
    config = None
    if spill is not None:
        settings = {"spill.enabled": True, "spill.dirs": str(spill), "memory.budget": "64g"}
        config = load_config(settings, env={})
    descriptor: ValueStateDescriptor[Any] = ValueStateDescriptor(
        "session", serializer=TypedSerializer(value_type)
    )
    return LocalRunner(
        lambda: Probe(descriptor), 2, max_parallelism=8, checkpoint_uri=uri, config=config
    )


def _spill_all(runner: LocalRunner) -> None:
    """Every key group with state to disk: reads and the next snapshot go through the tier."""
    for instance in runner.instances:
        assert instance.spill is not None
        for key_group in instance.keyed.key_groups:
            instance.spill.spill_key_group(key_group)
        assert instance.spill.spilled_key_groups()


def _read(runner: LocalRunner) -> dict[str, str]:
    """Each key's value as its repr: ``1`` and ``1.0`` differ, as a widened field must."""
    return {key: repr(value) for key, value in runner.process((k, READ) for k in KEYS)}


@pytest.mark.parametrize("tier", ["heap", "spilled"])
@pytest.mark.parametrize("case", list(ACCEPTED))
def test_an_accepted_change_reads_old_values_in_the_new_shape(
    tmp_path: Path, case: str, tier: str
) -> None:
    stored, declared, convert = ACCEPTED[case]
    uri = f"file://{tmp_path}/ckpt"
    spill = tmp_path / "spill" if tier == "spilled" else None
    old = {key: SAMPLES[stored](i) for i, key in enumerate(KEYS)}
    expected = {key: repr(convert(value)) for key, value in old.items()}

    writer = _runner(uri, stored, spill)
    writer.process(old.items())
    if spill:
        _spill_all(writer)  # the checkpoint's bytes come from the spill tier
    writer.checkpoint()
    writer.close()

    reader = _runner(uri, declared, spill)
    if spill:
        _spill_all(reader)  # restored, then read back from disk
    assert _read(reader) == expected
    reader.checkpoint()
    reader.close()

    assert reader.store is not None
    manifest = reader.store.manifest()
    assert manifest.states["session"]["schemas"] == {
        "value": TypedSerializer(declared).schema.to_json()  # type: ignore[union-attr]
    }
    # the new type's first checkpoint rewrote the state: a base, no delta of old bytes
    chains = [chain for chain in manifest.chains() if chain.state == "session"]
    assert chains and all(c.base.epoch == manifest.epoch and not c.deltas for c in chains)

    again = _runner(uri, declared)
    assert _read(again) == expected
    again.close()


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_change_names_the_state_field_and_types_and_loses_nothing(
    tmp_path: Path, case: str
) -> None:
    stored, declared, named = REFUSED[case]
    uri = f"file://{tmp_path}/ckpt"
    old = {key: SAMPLES[stored](i) for i, key in enumerate(KEYS)}
    writer = _runner(uri, stored)
    writer.run_epoch(old.items())
    writer.close()

    with pytest.raises(StateRegistrationError) as refused:
        _runner(uri, declared)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("state 'session' cannot be restored")
    for part in named:
        assert part in message, message

    kept = _runner(uri, stored)
    assert _read(kept) == {key: repr(value) for key, value in old.items()}
    kept.close()


# ---------------------------------------------------------------------- lists, maps, TTL

TTL = StateTtlConfig(3_600_000)


class Visits(KeyedProcessFunction[str, Any, Any]):
    """A typed list (with TTL: each element stored beside its timestamp) and a typed map."""

    def __init__(self, visit: Any, count: Any, page: Any = str) -> None:
        self.visit, self.count, self.page = visit, count, page

    def open(self, context: RuntimeContext) -> None:
        self.visits: Any = context.get_state(
            ListStateDescriptor("visits", serializer=TypedSerializer(self.visit), ttl=TTL)
        )
        self.pages: Any = context.get_state(
            MapStateDescriptor(
                "pages",
                serializer=TypedSerializer(self.count),
                key_serializer=TypedSerializer(self.page),
            )
        )

    def process(self, key: str, value: Any, context: RuntimeContext) -> Iterable[Any]:
        if value == READ:
            return [(key, repr((self.visits.get(), sorted(self.pages.items()))))]
        visit, page, count = value
        self.visits.add(visit)
        self.pages.put(page, count)
        return ()


def _visits_runner(uri: str, *types: Any) -> LocalRunner:
    return LocalRunner(lambda: Visits(*types), 2, max_parallelism=8, checkpoint_uri=uri)


def test_list_elements_with_ttl_and_map_values_evolve_map_keys_do_not(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/ckpt"
    writer = _visits_runner(uri, Visit, int)
    for n in range(2):
        writer.process(
            (key, (Visit(f"/{key}/{n}", n), f"/{n}", i + n)) for i, key in enumerate(KEYS)
        )
    writer.checkpoint()
    writer.close()

    reader = _visits_runner(uri, Visit2, float)
    expected = {
        key: repr(
            (
                [Visit2(f"/{key}/{n}", float(n)) for n in range(2)],
                [(f"/{n}", float(i + n)) for n in range(2)],
            )
        )
        for i, key in enumerate(KEYS)
    }
    assert dict(reader.process((k, READ) for k in KEYS)) == expected
    reader.close()

    with pytest.raises(StateRegistrationError) as refused:
        _visits_runner(uri, Visit2, float, int)
    message = str(refused.value)
    assert "state 'pages'" in message and "the map's keys" in message, message
    assert "stored as str and declared as int" in message, message


# ---------------------------------------------------------------------- declared records


def test_a_declared_record_evolves_as_a_dataclass_does(tmp_path: Path) -> None:
    """A schema declared field by field (values are dicts): a field added with a default is
    filled in, a dropped one is gone, an int field widened reads as float."""
    uri = f"file://{tmp_path}/ckpt"
    old = record_type("Session", {"user": str, "clicks": int, "tags": list[str]})
    new = record_type(
        "Session", {"clicks": float, "user": str, "seen": bool}, defaults={"seen": False}
    )
    writer = _runner(uri, old)
    writer.run_epoch((key, {"user": key, "clicks": i, "tags": ["a"]}) for i, key in enumerate(KEYS))
    writer.close()
    reader = _runner(uri, new)
    assert _read(reader) == {
        key: repr({"clicks": float(i), "user": key, "seen": False}) for i, key in enumerate(KEYS)
    }
    reader.close()
    with pytest.raises(StateRegistrationError, match=r"field 'seen' \(bool\) is new"):
        _runner(uri, record_type("Session", {"user": str, "seen": bool}))


# ---------------------------------------------------------------------- writes


def test_a_value_of_the_wrong_shape_is_refused_where_it_is_written(tmp_path: Path) -> None:
    runner = _runner(f"file://{tmp_path}/ckpt", Session)
    with pytest.raises(SerializationError) as refused:
        runner.process([("k1", Session("u", Visit("/", "slow"), {}))])  # type: ignore[arg-type]
    assert str(refused.value) == (
        "state 'session', key 'k1': field 'last.ms' is declared int but got str 'slow'"
    )
    with pytest.raises(SerializationError, match="the value is declared record Session but got V1"):
        runner.process([("k2", V1("u", 1))])
    runner.close()
    declared = _runner(f"file://{tmp_path}/declared", record_type("R", {"user": str}))
    with pytest.raises(SerializationError, match=r"dict has undeclared fields \['usr'\]"):
        declared.process([("k3", {"user": "u", "usr": "typo"})])
    declared.close()


def test_a_schemaless_state_records_no_schema(tmp_path: Path) -> None:
    """msgpack and pickle state keep the manifest entry they had before typed state (and a
    manifest without schemas is what a restore reads as schemaless)."""
    descriptor: ValueStateDescriptor[Any] = ValueStateDescriptor("session")
    runner = LocalRunner(lambda: Probe(descriptor), 1, checkpoint_uri=f"file://{tmp_path}/c")
    runner.run_epoch([("k", (1, "a"))])
    runner.close()
    assert runner.store is not None
    assert runner.store.manifest().states["session"] == {
        "kind": "value",
        "ttl": None,
        "serializers": {"value": "msgpack"},
    }


def test_the_typed_values_benchmark_runs_its_modes() -> None:
    """``statetier bench typed-values`` on a few values: every mode runs (its own check reads
    evolved bytes); the speed target is the benchmark's, not this test's."""
    from statetier.tools.bench import typed_values

    result = typed_values.run(500, 1)
    modes = result["modes"]
    assert isinstance(modes, dict)
    assert set(modes) == {
        "msgpack_tuple",
        "raw_msgpack_array",
        "typed_dataclass",
        "typed_read_evolved",
    }
    assert all(mode["values_per_s"] > 0 for mode in modes.values())


def test_the_registry_reads_typed_bytes_without_the_jobs_classes() -> None:
    """A tool that has only the manifest's serializer id reads records as dicts (what a reader
    of the state maps to columns); it writes nothing, and says so in one line."""
    from statetier.backend.serializers import serializer_by_id

    data = TypedSerializer(Session).dumps(Session("u", Visit("/", 3), {"/": 1}))
    reader = serializer_by_id("typed")
    from statetier.backend.typed.schema import stored_value_schema

    meta = {"schemas": {"value": TypedSerializer(Session).schema.to_json()}}  # type: ignore[union-attr]
    assert stored_value_schema(meta) == TypedSerializer(Session).schema
    assert stored_value_schema({"serializers": {"value": "msgpack"}}) is None
    assert reader.loads(data) == {"user": "u", "last": {"page": "/", "ms": 3}, "pages": {"/": 1}}
    with pytest.raises(SerializationError, match=r"^a TypedSerializer without a value type only"):
        reader.dumps({"user": "u"})

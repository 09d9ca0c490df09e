"""Typed state read as typed columns: a TypedSerializer state's ``value`` is a column of its
stored schema's type, read without the job's classes, and ``statetier-metadata`` shows it.

A 2-epoch local-runner job (parallelism 2) keeps a typed ValueState of a dataclass (a str, an
int, an optional float, a list) and a typed MapState whose values are a dataclass; epoch 2
clears some keys' sessions. An oracle computed here from the same inputs says what the function
holds; the reader's rows, its change feed and the bytes beside each value must equal it. One
real Spark session (the Spark tests' ``spark`` fixture), the checkpoint on local disk.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession
from statetier.backend import MapStateDescriptor, TypedSerializer, ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.local_runner import LocalRunner
from statetier.backend.spark.state_source import register_data_sources

CLEAR = -1  # a record that clears its key's session


@dataclasses.dataclass
class Session:
    user: str
    clicks: int
    score: float | None
    tags: list[str]


@dataclasses.dataclass
class Visit:
    count: int
    last: float


SESSION = ValueStateDescriptor[Session]("session", serializer=TypedSerializer(Session))
PAGES = MapStateDescriptor("pages", serializer=TypedSerializer(Visit))


class Sessions(KeyedProcessFunction[str, int, None]):
    def open(self, context: RuntimeContext) -> None:
        self.session = context.get_state(SESSION)
        self.pages = context.get_state(PAGES)

    def process(self, key: str, value: int, context: RuntimeContext) -> list[None]:
        if value == CLEAR:
            self.session.clear()
            return []
        self.session.update(step(self.session.value(), key, value))
        page = f"p{value % 4}"
        seen = self.pages.get(page)
        self.pages.put(page, Visit((seen.count if seen else 0) + 1, value / 2))
        return []


def step(session: Session | None, key: str, value: int) -> Session:
    """The session after record ``value`` (the function's and the oracle's rule)."""
    if session is None:
        return Session(key.upper(), 1, None, [f"t{value % 3}"])
    return Session(session.user, session.clicks + 1, value / 10, [*session.tags, f"t{value % 3}"])


def inputs() -> list[list[tuple[str, int]]]:
    rng = random.Random(7)
    first = [(f"u{i}", rng.randrange(100)) for i in range(12) for _ in range(1 + i % 2)]
    second = [(f"u{i}", CLEAR if i % 5 == 0 else rng.randrange(100)) for i in range(0, 16, 2)]
    return [first, second]


class Oracle:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.pages: dict[str, dict[str, Visit]] = {}

    def epoch(self, records: list[tuple[str, int]]) -> None:
        for key, value in records:
            if value == CLEAR:
                self.sessions.pop(key, None)
                continue
            self.sessions[key] = step(self.sessions.get(key), key, value)
            page, pages = f"p{value % 4}", self.pages.setdefault(key, {})
            seen = pages.get(f"p{value % 4}")
            pages[page] = Visit((seen.count if seen else 0) + 1, value / 2)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Oracle]]:
    """The job's checkpoint, and the oracle after each epoch."""
    uri = f"file://{tmp_path_factory.mktemp('typed-source')}/ckpt"
    runner, oracle, history = LocalRunner(Sessions, 2, checkpoint_uri=uri), Oracle(), []
    try:
        for records in inputs():
            runner.run_epoch(records)
            oracle.epoch(records)
            history.append(copy.deepcopy(oracle))
    finally:
        runner.close()
    return uri, history


@pytest.fixture(scope="module")
def reader(spark: SparkSession) -> Iterator[SparkSession]:
    register_data_sources(spark)
    yield spark


def load(spark: SparkSession, uri: str, **options: Any) -> Any:
    read = spark.read.format("statetier").option("path", uri)
    for name, value in options.items():
        read = read.option(name, value)
    return read.load()


def test_a_typed_value_state_is_read_as_a_struct(
    reader: SparkSession, job: tuple[str, list[Oracle]]
) -> None:
    uri, history = job
    df = load(reader, uri, state="session", partitions=3)
    assert df.schema["value"].dataType.simpleString() == (
        "struct<user:string,clicks:bigint,score:double,tags:array<string>>"
    )
    rows = df.collect()
    want = history[-1].sessions
    assert {r.key: Session(**r.value.asDict()) for r in rows} == want
    assert len(rows) == len(want)
    # the bytes beside it are the state's own: the job's serializer reads them back
    assert {r.key: SESSION.serializer.loads(r.value_bytes) for r in rows} == want
    older = load(reader, uri, state="session", epoch=1).collect()
    assert {r.key: Session(**r.value.asDict()) for r in older} == history[0].sessions


def test_a_typed_map_state_value_is_read_as_a_struct(
    reader: SparkSession, job: tuple[str, list[Oracle]]
) -> None:
    uri, history = job
    df = load(reader, uri, state="pages")
    assert df.schema["value"].dataType.simpleString() == "struct<count:bigint,last:double>"
    got = {(r.key, r.user_key): Visit(**r.value.asDict()) for r in df.collect()}
    want = {(k, page): v for k, pages in history[-1].pages.items() for page, v in pages.items()}
    assert got == want


def test_the_change_feed_of_a_typed_state_has_null_values_for_deletes(
    reader: SparkSession, job: tuple[str, list[Oracle]]
) -> None:
    uri, history = job
    rows = load(reader, uri, state="session", readChangeFeed=True, changeStartEpoch=2).collect()
    before, after = history[0].sessions, history[1].sessions
    want = {k: after.get(k) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert any(v is None for v in want.values()), "epoch 2 should delete a session"
    got = {r.key: None if r.value is None else Session(**r.value.asDict()) for r in rows}
    assert got == want
    assert {r.change_type for r in rows if r.value is None} == {"delete"}


def test_the_metadata_view_shows_the_value_schema(
    reader: SparkSession, job: tuple[str, list[Oracle]]
) -> None:
    uri, _ = job
    listed = reader.read.format("statetier-metadata").option("path", uri).load().collect()
    schemas = {r.state: r.value_schema for r in listed if not r.internal}
    assert schemas == {
        "session": "struct<`user`: string, `clicks`: bigint, `score`: double, "
        "`tags`: array<string>>",
        "pages": "struct<`count`: bigint, `last`: double>",
    }


def test_a_small_state_is_one_task_unless_partitions_says(
    reader: SparkSession, job: tuple[str, list[Oracle]]
) -> None:
    """The job ran 2 instances; its few kilobytes of state are not worth a second task."""
    uri, _ = job
    assert load(reader, uri, state="session").rdd.getNumPartitions() == 1
    assert load(reader, uri, state="session", partitions=2).rdd.getNumPartitions() == 2

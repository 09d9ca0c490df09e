"""Bootstrap (snapshot.bootstrap) on file:// and SeaweedFS: rows of every state kind written as
a committed epoch that a LocalRunner restores at another parallelism, exactly as rows said, TTL
timestamps "written now"; the runner's own epochs go on from it; a location with epochs is
refused unless asked, and asked, other states are carried over untouched; a savepoint
destination gets its marker and restores through ``checkpoint.restore-from``. The Spark writer
over the same code is in tests/spark/test_spark_bootstrap.py.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest
from statetier.backend import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from statetier.backend.config import load_config
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot.bootstrap import (
    BootstrapError,
    StateRows,
    bootstrap,
    bootstrap_epoch,
    write_range,
)
from statetier.backend.snapshot.epoch_offset import (
    EpochOffsets,
    epoch_offsets,
    pruned_offsets,
    record_added_epoch,
)
from statetier.backend.snapshot.savepoint import read_savepoint, take_savepoint
from statetier.backend.snapshot.store import SnapshotStore
from statetier.backend.ttl import ManualClock

from tests.checkpoint.ckpt_support import CLOCK_MS, Location

MAX_P = 64
TTL_MS = 60_000


class Mean:
    """An aggregate function: (sum, count) accumulators, the mean as result."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, acc: list[int]) -> list[int]:
        return [acc[0] + value, acc[1] + 1]

    def get_result(self, acc: list[int]) -> float:
        return acc[0] / acc[1]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


def descriptors() -> dict[str, Any]:
    return {
        "count": ValueStateDescriptor[int]("count"),
        "seen": ValueStateDescriptor[str]("seen", ttl=StateTtlConfig(TTL_MS)),
        "items": ListStateDescriptor[int]("items"),
        "tags": MapStateDescriptor("tags"),
        "total": ReducingStateDescriptor[int]("total", reduce_function=lambda a, b: a + b),
        "mean": AggregatingStateDescriptor("mean", aggregate_function=Mean()),
    }


class Show(KeyedProcessFunction[str, int, Any]):
    """Shows each key's states (value None), or adds the value to ``count`` and ``total``."""

    def open(self, context: RuntimeContext) -> None:
        self.s = {name: context.get_state(d) for name, d in descriptors().items()}

    def process(self, key: str, value: int | None, context: RuntimeContext) -> Iterable[Any]:
        s = self.s
        if value is not None:
            s["count"].update((s["count"].value() or 0) + value)
            s["total"].add(value)
            return ()
        shown = {
            "count": s["count"].value(),
            "seen": s["seen"].value(),
            "items": s["items"].get(),
            "tags": dict(s["tags"].items()),
            "total": s["total"].get(),
            "mean": s["mean"].get(),
        }
        return [(key, shown)]


def rows(n: int = 300) -> dict[str, list[tuple[Any, ...]]]:
    rnd = random.Random(41)
    keys = [f"k{i}" for i in range(n)]
    return {
        "count": [(k, i + 1) for i, k in enumerate(keys)],
        "seen": [(k, k.upper()) for k in keys[::2]],
        "items": [(k, [i, i + 1]) for i, k in enumerate(keys[::3])],
        "tags": [(k, f"t{j}", j) for k in keys[::4] for j in range(rnd.randrange(1, 4))],
        "total": [(k, v) for k in keys for v in (1, 2)],
        "mean": [(k, v) for k in keys[::5] for v in (2, 4, 9)],
    }


def oracle(data: dict[str, list[tuple[Any, ...]]], key: str, ttl_live: bool) -> dict[str, Any]:
    """What each state of ``key`` holds after the rows, computed from the rows alone."""
    mean = [v for k, v in data["mean"] if k == key]
    return {
        "count": next((v for k, v in data["count"] if k == key), None),
        "seen": next((v for k, v in data["seen"] if k == key), None) if ttl_live else None,
        "items": [e for k, v in data["items"] if k == key for e in v],
        "tags": {u: v for k, u, v in data["tags"] if k == key},
        "total": sum(v for k, v in data["total"] if k == key) or None,
        "mean": sum(mean) / len(mean) if mean else None,
    }


def write(location: Location, parallelism: int, **kwargs: Any) -> Any:
    data = rows()
    states = [
        StateRows(d, data[name], elements=name == "items") for name, d in descriptors().items()
    ]
    manifest = bootstrap(
        location.store(),
        states,
        max_parallelism=MAX_P,
        parallelism=parallelism,
        clock=ManualClock(CLOCK_MS),
        **kwargs,
    )
    return data, manifest


def shown(runner: LocalRunner, keys: list[str]) -> dict[str, Any]:
    return dict(runner.process([(k, None) for k in keys]))


def test_every_state_kind_restores_as_the_rows_said_at_another_parallelism(
    location: Location,
) -> None:
    data, manifest = write(location, parallelism=2)
    assert manifest.epoch == 1 and manifest.max_parallelism == MAX_P
    assert bootstrap_epoch(location.store()) == 1
    keys = [f"k{i}" for i in range(300)]
    clock = ManualClock(CLOCK_MS + TTL_MS - 1)  # the TTL'd values were written at CLOCK_MS
    runner = LocalRunner(
        Show, 3, checkpoint_uri=location.uri, storage_options=location.options, clock=clock
    )
    assert runner.max_parallelism == MAX_P
    assert shown(runner, keys) == {k: oracle(data, k, ttl_live=True) for k in keys}
    # the runner's own epochs follow the bootstrap's: more input, then a restart, exact
    runner.process([(k, 10) for k in keys[:50]])
    assert runner.checkpoint().epoch == 2
    runner.close()
    clock.set(CLOCK_MS + TTL_MS)  # now expired
    again = LocalRunner(
        Show, 1, checkpoint_uri=location.uri, storage_options=location.options, clock=clock
    )
    expected = {k: oracle(data, k, ttl_live=False) for k in keys}
    for k in keys[:50]:
        expected[k]["count"] += 10
        expected[k]["total"] += 10
    assert shown(again, keys) == expected
    again.close()


def test_a_location_with_epochs_is_refused_unless_asked_and_then_keeps_the_others(
    location: Location,
) -> None:
    write(location, parallelism=1)
    with pytest.raises(BootstrapError, match=f"{location.uri} holds committed epochs .*add_epoch"):
        write(location, parallelism=1)
    store = location.store()
    before = store.manifest(1)
    fixed = [StateRows(descriptors()["count"], [("k1", 1000)])]
    manifest = bootstrap(store, fixed, max_parallelism=MAX_P, add_epoch=True)
    assert manifest.epoch == 2 and set(manifest.states) == set(before.states)
    kept = {f.path for f in before.keyed_files if f.state != "count"}
    assert kept <= {f.path for f in manifest.keyed_files}  # carried, not rewritten
    assert all(store.fs.exists(store.full_path(f.path)) for f in before.keyed_files)
    runner = LocalRunner(Show, 2, checkpoint_uri=location.uri, storage_options=location.options)
    got = shown(runner, ["k1", "k2"])
    runner.close()
    assert got["k1"]["count"] == 1000 and got["k2"]["count"] is None  # count is the new rows
    assert got["k2"]["total"] == 3  # other states as they were
    with pytest.raises(BootstrapError, match="max parallelism 64, not 128"):
        bootstrap(store, fixed, max_parallelism=128, add_epoch=True)


def test_a_savepoint_destination_gets_its_marker_and_restores_from_there(
    location: Location, tmp_path: Any
) -> None:
    data, _ = write(location, parallelism=2, savepoint=True)
    store = location.store()
    marker = read_savepoint(store)
    assert marker is not None and marker.epoch == 1 and marker.spark_batch is None
    # micro-batch 0 of a query restored from it follows epoch 1: the marker says so
    assert bootstrap_epoch(store) == 1
    config = load_config({"checkpoint.restore-from": location.uri})
    own = f"file://{tmp_path}/own"
    runner = LocalRunner(
        Show,
        2,
        checkpoint_uri=own,
        storage_options=location.options,
        config=config,
        clock=ManualClock(CLOCK_MS),
    )
    assert shown(runner, ["k0", "k3"]) == {k: oracle(data, k, True) for k in ["k0", "k3"]}
    runner.close()
    assert bootstrap_epoch(SnapshotStore(own)) == 1  # the restored location got the marker too


def test_a_savepoint_of_a_bootstrapped_location_carries_its_epoch_offset(
    location: Location, tmp_path: Any
) -> None:
    """A savepoint names its Spark micro-batch as ``epoch - 1 - E`` after a bootstrap of epoch
    E, and carries E; the bootstrap's own epoch ran no micro-batch, so it has no Spark log."""
    write(location, parallelism=2)
    source = location.store()
    with pytest.raises(ValueError, match=r"epoch 1 of .* is its bootstrap.s: no micro-batch ran"):
        take_savepoint(source, SnapshotStore(f"file://{tmp_path}/sp0"), spark_checkpoint="x")
    dest = SnapshotStore(f"file://{tmp_path}/sp1")
    assert take_savepoint(source, dest).epoch == 1
    assert bootstrap_epoch(dest) == 1


def test_an_added_epoch_is_skipped_by_the_micro_batch_numbering(tmp_path: Any) -> None:
    """A repaired state written back over a query's epochs 1-2 (micro-batches 0-1) as epoch 3:
    the restarted query's micro-batch 2 is epoch 4, so no micro-batch is numbered as the added
    epoch (it would be adopted, its records lost); a savepoint of epoch 3 names micro-batch 1.
    An added epoch whose commit failed is dropped by the next query that takes the lease."""
    uri = f"file://{tmp_path}/ckpt"
    runner = LocalRunner(Show, 2, checkpoint_uri=uri, max_parallelism=MAX_P)
    for batch in range(2):
        runner.process([("k1", 1), ("k2", batch)])
        runner.checkpoint()
    runner.close()
    store = SnapshotStore(uri)
    assert epoch_offsets(store).epoch_of(1) == 2  # a plain query: micro-batch b is epoch b + 1
    fixed = [StateRows(descriptors()["count"], [("k1", 100)])]
    assert bootstrap(store, fixed, max_parallelism=MAX_P, add_epoch=True).epoch == 3
    offsets = epoch_offsets(store)
    assert offsets == EpochOffsets(0, (3,))
    assert [offsets.epoch_of(b) for b in range(4)] == [1, 2, 4, 5]
    assert [offsets.micro_batch_of(e) for e in (2, 3, 4)] == [1, 1, 2]
    saved = take_savepoint(store, SnapshotStore(f"file://{tmp_path}/sp"))
    assert saved.epoch == 3 and epoch_offsets(SnapshotStore(f"file://{tmp_path}/sp")) == offsets
    # after a first epoch of a bootstrap too: micro-batch 0 is epoch 3 when 1 and 2 were written
    assert EpochOffsets(1, (2,)).epoch_of(0) == 3
    record_added_epoch(store, 4)  # a bootstrap that failed before committing epoch 4
    assert epoch_offsets(store).added == (3, 4)
    assert pruned_offsets(store) == offsets and epoch_offsets(store) == offsets


def test_bad_rows_are_named() -> None:
    class NoStore:
        def put(self, name: str, data: bytes) -> None:
            raise AssertionError("nothing is written for bad rows")

    cases = [
        (StateRows(descriptors()["count"], [("a", 1), ("a", 2)]), "key 'a' is given twice"),
        (StateRows(descriptors()["count"], [("a", None)]), "key 'a' has a null value"),
        (StateRows(descriptors()["tags"], [("a", "x", 1), ("a", "x", 2)]), "user key 'x' twice"),
        (StateRows(descriptors()["items"], [(None, 1)]), "key is None"),
    ]
    for state, message in cases:
        with pytest.raises(ValueError, match=message):
            write_range(NoStore(), 1, KeyGroupRange(0, 0), 1, [state])  # type: ignore[arg-type]

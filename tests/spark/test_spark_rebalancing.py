"""Rebalancing's parts without Spark: which ranges move (a pure plan), a range's committed state
handed from one instance to another in the checkpoint's encoding (heap and spilled key groups,
nothing read from tier 2), and a hand-off cut mid-way, which leaves the new host to restore.
The whole, on three executors, is test_spark_rebalance_cluster.py."""

from __future__ import annotations

import json
import time
from multiprocessing.connection import Connection
from pathlib import Path

from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.runtime import FunctionInstance
from statetier.backend.snapshot.handoff import HandOff, prepare_handoff
from statetier.backend.spark import protocol
from statetier.backend.spark.channel import Server, new_secret
from statetier.backend.spark.handoff import HandOffRequest, fetch_handoff
from statetier.backend.spark.rebalancing import Move, plan_moves
from statetier.backend.spark.registry import HostInfo, HostRegistry, OrderKind, ask_route
from statetier.backend.spark.results import snapshot_to_dict

from tests.spark.spark_support import WordCount
from tests.spark.test_spark_registry import FakeHost


def test_moves_go_from_the_most_loaded_hosts_to_the_new_one_within_the_bound() -> None:
    owners = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b", 6: "gone"}
    # a and b own three each, c joined: one range from each to c, the highest of each
    assert plan_moves(owners, ["c", "b", "a"], limit=4) == [Move(2, "a", "c"), Move(5, "b", "c")]
    assert plan_moves(owners, ["a", "b", "c"], limit=1) == [Move(2, "a", "c")]
    assert plan_moves(owners, ["a", "b", "c"], limit=0) == []
    # an even spread (within one) moves nothing; a range of a host that is gone stays
    assert plan_moves({0: "a", 1: "a", 2: "b"}, ["a", "b"], limit=4) == []
    assert plan_moves({i: "a" for i in range(8)}, ["a", "b", "c", "d"], limit=8) == [
        Move(7, "a", "b"),
        Move(6, "a", "c"),
        Move(5, "a", "d"),
        Move(4, "a", "b"),
        Move(3, "a", "c"),
        Move(2, "a", "d"),
    ]


def route_four_ranges(registry: HostRegistry) -> None:
    """Ranges 0-3 of pipeline p on two executors' hosts: the odd ones on a, the even on b."""
    registry.executors = 2
    for index in range(4):
        ask_route(registry.endpoint, registry.secret, ("p", 4, index), "a" if index % 2 else "b")


def test_the_registry_moves_ranges_to_a_host_that_joined_and_names_their_old_owners() -> None:
    registry = HostRegistry(new_secret(), "127.0.0.1", liveness_timeout=5)
    a, b = FakeHost(registry, "a"), FakeHost(registry, "b")
    try:
        route_four_ranges(registry)
        assert registry.rebalance("p", 4, limit=4) == []  # two each: even already
        c = FakeHost(registry, "c")
        moves = registry.rebalance("p", 4, limit=4)
        assert [(m.index, m.source, m.target) for m in moves] == [(3, "a", "c")]
        assert registry.owners[("p", 4, 3)] == "c"
        previous = registry.previous_owner(("p", 4, 3), "c")
        assert previous is not None and previous.host_id == "a"
        assert registry.previous_owner(("p", 4, 3), "b") is None  # only the new owner asks
        assert registry.previous_owner(("p", 4, 1), "a") is None  # not moved
        # at the next boundary the old owner is told to drop what it was not asked for
        assert registry.rebalance("p", 4, limit=4) == []
        deadline = time.monotonic() + 5
        while not a.orders and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [(o.kind, o.ranges) for o in a.orders] == [(OrderKind.RELEASE, (("p", 4, 3),))]
        assert registry.previous_owner(("p", 4, 3), "c") is None
        c.die()
    finally:
        a.die()
        b.die()
        registry.close()


def test_a_released_pipeline_is_released_on_the_old_owners_of_its_moved_ranges() -> None:
    """A query that ends right after a rebalance: the range's old owner still holds it (no
    hand-off happened), and no next boundary will come to release it there."""
    registry = HostRegistry(new_secret(), "127.0.0.1", liveness_timeout=5)
    a, b = FakeHost(registry, "a"), FakeHost(registry, "b")
    try:
        route_four_ranges(registry)
        c = FakeHost(registry, "c")
        assert [(m.index, m.source, m.target) for m in registry.rebalance("p", 4, 4)] == [
            (3, "a", "c")
        ]
        assert registry.release_pipeline("p") == 4
        deadline = time.monotonic() + 5
        while len(a.orders) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        released = {r for order in a.orders for r in order.ranges}
        assert {o.kind for o in a.orders} == {OrderKind.RELEASE}
        assert released == {("p", 4, 1), ("p", 4, 3)}  # its own range and the moved one
        assert registry.previous == {}
        c.die()
    finally:
        a.die()
        b.die()
        registry.close()


def _committed_runner(tmp_path: Path) -> LocalRunner:
    """Two ranges of a word count with the spill tier on, one epoch committed, then some of
    range 0's key groups moved to disk."""
    config = load_config({"spill.enabled": True, "spill.dirs": str(tmp_path / "spill")})
    runner = LocalRunner(WordCount, 2, checkpoint_uri=f"file://{tmp_path}/ckpt", config=config)
    words = [f"w{i % 97}" for i in range(600)]
    runner.process((w, None) for w in words)
    runner.checkpoint()
    instance = runner.instances[0]
    assert instance.spill is not None
    for key_group in list(instance.keyed.key_groups)[::3]:
        instance.spill.spill_key_group(key_group)
    assert instance.spill.spilled_key_groups()
    return runner


def test_a_handed_off_range_has_its_committed_state_and_reads_nothing_from_tier_2(
    tmp_path: Path,
) -> None:
    runner = _committed_runner(tmp_path)
    old = runner.instances[0]
    assert runner.store is not None
    committed = runner.store.manifest(1)
    prepared = prepare_handoff(old.keyed, old.operator_state, runner.store, 1, "zstd")
    handoff = HandOff(
        prepared.snapshot, {f.entry.path: f.data for f in prepared.uploads}, committed
    )
    new = FunctionInstance(
        WordCount, 0, 2, runner.max_parallelism, store=runner.store, handoff=handoff
    )
    try:
        assert new.restored_bytes == 0
        # every key of the range, spilled or not, carries on from its committed count
        mine = sorted({f"w{i}" for i in range(97)} & _keys(old))
        assert len(mine) > 10
        expected = [(w, c + 1) for w, c in _counts(old, mine)]
        assert new.process((w, None) for w in mine) == expected
        # the writer carries on the committed chains: its next snapshot is a delta
        mine_chains = {
            c.state: c.files
            for c in committed.chains()
            if c.key_groups == str(new.keyed.key_groups)
        }
        assert new.writer.chains() == mine_chains
    finally:
        new.close()
        runner.close()


def _keys(instance: FunctionInstance) -> set[str]:
    table = instance.keyed.tables["count"]
    return {k for kg in instance.keyed.key_groups for k in table.map_for(kg)}


def _counts(instance: FunctionInstance, words: list[str]) -> list[tuple[str, int]]:
    table = instance.keyed.tables["count"]
    out = []
    for word in words:
        kg = next(g for g in instance.keyed.key_groups if word in table.map_for(g))
        out.append((word, table.map_for(kg)[word]))
    return out


def test_a_hand_off_cut_mid_way_leaves_the_range_to_a_restore(tmp_path: Path) -> None:
    runner = _committed_runner(tmp_path)
    assert runner.store is not None
    secret = new_secret()

    def dies_after_the_header(conn: Connection) -> None:
        json.loads(conn.recv_bytes())
        conn.send_bytes(protocol.RESULT + json.dumps({"snapshot": _snapshot_part(runner)}).encode())
        conn.close()  # the old host's process ends here

    server = Server(secret, dies_after_the_header, "test-old-host")
    try:
        tcp = server.bind_tcp("127.0.0.1")
        old = HostInfo("old", 1, "1", "node", [tcp])
        request = HandOffRequest(("p", 2, 0), 1, "token")
        assert fetch_handoff(old, secret, request, runner.store.manifest(1)) is None
    finally:
        server.close()
        runner.close()


def _snapshot_part(runner: LocalRunner) -> object:
    """The manifest part a real hand-off of range 0 starts with."""
    old = runner.instances[0]
    assert runner.store is not None
    prepared = prepare_handoff(old.keyed, old.operator_state, runner.store, 1, "zstd")
    return snapshot_to_dict(prepared.snapshot)

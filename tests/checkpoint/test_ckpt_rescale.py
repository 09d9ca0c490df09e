"""Rescale property: whatever was done to the state, a checkpoint written at parallelism 4
(incremental, with deltas and tombstones) restores at 1, 3 and 8 with identical keyed contents,
and operator state is redistributed (even split keeps the order, union gives everyone all)."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.ttl import ManualClock

from tests.checkpoint.ckpt_support import (
    CLOCK_MS,
    MAX_P,
    Accumulate,
    Location,
    dump_keyed,
    dump_operator,
    restored_operator,
)

keys = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
epoch_records = st.lists(st.tuples(keys, st.integers(0, 9)), max_size=40)


def make(location: Location, uri: str, parallelism: int, trigger: int = 3) -> LocalRunner:
    return LocalRunner(
        Accumulate,
        parallelism,
        max_parallelism=MAX_P,
        checkpoint_uri=uri,
        storage_options=location.options,
        clock=ManualClock(CLOCK_MS),
        config=load_config({"compaction.delta-trigger": trigger}),
    )


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(epochs=st.lists(epoch_records, min_size=1, max_size=4))
def test_checkpoint_at_4_restores_at_1_3_8(
    location: Location, epochs: list[list[tuple[str, int]]]
) -> None:
    uri = f"{location.uri}/{uuid.uuid4().hex}"
    live = make(location, uri, 4)
    for records in epochs:
        live.process(records)
        live.checkpoint()
    assert live.checkpointer is not None
    live.checkpointer.drain()
    keyed, operator = dump_keyed(live), dump_operator(live)
    for parallelism in (1, 3, 8):
        restored = make(location, uri, parallelism)
        assert dump_keyed(restored) == keyed
        assert dump_operator(restored) == restored_operator(operator, parallelism)
    live.close()


def test_rescale_down_then_up_keeps_going(location: Location) -> None:
    """Checkpoints keep working after a rescale: new ranges write bases, then deltas again."""
    uri = location.uri
    expected: dict[str, Any] = {}
    for step, parallelism in enumerate((4, 1, 3, 8, 2)):
        runner = make(location, uri, parallelism)
        assert dump_keyed(runner) == expected
        for epoch in range(2):
            runner.process([(f"k{i}", step * 10 + epoch + 1) for i in range(step, 60, 3)])
            manifest = runner.checkpoint()
            kinds = {f.kind for f in manifest.keyed_files if f.epoch == manifest.epoch}
            assert kinds == ({"base"} if epoch == 0 else {"delta"})
        expected = dump_keyed(runner)
        runner.close()

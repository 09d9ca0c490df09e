"""Checkpoints of spilled key groups: the real spill tier moves half of every instance's key
groups to mmap'd files; full and incremental checkpoints read them through the mapping
interface, and restores (at another parallelism) return exactly the live state."""

from __future__ import annotations

from pathlib import Path

from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.ttl import ManualClock

from tests.checkpoint.ckpt_support import (
    CLOCK_MS,
    MAX_P,
    Accumulate,
    Location,
    dump_keyed,
    records,
)


def test_spilled_key_groups_checkpoint_and_restore(location: Location, tmp_path: Path) -> None:
    config = load_config(
        {
            "spill.enabled": True,
            "spill.dirs": str(tmp_path / "spill"),
            "memory.budget": "64g",
            "spill.check-interval": "1h",  # no automatic moves: the test decides
            "compaction.delta-trigger": 2,
        }
    )
    live = LocalRunner(
        Accumulate,
        4,
        max_parallelism=MAX_P,
        checkpoint_uri=location.uri,
        storage_options=location.options,
        clock=ManualClock(CLOCK_MS),
        config=config,
    )

    def spill_half() -> int:
        spilled = 0
        for instance in live.instances:
            assert instance.spill is not None
            for key_group in list(instance.keyed.key_groups)[::2]:
                instance.spill.spill_key_group(key_group)
            spilled += len(instance.spill.spilled_key_groups())
        return spilled

    try:
        live.process(records(1))
        assert spill_half() > 0
        live.checkpoint()  # full: spilled key groups read from disk
        for epoch in (2, 3, 4):
            live.process(records(epoch))  # writes into spilled key groups too
            assert spill_half() > 0  # the delta reads touched keys of spilled key groups
            manifest = live.checkpoint()
            assert {f.kind for f in manifest.keyed_files if f.epoch == epoch} == {"delta"}
            assert live.checkpointer is not None
            live.checkpointer.drain()
            restored = LocalRunner(
                Accumulate,
                3,
                checkpoint_uri=location.uri,
                storage_options=location.options,
                clock=ManualClock(CLOCK_MS),
            )
            assert dump_keyed(restored) == dump_keyed(live)
    finally:
        live.close()

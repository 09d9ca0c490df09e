"""Checkpoints read spilled key groups through the same interface: state survives a restore."""

from __future__ import annotations

import collections
from pathlib import Path

from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.tools.demo.local import read_counts
from statetier.tools.wordcount import WordCount


def test_epochs_with_spilled_key_groups_restore_exactly(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'checkpoints'}"
    config = load_config(
        {"spill.enabled": True, "spill.dirs": str(tmp_path / "spill"), "memory.budget": "64g"},
        env={},
    )
    words = [f"w{(n * 7919) % 900}" for n in range(9000)]
    runner = LocalRunner(WordCount, 2, max_parallelism=16, checkpoint_uri=uri, config=config)
    batches = [words[:3000], words[3000:6000], words[6000:]]
    for epoch, batch in enumerate(batches):
        runner.run_epoch((w, 1) for w in batch)
        for instance in runner.instances:
            spill = instance.spill
            assert spill is not None
            for key_group in instance.keyed.key_groups:
                # a different half on disk at each epoch: deltas and bases both see spilled groups
                if (key_group + epoch) % 2:
                    assert spill.spill_key_group(key_group)
                else:
                    spill.load_key_group(key_group)
            assert spill.spilled_key_groups()
    runner.close()
    assert read_counts(uri, 3) == collections.Counter(words)


def test_an_instance_reports_its_state_by_tier(tmp_path: Path) -> None:
    """What a Spark state host tells the driver in its heartbeat: heap bytes (estimated, as
    the spill tier weighs them) and spilled bytes, with the spill tier and without it."""
    from statetier.backend.runtime import FunctionInstance

    plain = FunctionInstance(WordCount, 0, 1, 16)
    assert plain.state_bytes() == (0, 0)
    plain.process((f"w{n}", 1) for n in range(5000))
    heap, spilled = plain.state_bytes()
    assert spilled == 0
    assert 5000 * 50 < heap < 5000 * 1000  # a str key and an int count, with the dict's share
    plain.process((f"v{n}", 1) for n in range(5000))
    assert 1.5 * heap < plain.state_bytes()[0] < 2.5 * heap

    config = load_config({"spill.enabled": True, "spill.dirs": str(tmp_path)}, env={})
    tiered = FunctionInstance(WordCount, 0, 1, 16, config=config)
    tiered.process((f"w{n}", 1) for n in range(5000))
    assert tiered.spill is not None
    tiered.spill.refresh_accounting()  # as a check leaves it (the host settles each range first)
    on_heap = tiered.state_bytes()
    assert on_heap[1] == 0 and 0.5 * heap < on_heap[0] < 2 * heap
    for key_group in list(tiered.keyed.key_groups)[:8]:
        tiered.spill.spill_key_group(key_group)
    half, spilled = tiered.state_bytes()
    assert 0.3 * on_heap[0] < half < 0.7 * on_heap[0] and spilled > 0
    tiered.close()

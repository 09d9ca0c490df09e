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

"""Eight ranges in one process under one governor, with a budget about half the state's size.

Run as ``python -m tests.spill.eight_ranges DIR``; prints one JSON line. A process of its own, so
that its RSS is the runtime's and the state's, not a test session's.
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any

from statetier.backend.config import load_config
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.keygroups import assign_to_key_group
from statetier.backend.local_runner import LocalRunner
from statetier.backend.process_memory import read_rss
from statetier.tools.wordcount import WordCount
from statetier.tools.workloads import batches, zipf_words

BUDGET = 12 << 20  # about half the state below (its heap estimate is about 25 MiB)
MAX_PARALLELISM = 128


def main() -> None:
    workdir = sys.argv[1]
    config = load_config(
        {
            "spill.enabled": True,
            "spill.dirs": f"{workdir}/spill",
            "memory.budget": BUDGET,
            "spill.check-interval": "20ms",
        },
        env={},
    )
    words = zipf_words(1_500_000, 1_500_000, seed=3)
    hits = collections.Counter(assign_to_key_group(w, MAX_PARALLELISM) for w in words)
    counts = collections.Counter(words)
    runner = LocalRunner(
        WordCount,
        8,
        max_parallelism=MAX_PARALLELISM,
        checkpoint_uri=f"file://{workdir}/checkpoints",
        config=config,
    )
    peak = 0
    for batch in batches(words, 12):
        # keys as a task receives them: new objects each batch (decoded from Arrow), not
        # the input's own strings
        runner.run_epoch((f"w{w[1:]}", 1) for w in batch)  # an epoch, then its checkpoint
        peak = max(peak, read_rss())
    managers = [i.spill for i in runner.instances if i.spill is not None]
    governor = managers[0].governor
    assert governor.monitor is not None
    spilled = {(i, kg) for i, m in enumerate(managers) for kg in m.spilled_key_groups()}
    for m in managers:
        m.refresh_accounting()
    state_bytes = sum(  # the state's heap size were it all on heap (estimated)
        m.accounting.total_heap() + sum(m.accounting.heap_if_loaded(slot) for slot in m.spilled)
        for m in managers
    )
    exact = True
    for instance in runner.instances:
        state = instance.keyed.get_state(ValueStateDescriptor[int]("count"))
        for key in list(instance.keyed.keys("count")):
            instance.keyed.set_current_key(key)
            exact = exact and state.value() == counts[key]
        exact = exact and sum(1 for _ in instance.keyed.keys("count")) == sum(
            1
            for w in counts
            if assign_to_key_group(w, MAX_PARALLELISM) in instance.keyed.key_groups
        )
    report: dict[str, Any] = {
        "governors": len({id(m.governor) for m in managers}),
        "spilled_ranges": sorted({i for i, _ in spilled}),
        "spilled_key_groups": len(spilled),
        "key_groups": MAX_PARALLELISM,
        "spilled_hits": sorted(hits[kg] for _, kg in spilled),
        "heap_hits": sorted(
            hits[kg] for kg in range(MAX_PARALLELISM) if kg not in {k for _, k in spilled}
        ),
        "peak_rss": peak,
        "runtime": governor.monitor.runtime,  # measured: what the allowance must cover
        "budget": BUDGET,
        "state_bytes": state_bytes,
        "exact": exact,
    }
    runner.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()

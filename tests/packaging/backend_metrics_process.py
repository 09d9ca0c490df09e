"""A real backend process for the metrics scrape:
``python backend_metrics_process.py PORT DIR [nospill]``.

It runs the reference word count (``statetier demo``'s function) through LocalRunner with the
spill tier on a tiny memory budget (so key groups spill and load) and a checkpoint per epoch on
file://, with ``metrics.port`` set as an executor would; it prints ``ready`` once the work is
done and then keeps serving /metrics until it is terminated.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main() -> None:
    from statetier.backend.config import load_config
    from statetier.backend.local_runner import LocalRunner
    from statetier.tools.wordcount import WordCount
    from statetier.tools.workloads import batches, zipf_words

    port, workdir = int(sys.argv[1]), Path(sys.argv[2])
    spill = sys.argv[3:] != ["nospill"]
    config = load_config(
        {
            "metrics.port": port,
            "spill.enabled": str(spill).lower(),
            "spill.dirs": str(workdir / "spill"),
            "memory.budget": "1m",
            "spill.check-interval": "0.01",
        },
        env={},
    )
    runner = LocalRunner(
        WordCount, 2, checkpoint_uri=f"file://{workdir / 'checkpoints'}", config=config
    )
    words = zipf_words(200_000, 100_000, seed=7)
    for batch in batches(words, 4):
        runner.run_epoch((w, 1) for w in batch)
    runner.close()
    print("ready", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()

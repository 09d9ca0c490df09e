"""The process the crash tests kill: runs epochs of the workload against a checkpoint location.

Usage: ``python -m tests.checkpoint.crash_writer URI EPOCHS`` with the storage options as JSON
in ``CKPT_OPTIONS`` and the fault plan in ``CKPT_FAULTS`` (see ckpt_faults). It resumes from the
latest committed epoch, and after each commit writes the operator state it holds to
``CKPT_OUT/opstate-N.json`` (before committing N) and prints ``committed N``.
"""

from __future__ import annotations

import json
import os
import sys

from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.ttl import ManualClock

from tests.checkpoint import ckpt_faults  # noqa: F401 - registers faulty://
from tests.checkpoint.ckpt_support import CLOCK_MS, MAX_P, Accumulate, dump_operator, records


def main() -> None:
    uri, epochs = sys.argv[1], int(sys.argv[2])
    options = json.loads(os.environ.get("CKPT_OPTIONS", "{}"))
    config = load_config(json.loads(os.environ.get("CKPT_CONFIG", "{}")))
    out = os.environ["CKPT_OUT"]
    runner = LocalRunner(
        Accumulate,
        4,
        max_parallelism=MAX_P,
        checkpoint_uri=uri,
        storage_options=options,
        clock=ManualClock(CLOCK_MS),
        config=config,
    )
    for epoch in range(runner.restored_epoch + 1, epochs + 1):
        runner.process(records(epoch))
        # LocalRunner.checkpoint, step by step: the operator state of the epoch is saved (whole,
        # by a rename) before the commit can happen, so the parent always finds it
        for instance in runner.instances:
            instance.before_snapshot(epoch)
        target = os.path.join(out, f"opstate-{epoch}.json")
        with open(f"{target}.tmp", "w") as f:
            json.dump(dump_operator(runner), f)
        os.replace(f"{target}.tmp", target)
        assert runner.checkpointer is not None
        manifest = runner.checkpointer.begin(epoch).result()
        runner.last_epoch = epoch
        print(f"committed {manifest.epoch}", flush=True)
    runner.close()


if __name__ == "__main__":
    main()

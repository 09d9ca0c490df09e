"""Crash tests: a writer process killed with SIGKILL between its data files and its manifest,
during an upload, during compaction, and at random moments. After every kill the latest
committed epoch restores exactly, and no committed manifest names a missing or partial file."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot.verify import verify_store
from statetier.backend.ttl import ManualClock

from tests.checkpoint.ckpt_support import (
    CLOCK_MS,
    Accumulate,
    Location,
    dump_keyed,
    dump_operator,
    expected_keyed,
    restored_operator,
)

ROOT = Path(__file__).parents[2]


def start(
    location: Location, out: Path, epochs: int, faults: list[dict[str, Any]], **config: Any
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CKPT_OPTIONS": json.dumps(location.faulty_options()),
        "CKPT_FAULTS": json.dumps(faults),
        "CKPT_CONFIG": json.dumps(config),
        "CKPT_OUT": str(out),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.checkpoint.crash_writer", location.faulty_uri, str(epochs)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_when(proc: subprocess.Popen[str], marker: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"writer exited before the fault point: {proc.stderr.read()}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the writer never reached the fault point")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def check_restores_last_commit(location: Location, out: Path) -> int:
    store = location.store()
    report = verify_store(store)  # every committed manifest: files present, whole, valid
    assert report.ok, report.problems
    epochs = store.epochs()
    if not epochs:
        return 0
    latest = epochs[-1]
    for parallelism in (4, 3):
        runner = LocalRunner(
            Accumulate,
            parallelism,
            checkpoint_uri=location.uri,
            storage_options=location.options,
            clock=ManualClock(CLOCK_MS),
        )
        assert runner.restored_epoch == latest
        assert dump_keyed(runner) == expected_keyed(latest)
        written = json.loads((out / f"opstate-{latest}.json").read_text())
        split, unions = restored_operator(written, parallelism)
        assert json.loads(json.dumps(dump_operator(runner))) == [split, unions]
    return latest


@pytest.mark.slow
@pytest.mark.parametrize(
    "point, faults, config, committed",
    [
        ("before the manifest", [{"op": "commit", "match": "manifests/epoch-0000000003"}], {}, 2),
        (
            "during an upload",
            [{"op": "write", "match": "data/epoch-0000000003", "times": 5}],
            {},
            2,
        ),
        (
            "during compaction",
            [{"op": "write", "match": "/compacted/"}],
            {"compaction.delta-trigger": 2},
            None,
        ),
    ],
)
def test_kill_at_a_fault_point(
    location: Location,
    tmp_path: Path,
    point: str,
    faults: list[dict[str, Any]],
    config: dict[str, Any],
    committed: int | None,
) -> None:
    marker = tmp_path / "blocked"
    for fault in faults:
        fault.update(mode="block", marker=str(marker))
    proc = start(location, tmp_path, 6, faults, **config)
    kill_when(proc, marker)
    latest = check_restores_last_commit(location, tmp_path)
    if committed is not None:
        assert latest == committed, point
    # a new writer resumes from there and commits on top
    proc = start(location, tmp_path, latest + 2, [])
    assert proc.wait(120) == 0, proc.stderr.read()  # type: ignore[union-attr]
    assert check_restores_last_commit(location, tmp_path) == latest + 2


@pytest.mark.slow
def test_kill_at_random_moments(location: Location, tmp_path: Path) -> None:
    rnd = random.Random(4)
    for _ in range(3):
        proc = start(location, tmp_path, 200, [], **{"compaction.delta-trigger": 3})
        assert proc.stdout is not None
        proc.stdout.readline()  # the first epoch of this run is committed
        time.sleep(rnd.uniform(0.05, 1.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        check_restores_last_commit(location, tmp_path)
    assert location.store().epochs()  # something was committed along the way

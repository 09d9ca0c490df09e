"""A script that ends without closing its LocalRunner: at most one line at exit, nothing lost.

The runner's checkpoint work (compaction after each commit) runs on background threads; at
interpreter exit concurrent.futures refuses new work, which used to print one warning per chain
("cannot schedule new futures after interpreter shutdown"), naming no cause.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from statetier.backend import LocalRunner

from tests.backend.exit_script_function import Count

SCRIPT = textwrap.dedent(
    """
    import sys
    from statetier.backend import LocalRunner
    from tests.backend.exit_script_function import Count

    runner = LocalRunner(Count, parallelism=2, checkpoint_uri=sys.argv[1])
    for epoch in range(12):
        list(runner.run_epoch((f"k{i % 50}", 1) for i in range(2000)))
    if sys.argv[2] == "close":
        runner.close()
    print("done")
    """
)


def _run(tmp_path: Path, uri: str, close: bool) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), uri, "close" if close else "leave"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},  # (tests.backend)
    )


def test_an_unclosed_runner_says_one_line_at_exit_and_loses_nothing(tmp_path: Path) -> None:
    uri = (tmp_path / "ckpt").as_uri()
    done = _run(tmp_path, uri, close=False)
    assert done.returncode == 0 and done.stdout.strip() == "done", done
    lines = done.stderr.strip().splitlines()
    assert len(lines) <= 1, done.stderr
    if lines:
        assert "close the runner" in lines[0] and "interpreter shutdown" not in lines[0]
    resumed = LocalRunner(Count, parallelism=3, checkpoint_uri=uri)
    try:
        assert resumed.last_epoch == 12
        outputs = dict(resumed.run_epoch([("k7", 1)]))
        assert outputs == {"k7": 12 * 40 + 1}  # 2000 records over 50 keys, 12 epochs
    finally:
        resumed.close()


def test_a_closed_runner_says_nothing(tmp_path: Path) -> None:
    done = _run(tmp_path, (tmp_path / "ckpt").as_uri(), close=True)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


POOL_AT_EXIT = textwrap.dedent(
    """
    import concurrent.futures, threading, time
    from statetier.backend.snapshot.chain_compaction import _exiting

    reads = concurrent.futures.ThreadPoolExecutor(2)  # a compaction's parallel reads
    reads.submit(time.sleep, 0).result()  # its worker now waits on the pool's queue

    def compaction() -> None:  # runs on the upkeep pool's worker, past the script's end
        time.sleep(0.5)  # the exit hook wakes the reads' worker, which marks its pool
        try:
            reads.submit(time.sleep, 0)
        except RuntimeError as e:
            alive = threading.main_thread().is_alive()
            print(repr(str(e)), "main alive" if alive else "main ended", _exiting(e))

    upkeep = concurrent.futures.ThreadPoolExecutor(1)
    upkeep.submit(compaction)
    print("other", _exiting(RuntimeError("a compaction returned 2 outputs, not one")))
    """
)


def test_a_pool_that_refuses_work_at_exit_is_taken_for_the_exit_whatever_its_wording() -> None:
    # concurrent.futures' exit hook joins the upkeep thread before the main thread is marked
    # stopped, and wakes the reads' idle worker, which marks its pool shut down: the refusal
    # says "after shutdown" while the main thread is alive (a CI run warned of a failed
    # compaction beside the exit line)
    done = subprocess.run(
        [sys.executable, "-c", POOL_AT_EXIT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "other False", done
    assert lines[1] == "'cannot schedule new futures after shutdown' main alive True", done

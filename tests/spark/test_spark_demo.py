"""``statetier demo``: the Spark streaming word count on SeaweedFS, then ``--restart``, Ctrl-C, the
object store kept running and the ``statetier checkpoint`` command the demo prints."""

from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.spark.conftest import REPO, spark_env
from tests.spark.spark_support import host_pids

DEMO = [sys.executable, "-m", "statetier.backend", "demo"]


# marks the demos' processes, down to their state hosts: another pytest worker's Spark tests
# start hosts of their own meanwhile
DEMO_MARK = f"{os.getpid()}-{time.time_ns()}"
MARKED = f"STATETIER_TEST_DEMO={DEMO_MARK}"  # as host_pids finds it in a process's environment


def demo_env() -> dict[str, str]:
    return {**os.environ, **spark_env(), "STATETIER_TEST_DEMO": DEMO_MARK}


class Running:
    """A demo process in a session of its own (Ctrl-C goes to its whole group, as a terminal
    sends it), its output lines read as they come."""

    def __init__(self, args: list[str] | str, env: dict[str, str] | None = None) -> None:
        """``args``, or a command line (a string) for a shell, run in the repository (the
        shell replaces itself with the command, which then gets the Ctrl-C itself)."""
        if isinstance(args, str):
            args = f"exec {args}"
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
            env=env or demo_env(), start_new_session=True, shell=isinstance(args, str),
        )  # fmt: skip
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.seen: list[tuple[str, str]] = []
        for name in ("stdout", "stderr"):
            stream = getattr(self.process, name)
            threading.Thread(target=self._read, args=(name, stream), daemon=True).start()

    def _read(self, name: str, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.put((name, line.rstrip("\n")))

    def wait_for(self, text: str, timeout: float = 240) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                name, line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.process.poll() is None, f"demo exited: {self.seen[-20:]}"
                continue
            self.seen.append((name, line))
            if text in line:
                return line
        raise AssertionError(f"{text!r} not seen: {self.seen[-20:]}")

    def ctrl_c(self) -> list[tuple[str, str]]:
        """Ctrl-C; the output that followed it."""
        self._drain()
        before = len(self.seen)
        os.killpg(self.process.pid, signal.SIGINT)
        self.process.wait(120)
        self._drain()
        return self.seen[before:]

    def _drain(self) -> None:
        time.sleep(0.5)  # the reader threads empty the pipes
        while not self.lines.empty():
            self.seen.append(self.lines.get())


def hosts_gone(before: set[int], timeout: float = 15) -> bool:
    """Whether every state host started since ``before`` exited (they may take a moment)."""
    deadline = time.monotonic() + timeout
    while host_pids(MARKED) - before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def fresh_shell_env() -> dict[str, str]:
    """The environment of a new login shell: no virtual environment active, a plain PATH."""
    return {"HOME": os.environ.get("HOME", "/"), "PATH": "/usr/local/bin:/usr/bin:/bin"}


def run_printed(command: str) -> subprocess.CompletedProcess[str]:
    """A command line as the demo printed it, run by a fresh shell in the demo's directory."""
    return subprocess.run(
        command, shell=True, capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
        env=fresh_shell_env(),
    )  # fmt: skip


# Each demo run starts a JVM, a SeaweedFS server and a state host: alone a run takes under a
# minute, beside a loaded machine's other work (load 12-20 on 2 cores) over 100 s. These tests run
# several in a row, so their budget is the sum of their runs' hang guards, not pytest's default
# for one test (300 s), which a fresh clone's `make test` under load exceeded.
SEVERAL_RUNS = pytest.mark.timeout(1200)


@pytest.mark.slow
@SEVERAL_RUNS
def test_demo_spills_checkpoints_to_seaweedfs_and_resumes_exactly(tmp_path: Path) -> None:
    before = host_pids()
    args = [
        *DEMO, "--words", "60000", "--vocabulary", "20000", "--batches", "4", "--budget", "1m",
        "--dir", str(tmp_path / "d"),
    ]  # fmt: skip
    first = subprocess.run(
        args, capture_output=True, text=True, timeout=300, check=False, cwd=REPO, env=demo_env()
    )
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert "none (fresh start)" in first.stdout
    assert "on SeaweedFS http://127.0.0.1:" in first.stdout
    serve = next(x for x in first.stdout.splitlines() if "demo --serve" in x).strip()
    assert serve.endswith(f"statetier demo --serve --dir {tmp_path / 'd'}"), serve
    second = subprocess.run(
        [*args, "--restart"], capture_output=True, text=True, timeout=300, check=False,
        cwd=REPO, env=demo_env(),
    )  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert "resumed from epoch  2" in second.stdout
    assert "epochs 3-4" in second.stdout
    for out in (first.stdout, second.stdout):
        line = next(x for x in out.splitlines() if "counts exact" in x)
        assert line.split()[-1] == "True"
        spill = next(x for x in out.splitlines() if "spill ratio" in x)
        assert "(max 0;" not in spill  # key groups spilled under the 1m budget
    assert "[Stage" not in first.stderr + second.stderr  # no progress bar under the summary
    assert hosts_gone(before)  # the demo stopped its state hosts

    # --serve, as printed and run by a fresh shell, brings the object store back on the demo's
    # data; the command it prints reads it
    served = Running(serve, env=fresh_shell_env())
    listing = run_printed(served.wait_for("statetier checkpoint list"))
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines()[-1].split()[0] == "4"  # the latest epoch
    served.wait_for("Ctrl-C stops it.")
    after = served.ctrl_c()
    assert served.process.returncode == 0
    assert [line for _, line in after] == ["stopped the object store"]


@pytest.mark.slow
@SEVERAL_RUNS
def test_ctrl_c_stops_in_a_few_lines_and_the_restart_is_exact(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    args = [
        *DEMO, "--words", "120000", "--vocabulary", "20000", "--batches", "8",
        "--dir", str(directory),
    ]  # fmt: skip
    before = host_pids()
    demo = Running(args)
    deadline = time.monotonic() + 240
    while not (directory / "spark-checkpoint" / "commits" / "1").exists():
        assert demo.process.poll() is None, demo.seen
        assert time.monotonic() < deadline, "no micro-batch was committed"
        time.sleep(0.2)
    assert host_pids(MARKED) - before, "hosts_gone would not see the demo's hosts"
    after = demo.ctrl_c()
    assert demo.process.returncode == 130, after
    assert len(after) < 10, after
    restart = next(line for _, line in after if "demo --restart" in line).strip()
    assert restart.endswith(f"statetier demo --restart --dir {directory}"), restart
    assert hosts_gone(before)
    assert not (directory / "spark-tmp").exists()  # the killed JVM's temp dirs were removed

    # the printed restart, run by a fresh shell (the same input sizes, the object store kept)
    sizes = shlex.join(args[len(DEMO) : args.index("--dir")])
    resumed = Running(
        f"{restart} {sizes} --keep-running",
        env={**fresh_shell_env(), **spark_env(), "STATETIER_TEST_DEMO": DEMO_MARK},
    )
    exact = resumed.wait_for("counts exact")
    assert exact.split()[-1] == "True", resumed.seen
    listing = run_printed(resumed.wait_for("statetier checkpoint list"))
    assert listing.returncode == 0, listing.stderr
    # micro-batch b is epoch b + 1; usually 8 batches, but a kill between Spark's source log
    # and its offset log makes the restart put two files in one micro-batch
    batches = [int(f.name) for f in (directory / "spark-checkpoint" / "commits").iterdir()
               if f.name.isdigit()]  # fmt: skip
    assert listing.stdout.splitlines()[-1].split()[0] == str(max(batches) + 1)
    assert max(batches) + 1 in (7, 8)
    resumed.ctrl_c()
    assert resumed.process.returncode == 0, resumed.seen


def test_a_restart_with_nothing_committed_says_fresh_start_and_not_resumed() -> None:
    from statetier.tools.demo.spark import resumed_from

    assert resumed_from(restart=True, stored=[3, 4]) == "4"
    after_early_ctrl_c = resumed_from(restart=True, stored=[])
    assert after_early_ctrl_c.startswith("none (fresh start")
    assert "no epoch was committed" in after_early_ctrl_c


def test_a_restart_with_no_new_input_says_so_rather_than_a_rate_of_zero() -> None:
    """A ``--restart`` whose input files are all in the checkpoint processes no record: the
    summary says so, rather than ``records/s 0`` and ``warm-hit rate 0%``, which read as a
    fault. (The restart itself is the first test's second run, which resumes exactly.)"""
    from statetier.tools.demo.spark import rates

    rows = dict(rates([], records=0, elapsed=3.0, warm_hit_rate=0.0))
    assert list(rows) == ["records/s"]
    assert rows["records/s"].startswith("nothing new was processed")
    busy = dict(rates([], records=6000, elapsed=3.0, warm_hit_rate=1.0))
    assert busy["records/s"].startswith("2,000 ") and busy["warm-hit rate"].startswith("100%")


def test_printed_commands_name_the_statetier_a_fresh_shell_finds(tmp_path: Path) -> None:
    from statetier.tools.demo.shell import statetier_program

    program = statetier_program()  # this process has no venv on a fresh shell's PATH
    found = subprocess.run(
        f"{program} --version", shell=True, capture_output=True, text=True, timeout=60,
        check=False, env=fresh_shell_env(), cwd=Path.cwd(),
    )  # fmt: skip
    assert found.returncode == 0, (program, found.stderr)
    assert found.stdout.startswith("statetier "), found.stdout

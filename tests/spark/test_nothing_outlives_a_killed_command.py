"""A ``statetier demo`` or ``statetier bench`` stopped from outside (SIGTERM: ``timeout``, a CI
limit, ``kill``; SIGKILL: an out-of-memory killer, pytest's own kill of a hung subprocess) leaves
no process behind: not its SeaweedFS server, compaction gateway or worker, Spark JVM, state
host or merge process. Stopped by SIGTERM, it leaves nothing in its temp dir either (the demo
kills its JVM, which then cannot remove Spark's temp dirs itself).

Every process a command starts inherits its environment, so a marker variable finds them all,
whoever their parent is after the command died (orphans are adopted by init) and whatever the
servers of other tests running beside this one are called.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark.conftest import REPO, spark_env

STATETIER = [sys.executable, "-m", "statetier.backend"]
MARKER = "STATETIER_TEST_LIFETIME"


def marked(value: str) -> dict[int, str]:
    """Running processes whose environment holds ``MARKER=value``: pid -> command line."""
    wanted = f"{MARKER}={value}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie holds nothing: its parent only has not reaped it yet
        except OSError:
            continue
        found[int(entry)] = command.strip()
    return found


@pytest.fixture
def command_temp() -> Iterator[Path]:
    """The temp dir of the command under test, removed after the test: what a command killed
    with SIGKILL cannot remove (its object store's socket folder, the benchmark's work folder,
    Spark's own temp dirs) stays out of the machine's. Made in the machine's temp dir, not in
    pytest's folder, whose long path would put SeaweedFS's Unix socket beneath it at the length
    limit."""
    folder = Path(tempfile.mkdtemp(prefix="st-killed-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start(args: list[str], value: str, temp: Path, log: Path) -> subprocess.Popen[bytes]:
    """The command in a session of its own (as a CI runner or ``timeout`` starts it), marked,
    with ``temp`` as its temp dir and its JVMs', its output in ``log`` (kept out of ``temp``,
    which a stopped command must leave empty)."""
    options = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} -Djava.io.tmpdir={temp}".strip()
    env = {
        **os.environ, **spark_env(), MARKER: value, "TMPDIR": str(temp),
        "JAVA_TOOL_OPTIONS": options,
    }  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            [*STATETIER, *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def wait_until_running(
    command: subprocess.Popen[bytes], value: str, kinds: list[str], log: Path
) -> None:
    """Until a marked process of each kind (a substring of its command line) runs."""
    deadline = time.monotonic() + 240
    while True:
        running = " | ".join(marked(value).values())
        if all(kind in running for kind in kinds):
            return
        if command.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"the command ended early ({command.returncode}); its output ends:\n{tail}")
        assert time.monotonic() < deadline, f"not all of {kinds} started: {running}"
        time.sleep(0.5)


def left_behind(value: str, timeout: float = 60) -> dict[int, str]:
    """The marked processes still running after ``timeout`` s (they may take a moment)."""
    deadline = time.monotonic() + timeout
    while (alive := marked(value)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def stop_and_check(command: subprocess.Popen[bytes], value: str, signum: int) -> None:
    """Send ``signum`` to the command alone (not its group), then: nothing of it is left."""
    command.send_signal(signum)
    command.wait(120)
    alive = left_behind(value)
    for pid in alive:  # this test's own processes: do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert alive == {}, alive
    if signum == signal.SIGTERM:
        assert command.returncode == 130, command.returncode  # stopped as by Ctrl-C


@pytest.mark.slow
@pytest.mark.timeout(600)  # the command's start (240 s under load), its stop, then 60 s
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_demo_stopped_mid_run_leaves_no_process(
    signum: int, tmp_path: Path, command_temp: Path
) -> None:
    value = uuid.uuid4().hex
    args = [
        "demo", "--words", "400000", "--vocabulary", "20000", "--batches", "16",
        "--dir", str(tmp_path / "d"),
    ]  # fmt: skip
    log = tmp_path / "demo.log"
    demo = start(args, value, command_temp, log)
    wait_until_running(demo, value, ["weed", "java", "statetier.backend.spark.host"], log)
    stop_and_check(demo, value, signum)
    if signum == signal.SIGTERM:  # stopped as by Ctrl-C: what it made in a temp dir is gone
        assert sorted(p.name for p in command_temp.iterdir()) == []
        assert not (tmp_path / "d" / "spark-tmp").exists()  # the killed JVM's temp dir


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_benchmark_stopped_mid_run_leaves_no_process(
    signum: int, tmp_path: Path, command_temp: Path
) -> None:
    value = uuid.uuid4().hex
    log = tmp_path / "bench.log"
    bench = start(["bench", "compaction-offload", "--quick"], value, command_temp, log)
    kinds = ["weed", "statetier.compaction.cli gateway", "statetier.compaction.cli worker"]
    wait_until_running(bench, value, [*kinds, "java", "statetier.backend.spark.host"], log)
    stop_and_check(bench, value, signum)
    if signum == signal.SIGTERM:
        assert sorted(p.name for p in command_temp.iterdir()) == []

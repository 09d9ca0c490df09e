"""make sandbox and make e2e-kind behave as documented."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from statetier.operator import cli

from tests.uninstalled import run_without

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sandbox_narrates_what_the_operator_did() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "statetier.operator.cli", "sandbox", "--repo", str(REPO)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for expected in (
        "deployment.apps/compaction-workers",
        "http://compaction-gateway.default.svc:8080   1         1         True",
        "compaction-workers replicas=4",
        "spark.statetier.spill.dirs = /var/lib/statetier/spill",
        "spark.statetier.compaction.endpoints = http://compaction-gateway.default.svc:8080",
        "denied the request: annotation statetier.io/spill-volume='nvme' is not valid",
        "SparkApplication/wordcount StatetierConfigured",
        "statetier_operator_managed_applications 1.0",
        "No resources found in default namespace.",
        "done: everything the sandbox started has stopped",
    ):
        assert expected in out, expected


@pytest.mark.skipif(
    shutil.which("docker") is not None and shutil.which("kind") is not None,
    reason="Docker and kind exist here: make e2e-kind would create a real cluster",
)
def test_e2e_kind_skips_cleanly_without_docker_or_kind() -> None:
    env = {**os.environ, "BIN": str(Path(sys.executable).parent)}
    proc = subprocess.run(
        ["bash", str(REPO / "operator" / "e2e-kind.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0
    assert "e2e-kind: skipped:" in proc.stdout


@pytest.mark.parametrize("command", ["sandbox", "bench"])
def test_sandbox_and_bench_come_from_the_kubetest_distribution(command: str) -> None:
    dist = cli.installed_commands()[command].dist
    assert dist is not None and dist.name == "statetier-kubetest"
    proc = subprocess.run(
        ["statetier-operator", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: statetier-operator {command}")


@pytest.mark.parametrize("command", sorted(cli.KUBETEST_COMMANDS))
def test_without_kubetest_sandbox_and_bench_say_what_to_install(
    command: str, tmp_path: Path
) -> None:
    result = run_without("statetier-kubetest", tmp_path / "site", "statetier.operator.cli", command)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr == (
        f"statetier-operator {command} comes with the statetier-kubetest package: "
        "pip install statetier-kubetest, or from a statetier checkout: pip install ./kubetest\n"
    )


@pytest.mark.slow
def test_bench_measures_apply_to_deployments() -> None:
    from statetier.kubetest.bench import measure

    samples = measure(runs=3)
    assert len(samples) == 3
    assert all(0 < s < 5 for s in samples), samples

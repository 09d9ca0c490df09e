"""The ``statetier`` command: demo, bench and config subcommands end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from statetier.backend import cli


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statetier.backend", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
    )


def test_demo_counts_exactly_and_resumes(tmp_path: Path) -> None:
    args = [
        "demo",
        "--local",
        "--words",
        "20000",
        "--vocabulary",
        "2000",
        "--dir",
        str(tmp_path / "d"),
    ]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert "counts exact = True" in first.stdout
    assert "fresh start" in first.stdout
    second = run_cli(*args, "--restart", "--restore-parallelism", "5")
    assert second.returncode == 0, second.stderr
    assert "resumed from epoch  10" in second.stdout
    assert "parallelism 5: counts exact = True" in second.stdout


def test_bench_state_reports_every_mode_as_json() -> None:
    result = run_cli("bench", "state", "--records", "20000", "--repeats", "1", "--json")
    report = json.loads(result.stdout)
    assert set(report["modes"]) == {
        "dict",
        "value_state",
        "list_state_add",
        "map_state_put",
        "keyed_function",
    }
    assert all(m["records_per_s"] > 0 for m in report["modes"].values())
    assert result.returncode == (0 if report["meets_target"] else 1)


def test_config_show_reports_a_bad_value() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "statetier.backend", "config", "show"],
        capture_output=True,
        text=True,
        env={"STATETIER_SPILL_RATIO": "2", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 2
    assert "STATETIER_SPILL_RATIO='2' (setting spill.ratio)" in result.stderr


def test_unknown_arguments_are_refused() -> None:
    try:
        cli.main(["config", "docs", "--bogus"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("an unknown argument must fail")

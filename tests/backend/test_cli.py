"""The ``statetier`` command: demo, bench and config subcommands end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from statetier.backend import cli
from statetier.tools import commands
from statetier.tools.ports import free_port

from tests.uninstalled import run_without


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


def run_env(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The command with ``env`` added to a clean environment (no STATETIER_*, no AWS_*)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("STATETIER_", "AWS_"))}
    return subprocess.run(
        [sys.executable, "-m", "statetier.backend", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env={**base, **env},
    )


def assert_short_failure(result: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, one or two lines on stderr, no traceback, naming the problem."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout + result.stderr
    assert 1 <= len(lines) <= 2, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_demo_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = run_cli("demo", "--local", "--words", "1000", "--dir", str(mine))
    assert_short_failure(result, str(mine), "not empty", "--dir")
    assert (mine / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_the_two_demos_do_not_share_state(tmp_path: Path) -> None:
    local = run_cli("demo", "--local", "--words", "2000", "--vocabulary", "200", cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    made = tmp_path / "statetier-demo-local"
    assert (made / "checkpoints").is_dir()
    assert not (tmp_path / "statetier-demo").exists()  # the Spark demo's default is elsewhere
    spark = run_cli("demo", "--dir", str(made))  # refused before Spark starts
    assert_short_failure(spark, "statetier demo --local", "another --dir")
    restart = run_cli("demo", "--restart", "--dir", str(made))
    assert_short_failure(restart, "nothing to restart")
    assert (made / "checkpoints").is_dir()
    again = run_cli("demo", "--local", "--words", "2000", "--vocabulary", "200", cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # its own directory: started afresh
    assert "fresh start" in again.stdout


def test_restart_without_an_earlier_run_is_refused(tmp_path: Path) -> None:
    result = run_cli("demo", "--local", "--restart", "--dir", str(tmp_path / "new"))
    assert_short_failure(result, "nothing to restart", "without --restart")
    assert not (tmp_path / "new").exists()


def test_version_and_help_at_every_level() -> None:
    version = run_cli("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"statetier {metadata.version('statetier-backend')}"
    for args in HELP_COMMANDS:
        result = run_cli(*args, "--help")
        assert result.returncode == 0, (args, result.stderr)
        assert result.stdout.startswith("usage: statetier"), (args, result.stdout)
    assert "--local" in run_cli("demo", "--help").stdout
    assert "write_stream" in run_cli("demo", "--help").stdout
    assert "foreachBatch" not in run_cli("demo", "--help").stdout


HELP_COMMANDS: list[tuple[str, ...]] = [
    (),
    ("demo",),
    ("demo", "--local"),
    ("bench",),
    *[("bench", name) for name in commands.BENCHMARKS],
    ("checkpoint",),
    *[("checkpoint", action) for action in ("list", "inspect", "verify", "gc")],
    ("config",),
    ("config", "docs"),
    ("config", "show"),
]


@pytest.mark.parametrize(
    "args",
    [
        ("demo", "--local", "--words", "10"),
        ("checkpoint", "list", "file:///nowhere"),
        ("checkpoint", "gc", "file:///nowhere"),
        ("config", "show"),
    ],
)
def test_a_mistyped_variable_is_refused_with_a_suggestion(args: tuple[str, ...]) -> None:
    result = run_env(*args, env={"STATETIER_SPIL_RATIO": "0.3"})
    assert_short_failure(
        result,
        "unknown environment variable STATETIER_SPIL_RATIO",
        "did you mean STATETIER_SPILL_RATIO?",
    )


def test_a_bad_value_is_refused_by_the_demo(tmp_path: Path) -> None:
    result = run_env(
        "demo", "--local", "--dir", str(tmp_path / "d"), env={"STATETIER_SPILL_RATIO": "2"}
    )
    assert_short_failure(result, "STATETIER_SPILL_RATIO='2'", "spill.ratio")
    assert not (tmp_path / "d").exists()


def test_gc_on_a_mistyped_uri_fails_and_deletes_nothing(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "epoch-0000000001").write_text("not a checkpoint")
    result = run_cli("checkpoint", "gc", f"file://{tmp_path}")
    assert_short_failure(result, "no committed snapshot", str(tmp_path))
    assert (tmp_path / "data" / "epoch-0000000001").exists()
    unknown = run_cli("checkpoint", "gc", "s4://bucket/prefix")
    assert_short_failure(unknown, "Protocol not known: s4")


def test_a_refused_endpoint_fails_in_seconds_with_the_defaults() -> None:
    started = time.monotonic()
    result = run_env(
        "checkpoint", "list", "s3://bucket/prefix", "-o",
        f"endpoint_url=http://127.0.0.1:{free_port()}",
        env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"},
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert_short_failure(result, "still failing after 6 attempts", "Could not connect")
    assert elapsed < 10, f"{elapsed:.1f} s"


def test_missing_credentials_say_what_to_set(tmp_path: Path) -> None:
    result = run_env(
        "checkpoint", "list", "s3://bucket/prefix", "-o",
        f"endpoint_url=http://127.0.0.1:{free_port()}",
        env={"HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"},
    )  # fmt: skip
    assert_short_failure(result, "credentials", "AWS_ACCESS_KEY_ID")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("a file")
    result = run_cli("demo", "--local", "--dir", str(tmp_path / "x"), "--debug")
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "DemoDirError" in result.stderr


def test_demo_and_bench_are_the_tools_distributions_commands() -> None:
    installed = cli.tool_commands()
    assert set(cli.TOOL_COMMANDS) <= set(installed)
    for name in cli.TOOL_COMMANDS:
        dist = installed[name].dist
        assert dist is not None and dist.name == "statetier-tools"
    listing = run_cli("bench", "--help")  # through the entry point, in a fresh process
    assert listing.returncode == 0, listing.stderr
    assert all(name in listing.stdout for name in commands.BENCHMARK_HELP)


@pytest.mark.parametrize("command", sorted(cli.TOOL_COMMANDS))
def test_without_the_tools_a_tool_command_says_what_to_install(
    command: str, tmp_path: Path
) -> None:
    result = run_without("statetier-tools", tmp_path / "site", "statetier.backend.cli", command)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr == (
        f"statetier {command} comes with the statetier-tools package: pip install statetier-tools,"
        " or from a statetier checkout: pip install ./tools (make install sets up everything)\n"
    )

"""ruff and mypy --strict hold for the tree: ``make lint`` runs these tests (with the import
contracts' tree test in test_import_contracts.py), and ``make test`` runs them too, since CI runs
only ``make test`` (a ruff failure once stayed on main for six commits)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = [*sorted(REPO.glob("examples/*/example.py")), REPO / "examples/kubernetes/wordcount.py"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO, timeout=600,
        check=False,
    )  # fmt: skip


def test_ruff_finds_nothing_and_formats_nothing() -> None:
    checked = run("ruff", "check", ".")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    formatted = run("ruff", "format", "--check", ".")
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


@pytest.mark.slow
def test_mypy_strict_passes_on_the_packages_and_each_example() -> None:
    # one test, so that no two mypy processes write the cache at once
    tree = run("mypy")
    assert tree.returncode == 0, tree.stdout + tree.stderr
    # the examples share the module name example.py, so each is checked on its own
    for example in EXAMPLES:
        checked = run("mypy", "--strict", str(example.relative_to(REPO)))
        assert checked.returncode == 0, checked.stdout + checked.stderr

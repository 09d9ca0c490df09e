"""The import contracts of .importlinter hold for the tree, and a forbidden import breaks them.

The first test runs `lint-imports` on the tree (`make lint` runs it, and `make test` with every
other test). The others copy the five packages to a temporary directory, add one import that the
layers described in docs/architecture.md forbid, and run `lint-imports` with the project's own
contracts on the copy (first on the import path, so it shadows the installed packages): the
contract that names that rule must break and name the import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".importlinter"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = {
    "backend": REPO / "backend/src/statetier/backend",
    "compaction": REPO / "compaction/src/statetier/compaction",
    "operator": REPO / "operator/src/statetier/operator",
    "tools": REPO / "tools/src/statetier/tools",
    "kubetest": REPO / "kubetest/src/statetier/kubetest",
}


def lint_imports(*args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contracts; ``path`` goes first on PYTHONPATH."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(CONFIG), "--no-cache", "--no-logo", *args],
        cwd=path or REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def copy_tree(root: Path) -> Path:
    """The five packages under ``root``/statetier, a namespace package as installed."""
    for name, source in PACKAGES.items():
        shutil.copytree(
            source, root / "statetier" / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "bad_import", "contract", "named"),
    [
        # a bottom module reaching up to the runtime
        (
            "backend/keygroups.py",
            "from statetier.backend import runtime",
            "backend-layers",
            "statetier.backend.keygroups -> statetier.backend.runtime",
        ),
        # the compaction service's worker using the developer tools' process launcher
        (
            "compaction/worker.py",
            "from statetier.tools import compaction_launch",
            "runtime-no-dev-code",
            "statetier.compaction.worker -> statetier.tools.compaction_launch",
        ),
        # the operator's command reaching into the Kubernetes test environment
        (
            "operator/cli.py",
            "from statetier.kubetest import sandbox",
            "runtime-no-dev-code",
            "statetier.operator.cli -> statetier.kubetest.sandbox",
        ),
        # a handler module importing another (each registers handlers when imported)
        (
            "operator/webhooks.py",
            "from statetier.operator import sparkapp_handlers",
            "operator-layers",
            "statetier.operator.webhooks -> statetier.operator.sparkapp_handlers",
        ),
        # a cycle inside the spill tier (the manager imports the storage)
        (
            "backend/spill/storage.py",
            "from statetier.backend.spill import manager",
            "acyclic",
            ".storage -> .manager",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, bad_import: str, contract: str, named: str
) -> None:
    root = copy_tree(tmp_path)
    target = root / "statetier" / module
    target.write_text(target.read_text() + f"\n{bad_import}  # deliberately forbidden\n")
    result = lint_imports("--contract", contract, path=root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert named in result.stdout

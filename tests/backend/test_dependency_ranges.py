"""The backend installs beside the user's Spark: compatible ranges, not pins, and a real resolve.

The backend goes into users' Spark images next to their own libraries, so its pyproject declares
ranges; the exact versions the project is tested with live in requirements-dev.txt only. The
resolve runs pip's resolver as a fresh environment would (``--ignore-installed``, ``--dry-run``:
nothing is installed) for the Spark versions the pipeline supports.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
BACKEND = REPO / "backend"


def declared() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((BACKEND / "pyproject.toml").read_text())["project"]
    return project


def requirements() -> list[str]:
    project = declared()
    found: list[str] = list(project["dependencies"])
    for group in project.get("optional-dependencies", {}).values():
        found.extend(group)
    return found


def test_libraries_declare_ranges_not_pins() -> None:
    pinned = [r for r in requirements() if "==" in r or "===" in r]
    assert not pinned, f"exact pins belong in requirements-dev.txt: {pinned}"
    assert all(re.search(r"[<>]=?|~=", r) for r in requirements()), requirements()
    compaction = tomllib.loads((REPO / "compaction" / "pyproject.toml").read_text())["project"]
    pinned = [r for r in compaction["dependencies"] if "==" in r]
    assert not pinned, f"exact pins belong in requirements-dev.txt: {pinned}"


def test_the_python_floor_is_the_one_the_code_needs() -> None:
    # the code uses datetime.UTC (3.11); the declared floor says so and the checks run on it
    assert declared()["requires-python"] == ">=3.11"
    assert "datetime.UTC" in (BACKEND / "src/statetier/backend/snapshot/admin.py").read_text()
    assert sys.version_info >= (3, 11)


@pytest.mark.slow
@pytest.mark.parametrize("spark", ["4.1", "4.3"])
def test_the_backend_resolves_beside_pyspark(spark: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
            "--quiet", "--disable-pip-version-check", "--report", str(report),
            f"{BACKEND}[s3]", f"pyspark=={spark}.*",
        ],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    chosen = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert chosen["pyspark"].startswith(spark + "."), chosen
    assert "statetier-backend" in chosen
    assert {"fsspec", "s3fs", "botocore", "msgpack", "xxhash"} <= set(chosen)

"""The alert rules pass ``promtool check rules`` and ``promtool test rules`` (one case per alert).

promtool comes from Debian's ``prometheus`` package, which scripts/install-system-deps.sh
installs (``make install``). These tests try that script once when promtool is missing and skip
only if it still cannot be had (not root, no package source).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.packaging.packaging_support import CHART, REPO

RULES = CHART / "rules" / "statetier-alerts.yaml"
TESTS = CHART / "rules" / "tests" / "statetier-alerts-test.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None and os.geteuid() == 0:
        subprocess.run(
            ["bash", str(REPO / "scripts" / "install-system-deps.sh")],
            capture_output=True,
            timeout=600,
            check=False,
        )
        found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed and could not be (Debian package prometheus)")
    return found


def test_rules_pass_promtool_check(promtool: str) -> None:
    proc = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_rules_unit_tests_pass_with_one_case_per_alert(promtool: str) -> None:
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    tested = {t["alertname"] for case in cases for t in case["alert_rule_test"]}
    assert tested == alerts
    firing = {t["alertname"] for case in cases for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert firing == alerts, "every alert has a case in which it fires"
    proc = subprocess.run(
        [promtool, "test", "rules", TESTS.name],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_test_would_catch_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    """The unit tests are sharp: raising a threshold makes the spill case fail."""
    work = tmp_path
    (work / "rules").mkdir()
    (work / "rules" / "tests").mkdir()
    (work / "rules" / "statetier-alerts.yaml").write_text(
        RULES.read_text().replace("> 0.9", "> 0.99")
    )
    (work / "rules" / "tests" / TESTS.name).write_text(TESTS.read_text())
    proc = subprocess.run(
        [promtool, "test", "rules", TESTS.name],
        cwd=work / "rules" / "tests",
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "StatetierSpillVolumeNearlyFull" in proc.stdout + proc.stderr

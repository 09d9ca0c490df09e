"""The metrics endpoint is scraped and every documented metric is there, and documented."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from statetier.kubetest.processes import Sandbox, compaction_service_manifest
from statetier.operator import metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"


def _scrape(box: Sandbox) -> str:
    url = f"http://127.0.0.1:{box.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def test_every_documented_metric_is_exported_after_some_work(sandbox: Sandbox) -> None:
    sandbox.kubectl("apply", "-f", "-", stdin=compaction_service_manifest("metered"))
    sandbox.wait(
        "workers gauge",
        lambda: (
            'statetier_compaction_workers_desired{name="metered",namespace="default"} 1.0'
            in _scrape(sandbox)
        ),
    )
    text = _scrape(sandbox)
    samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    for name in metrics.DOCUMENTED:
        assert any(s == name or s.startswith(name + "_") for s in samples), name
    assert (
        'statetier_operator_reconciliations_total{outcome="success",resource="compactionservice"}'
        in text
    )
    assert 'statetier_operator_admissions_total{outcome="allowed",webhook="validate"}' in text
    assert all(s.startswith("statetier_") for s in samples if "statetier" in s)


def test_docs_list_every_metric() -> None:
    text = DOC.read_text()
    for name in metrics.DOCUMENTED:
        assert f"`{name}`" in text, f"{name} missing from docs/operator.md"


def test_liveness_endpoint_answers(sandbox: Sandbox) -> None:
    url = f"http://127.0.0.1:{sandbox.liveness_port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200


def test_logs_are_structured(sandbox: Sandbox) -> None:
    lines = [line for line in sandbox.logs().splitlines() if line.startswith("{")]
    assert lines
    record = json.loads(lines[0])
    assert {"message", "timestamp", "severity"} <= set(record)

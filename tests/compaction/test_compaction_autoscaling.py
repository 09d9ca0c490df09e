"""Autoscaling: the operator (real kopf on the API emulator) scales workers from a real gateway.

A gateway process with no workers collects jobs; the CompactionService points the autoscaler at
it. The worker Deployment must grow within two periods of the queue growing, stay up through
the stabilization window once the queue empties, and shrink to the minimum after it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from statetier.backend.http_json import call_json
from statetier.kubetest.processes import Sandbox, compaction_service_manifest
from statetier.operator import autoscaling, metrics
from statetier.tools.compaction_launch import Processes, SeaweedFS

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.compaction.*

from tests.compaction.compaction_support import chain_requests

REPO = Path(__file__).resolve().parents[2]
SPARK_CRD = REPO / "tests" / "operator" / "fixtures" / "sparkapplication-crd.yaml"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
CS = "/apis/statetier.io/v1alpha1/namespaces/default/compactionservices"
PERIOD, WINDOW = 1, 4


def test_recommendation_is_load_over_target_within_bounds() -> None:
    assert autoscaling.recommend(0, 0, 4, 1, 5) == 1
    assert autoscaling.recommend(7, 1, 4, 1, 5) == 2
    assert autoscaling.recommend(9, 0, 4, 1, 5) == 3
    assert autoscaling.recommend(100, 0, 4, 1, 5) == 5
    assert autoscaling.recommend(0, 0, 4, 0, 5) == 0


def test_scale_up_at_once_scale_down_after_the_window() -> None:
    r = autoscaling.Recommender(window=10)
    assert r.decide(0, 1, 4) == autoscaling.Decision(4, 4, "ScaleUp")
    assert r.decide(3, 4, 1).reason == "Stabilizing"
    assert r.decide(6, 4, 2).replicas == 4
    assert r.decide(9, 4, 1).replicas == 4
    assert r.decide(11, 4, 1) == autoscaling.Decision(2, 1, "ScaleDown")  # 4 left the window
    assert r.decide(17, 2, 1) == autoscaling.Decision(1, 1, "ScaleDown")
    assert r.decide(18, 1, 1).reason == "Steady"


def test_settings_defaults_match_the_crd() -> None:
    import yaml

    crd = yaml.safe_load((REPO / "crds" / "compactionservice.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props = schema["properties"]["spec"]["properties"]["workers"]["properties"]["autoscaling"]
    defaults = {k: v["default"] for k, v in props["properties"].items() if "default" in v}
    settings = autoscaling.settings_of({"workers": {"autoscaling": {}}})
    assert settings == autoscaling.AutoscalingSettings(
        defaults["enabled"],
        defaults["periodSeconds"],
        defaults["scaleDownStabilizationSeconds"],
        None,
    )


@pytest.fixture
def operator(tmp_path: Path) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path, webhooks=False, operator=False)
    with box:
        box.kubectl("apply", "-f", str(REPO / "crds"), "-f", str(SPARK_CRD))
        box.start_operator_process()
        box.wait_for_operator()
        yield box


def _replicas(box: Sandbox, name: str) -> Any:
    deployment = box.get(f"{DEPLOY}/{name}-workers")
    return deployment["spec"]["replicas"] if deployment else None


def _scrape(box: Sandbox) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{box.metrics_port}/metrics", timeout=5) as r:
        return str(r.read().decode())


@pytest.mark.slow
def test_workers_follow_the_gateway_queue(
    operator: Sandbox, procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    box = operator
    gateway, _ = procs.gateway([prefix])
    manifest = json.loads(
        compaction_service_manifest(
            "auto",
            workers={
                "min": 1,
                "max": 5,
                "targetQueuePerWorker": 2,
                "autoscaling": {
                    "enabled": True,
                    "periodSeconds": PERIOD,
                    "scaleDownStabilizationSeconds": WINDOW,
                    "gatewayURL": gateway,
                },
            },
        )
    )
    box.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    box.wait("steady at the minimum", lambda: _replicas(box, "auto") == 1)
    box.wait(
        "a first observation",
        lambda: (
            (box.get(f"{CS}/auto").get("status") or {}).get("autoscaling", {}).get("reason")
            == "Steady"
        ),
    )

    # the queue grows: 7 jobs and no worker -> ceil(7 / 2) = 4 workers
    (request,) = chain_requests(f"{prefix}/app", seaweed.options, keys=20, n=30)[:1]
    for i in range(7):
        job = dataclasses.replace(request, job_id=f"job-{i}")
        assert call_json("POST", f"{gateway}/v1/jobs", json.loads(job.to_json()))[0] == 202
    grown = time.monotonic()
    box.wait("4 workers", lambda: _replicas(box, "auto") == 4, timeout=10)
    assert time.monotonic() - grown <= 2 * PERIOD + 1.0  # two periods, plus the rollout
    cs = box.get(f"{CS}/auto")
    assert cs["spec"]["workers"]["replicas"] == 4
    assert cs["status"]["autoscaling"]["queued"] == 7
    events = box.get("/api/v1/namespaces/default/events")["items"]
    scaled = [e["message"] for e in events if e["reason"] == "Scaled"]
    # the step to 4 saw all 7 jobs; a period that fell between the submissions may have taken a
    # step on the way (5 queued: 1 -> 3, then 3 -> 4): the likely cause of this assertion's one
    # failure, in a fresh clone's make test on a loaded machine (its events were not printed)
    steps = [m for m in scaled if "7 queued + 0 running" in m]
    assert any(re.search(r"workers [1-3] -> 4\b", m) for m in steps), scaled
    text = _scrape(box)
    assert (
        'statetier_compaction_autoscaler_recommended_workers{name="auto",namespace="default"} 4.0'
        in text
    )
    assert 'statetier_compaction_autoscaler_load{name="auto",namespace="default"} 7.0' in text
    assert 'statetier_operator_autoscaler_decisions_total{decision="up"} 1.0' in text

    # the queue empties: no flapping inside the window, the minimum after it
    for i in range(7):
        call_json("DELETE", f"{gateway}/v1/jobs/job-{i}")
    emptied = time.monotonic()
    box.wait(
        "stabilizing",
        lambda: box.get(f"{CS}/auto")["status"]["autoscaling"]["reason"] == "Stabilizing",
    )
    while time.monotonic() - emptied < WINDOW - 1.5:
        assert _replicas(box, "auto") == 4
        time.sleep(0.2)
    box.wait("back to 1", lambda: _replicas(box, "auto") == 1, timeout=WINDOW + 3 * PERIOD)
    assert time.monotonic() - emptied >= WINDOW - 1.0
    # the status follows the Deployment in the same reconciliation, written just after it
    box.wait(
        "status at 1",
        lambda: box.get(f"{CS}/auto")["status"]["workers"]["desired"] == 1,
        timeout=2 * PERIOD,
    )
    for name in metrics.AUTOSCALER_DOCUMENTED:
        assert name in _scrape(box)


def test_an_unreachable_gateway_changes_nothing(operator: Sandbox, procs: Processes) -> None:
    from statetier.tools.ports import free_port

    box = operator
    manifest = compaction_service_manifest(
        "lost",
        workers={
            "min": 2,
            "max": 5,
            "autoscaling": {
                "enabled": True,
                "periodSeconds": 1,
                "gatewayURL": f"http://127.0.0.1:{free_port()}",
            },
        },
    )
    box.kubectl("apply", "-f", "-", stdin=manifest)
    box.wait(
        "GatewayUnreachable",
        lambda: (
            (box.get(f"{CS}/lost").get("status") or {}).get("autoscaling", {}).get("reason")
            == "GatewayUnreachable"
        ),
    )
    time.sleep(1.5)
    assert _replicas(box, "lost") == 2
    assert "replicas" not in box.get(f"{CS}/lost")["spec"]["workers"]

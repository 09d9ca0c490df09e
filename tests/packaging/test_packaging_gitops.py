"""GitOps readiness: CompactionService reports status the way ``kubectl wait`` and Argo CD read
it, and the chart's webhook paths are the ones the operator serves.

Both come from the operator integration flow (operator started with the chart's arguments
against the API emulator; see ``packaging_support.run_flow``).
"""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

from tests.packaging.packaging_support import CHART, POD_NAME, REPO, FlowResult

HEALTH_LUA = CHART / "argocd" / "compactionservice-health.lua"


def test_kubectl_wait_for_condition_ready_succeeds(clusterwide_flow: FlowResult) -> None:
    # Before the Deployments report ready replicas, the same wait times out ...
    assert "timed out waiting for the condition" in clusterwide_flow.wait_before_ready
    ready = next(
        c for c in clusterwide_flow.status_before_ready["conditions"] if c["type"] == "Ready"
    )
    assert ready["status"] == "False" and ready["reason"] != "AllReplicasReady"
    # ... and once they do, it succeeds.
    assert "compactionservice.statetier.io/flow condition met" in clusterwide_flow.wait_output


def test_status_has_observed_generation_and_standard_conditions(
    clusterwide_flow: FlowResult,
) -> None:
    status = clusterwide_flow.status
    assert status["observedGeneration"] == clusterwide_flow.generation
    conditions = {c["type"]: c for c in status["conditions"]}
    assert set(conditions) == {"Ready", "Progressing", "Degraded"}
    for condition in conditions.values():
        # metav1.Condition: what kubectl wait, Argo CD and kstatus read.
        assert condition["status"] in ("True", "False", "Unknown")
        assert condition["reason"] and condition["lastTransitionTime"].endswith("Z")
        assert condition["observedGeneration"] == clusterwide_flow.generation
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Degraded"]["status"] == "False"
    assert (conditions["Progressing"]["status"], conditions["Progressing"]["reason"]) == (
        "False",
        "RolloutComplete",
    )


def test_chart_webhook_paths_are_served_by_the_operator(clusterwide_flow: FlowResult) -> None:
    answers = clusterwide_flow.admissions
    assert set(answers) == {
        "/mutate-sparkapplication",
        "/validate-sparkapplication",
        "/validate-compactionservice",
    }
    for path, answer in answers.items():
        assert answer["kind"] == "AdmissionReview", path
        assert answer["response"]["allowed"] is True, (path, answer)
    patch = json.loads(base64.b64decode(answers["/mutate-sparkapplication"]["response"]["patch"]))
    touched = {op["path"] for op in patch}
    assert any(p.startswith("/spec/volumes") or p == "/spec" for p in touched), touched


def test_each_replica_takes_its_peering_priority_from_its_pod_name(
    clusterwide_flow: FlowResult,
) -> None:
    """The chart's shell wrapper really starts the operator, with priority = cksum(pod name):
    replicas of one Deployment get different priorities, so peering does not pause them all
    (kopf pauses every replica when two share a priority)."""
    expected = int(
        subprocess.run(
            ["cksum"], input=POD_NAME, capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )
    peers = clusterwide_flow.peering.get("status") or {}
    priorities = [
        (json.loads(v) if isinstance(v, str) else v).get("priority") for v in peers.values()
    ]
    assert expected in priorities, peers


def _argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """Run the Argo CD health script as Argo CD does (Lua 5.1, global ``obj``)."""
    from lupa import lua51  # type: ignore[import-untyped]  # no stubs published

    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(HEALTH_LUA.read_text())
    return {str(k): str(v) for k, v in result.items()}


def test_argocd_health_check_reads_the_operators_status(clusterwide_flow: FlowResult) -> None:
    generation = clusterwide_flow.generation
    ready = {"metadata": {"generation": generation}, "status": clusterwide_flow.status}
    assert _argocd_health(ready)["status"] == "Healthy"
    starting = {
        "metadata": {"generation": generation},
        "status": clusterwide_flow.status_before_ready,
    }
    assert _argocd_health(starting)["status"] == "Progressing"
    stale = {"metadata": {"generation": generation + 1}, "status": clusterwide_flow.status}
    assert _argocd_health(stale)["status"] == "Progressing"
    degraded_status = json.loads(json.dumps(clusterwide_flow.status))
    for condition in degraded_status["conditions"]:
        if condition["type"] == "Degraded":
            condition.update(status="True", reason="WorkersBelowMinimum", message="0 of 1 ready")
    degraded = _argocd_health({"metadata": {"generation": generation}, "status": degraded_status})
    assert degraded == {"status": "Degraded", "message": "WorkersBelowMinimum: 0 of 1 ready"}
    assert _argocd_health({"metadata": {"generation": 1}})["status"] == "Progressing"


def test_install_doc_carries_the_tested_health_script() -> None:
    doc = (REPO / "docs" / "install.md").read_text()
    indented = "\n".join(
        f"    {line}" if line else "" for line in HEALTH_LUA.read_text().splitlines()
    )
    assert indented in doc

"""GitOps readiness: CompactionService reports status the way ``kubectl wait`` and Argo CD read
it, and the chart's webhook paths are the ones the operator serves.

Both come from the operator integration flow (operator started with the chart's arguments
against the API emulator; see ``packaging_support.run_flow``).
"""

from __future__ import annotations

import base64
import json
import subprocess

from tests.packaging.packaging_support import POD_NAME, FlowResult


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
    assert set(conditions) == {"Ready", "Degraded"}
    for condition in conditions.values():
        # metav1.Condition: what kubectl wait, Argo CD and kstatus read.
        assert condition["status"] in ("True", "False", "Unknown")
        assert condition["reason"] and condition["lastTransitionTime"].endswith("Z")
        assert condition["observedGeneration"] == clusterwide_flow.generation
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Degraded"]["status"] == "False"


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

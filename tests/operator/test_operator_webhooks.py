"""Admission webhooks: real AdmissionReview requests over HTTPS, and through the emulator."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from statetier.backend.config import load_config
from statetier.kubetest.processes import Sandbox

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sparkapplication-wordcount.yaml"
SPARK = "/apis/sparkoperator.k8s.io/v1beta2/namespaces/default/sparkapplications"


def _app(name: str = "app", **annotations: str) -> dict[str, Any]:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["name"] = name
    if annotations:
        body["metadata"]["annotations"] = annotations
    return dict(body)


def review(box: Sandbox, webhook: str, obj: dict[str, Any], operation: str = "CREATE") -> Any:
    """POST an AdmissionReview to the operator's webhook server, verifying its certificate."""
    context = ssl.create_default_context(cafile=box.certfile)
    uid = str(uuid.uuid4())
    request: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {
                "group": "sparkoperator.k8s.io",
                "version": "v1beta2",
                "kind": "SparkApplication",
            },
            "resource": {
                "group": "sparkoperator.k8s.io",
                "version": "v1beta2",
                "resource": "sparkapplications",
            },
            "name": obj["metadata"]["name"],
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "tester"},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }
    req = urllib.request.Request(
        f"https://127.0.0.1:{box.webhook_port}/{webhook}",
        data=json.dumps(request).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, context=context, timeout=10) as resp:
        answer = json.load(resp)
    assert answer["response"]["uid"] == uid
    return answer["response"]


def _apply_patch(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    from statetier.kubetest.patching import json_patch

    assert response["patchType"] == "JSONPatch"
    result: dict[str, Any] = json_patch(obj, json.loads(base64.b64decode(response["patch"])))
    return result


def test_opted_in_application_is_mutated_with_backend_keys(sandbox: Sandbox) -> None:
    app = _app()
    response = review(sandbox, "mutate-sparkapplication", app)
    assert response["allowed"] is True
    mutated = _apply_patch(app, response)
    spec = mutated["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"].startswith("spark-local-dir-")]
    assert volume["name"] == "spark-local-dir-statetier"
    # Spark's on-demand claim (one PVC per executor pod), the kind the Spark Operator submits.
    assert volume["persistentVolumeClaim"] == {"claimName": "OnDemand"}
    claim = "spark.kubernetes.executor.volumes.persistentVolumeClaim.spark-local-dir-statetier"
    assert spec["sparkConf"][f"{claim}.options.storageClass"] == "local-ssd"
    assert spec["sparkConf"][f"{claim}.options.sizeLimit"] == "100Gi"
    assert {"name": "spark-local-dir-statetier", "mountPath": "/var/lib/statetier/spill"} in spec[
        "executor"
    ]["volumeMounts"]
    conf = spec["sparkConf"]
    # The backend reads exactly these keys and accepts these values.
    config = load_config(
        env={}, spark_conf={k: v for k, v in conf.items() if k.startswith("spark.statetier.")}
    )
    assert config.spill_dirs == ("/var/lib/statetier/spill",)
    assert config.spill_enabled is True  # the spill tier's default is off
    assert config.metrics_port == 9108  # what the chart's executor PodMonitor scrapes
    assert config.checkpoint_uri == "s3://statetier-checkpoints/wordcount"
    # Half of the 4g executor memory for the state hosts (one per core: 2), split between them
    # by the backend; the 1g overhead grows by the budget and each host's allowance.
    assert config.memory_budget == 2 << 30
    assert spec["executor"]["memoryOverhead"] == f"{1024 + 2048 + 2 * 256}m"
    assert conf["spark.executor.pyspark.memory"] == "2g"  # user settings kept
    summary = json.loads(mutated["metadata"]["annotations"]["statetier.io/status"])
    assert summary["spillVolume"] == "ephemeral"
    assert summary["memoryBudgetFrom"] == "0.5 x executor memory 4g"
    assert summary["memoryOverhead"] == (
        "3584Mi = 1024Mi (spec.executor.memoryOverhead 1g) + 2048Mi budget + "
        "2 x 256Mi host allowance (2 state hosts)"
    )


@pytest.mark.parametrize(
    ("kind", "executor", "annotations", "budget_mib", "overhead_mib"),
    [
        # budget = 0.5 x memory (or the annotation); overhead = own or Spark's default
        # max(384Mi, 0.4 (Python) / 0.1 (Scala) x memory) + budget + 2 hosts (2 cores) x 256Mi.
        ("Python", {"memory": "1g"}, {}, 512, 409 + 512 + 512),
        ("Python", {"memory": "4g"}, {}, 2048, 1638 + 2048 + 512),
        ("Scala", {"memory": "4g"}, {}, 2048, 409 + 2048 + 512),
        ("Python", {"memory": "16g", "memoryOverhead": "3g"}, {}, 8192, 3072 + 8192 + 512),
        ("Scala", {"memory": "16g"}, {"statetier.io/memory-budget": "1g"}, 1024, 1638 + 1024 + 512),
    ],
)
def test_executor_memory_covers_the_state_host_by_the_one_formula(
    sandbox: Sandbox,
    kind: str,
    executor: dict[str, Any],
    annotations: dict[str, str],
    budget_mib: int,
    overhead_mib: int,
) -> None:
    app = _app("shape", **{"statetier.io/enabled": "true", **annotations})
    app["spec"]["type"] = kind
    app["spec"]["executor"] = {"cores": 2, **executor}
    mutated = _apply_patch(app, review(sandbox, "mutate-sparkapplication", app))
    assert mutated["spec"]["sparkConf"]["spark.statetier.memory.budget"] == str(budget_mib << 20)
    assert mutated["spec"]["executor"]["memoryOverhead"] == f"{overhead_mib}m"
    summary = json.loads(mutated["metadata"]["annotations"]["statetier.io/status"])
    assert summary["memoryBudget"] == budget_mib << 20
    assert summary["memoryOverhead"].startswith(f"{overhead_mib}Mi = ")
    allowance = "2 x 256Mi host allowance (2 state hosts)"
    assert summary["memoryOverhead"].endswith(f" + {budget_mib}Mi budget + {allowance}")
    assert summary["memoryOverheadOriginal"] == executor.get("memoryOverhead")
    # Admitted again (an UPDATE of the mutated object): nothing is added a second time.
    again = review(sandbox, "mutate-sparkapplication", mutated, operation="UPDATE")
    assert again["allowed"] is True and "patch" not in again


def test_second_admission_changes_nothing(sandbox: Sandbox) -> None:
    app = _app()
    mutated = _apply_patch(app, review(sandbox, "mutate-sparkapplication", app))
    again = review(sandbox, "mutate-sparkapplication", mutated, operation="UPDATE")
    assert again["allowed"] is True
    assert "patch" not in again


def test_user_changes_are_reconciled_not_duplicated(sandbox: Sandbox) -> None:
    app = _app()
    mutated = _apply_patch(app, review(sandbox, "mutate-sparkapplication", app))
    edited = copy.deepcopy(mutated)
    edited["metadata"]["annotations"]["statetier.io/spill-volume"] = "emptyDir"
    result = _apply_patch(edited, review(sandbox, "mutate-sparkapplication", edited, "UPDATE"))
    volumes = [v for v in result["spec"]["volumes"] if v["name"] == "spark-local-dir-statetier"]
    assert volumes == [{"name": "spark-local-dir-statetier", "emptyDir": {"sizeLimit": "100Gi"}}]
    mounts = result["spec"]["executor"]["volumeMounts"]
    assert len([m for m in mounts if m["name"] == "spark-local-dir-statetier"]) == 1


def test_not_opted_in_is_left_alone(sandbox: Sandbox) -> None:
    app = _app(**{"statetier.io/enabled": "false"})
    response = review(sandbox, "mutate-sparkapplication", app)
    assert response["allowed"] is True and "patch" not in response
    plain = _app()
    del plain["metadata"]["annotations"]
    response = review(sandbox, "mutate-sparkapplication", plain)
    assert response["allowed"] is True and "patch" not in response


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (
            {"statetier.io/enabled": "yes"},
            "statetier.io/enabled='yes' is not valid: allowed values: true, false",
        ),
        (
            {"statetier.io/enabled": "true", "statetier.io/spill-volume": "ssd"},
            "statetier.io/spill-volume='ssd' is not valid: allowed values: ephemeral, hostPath, "
            "emptyDir",
        ),
        (
            {"statetier.io/enabled": "true", "statetier.io/spill-volume": "ephemeral"},
            "statetier.io/spill-size is required when statetier.io/spill-volume is ephemeral",
        ),
        (
            {"statetier.io/enabled": "true", "statetier.io/memory-fraction": "2"},
            "statetier.io/memory-fraction='2' is not valid: allowed values: a number between",
        ),
        (
            {"statetier.io/enabled": "true", "statetier.io/spil-size": "1Gi"},
            "annotation statetier.io/spil-size is not known",
        ),
        (
            {"statetier.io/enabled": "true", "statetier.io/checkpoint-uri": "hdfs://x"},
            "statetier.io/checkpoint-uri='hdfs://x' is not valid: allowed values: an s3://",
        ),
    ],
)
def test_bad_annotations_are_rejected_naming_them(
    sandbox: Sandbox, annotations: dict[str, str], expected: str
) -> None:
    response = review(sandbox, "validate-sparkapplication", _app(**annotations))
    assert response["allowed"] is False
    assert expected in response["status"]["message"]
    assert response["status"]["code"] == 422


def test_good_annotations_are_allowed(sandbox: Sandbox) -> None:
    response = review(sandbox, "validate-sparkapplication", _app())
    assert response["allowed"] is True


def test_kubectl_apply_goes_through_both_webhooks(sandbox: Sandbox) -> None:
    """The emulator calls the webhooks the operator registered, as an apiserver would."""
    out = sandbox.kubectl("apply", "-f", str(EXAMPLE))
    assert "created" in out
    stored = sandbox.get(f"{SPARK}/wordcount")
    assert stored["spec"]["sparkConf"]["spark.statetier.spill.dirs"] == "/var/lib/statetier/spill"
    bad = _app("rejected", **{"statetier.io/enabled": "true", "statetier.io/spill-volume": "nvme"})
    out = sandbox.kubectl("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert "denied the request" in out and "statetier.io/spill-volume='nvme'" in out
    assert sandbox.get(f"{SPARK}/rejected") is None


def _log_records(box: Sandbox, text: str) -> list[dict[str, Any]]:
    """The operator's JSON log records whose message contains ``text``."""
    records = [json.loads(line) for line in box.logs().splitlines() if line.startswith("{")]
    return [r for r in records if text in str(r.get("message"))]


def test_a_bad_annotation_is_a_warning_with_an_event_on_update(sandbox: Sandbox) -> None:
    """A user's mistake is logged at warning severity, never error (alerts on error logs must
    not fire on a typo); an UPDATE refused also leaves a Warning Event on the object, a refused
    CREATE none (there is no object)."""
    created = _app("mistaken", **{"statetier.io/spill-volume": "nvme"})
    out = sandbox.kubectl("apply", "-f", "-", stdin=json.dumps(created), check=False)
    assert "denied the request" in out
    sandbox.kubectl("apply", "-f", "-", stdin=json.dumps(_app("mistaken")))
    out = sandbox.kubectl(
        "annotate",
        "sparkapplication",
        "mistaken",
        "statetier.io/spill-volume=ssd",
        "--overwrite",
        check=False,
    )
    assert "denied the request" in out and "statetier.io/spill-volume='ssd'" in out
    for value in ("nvme", "ssd"):
        records = _log_records(sandbox, f"statetier.io/spill-volume='{value}'")
        assert records and {r["severity"] for r in records} == {"warn"}, records
    events = sandbox.wait(
        "InvalidAnnotation event",
        lambda: [
            e
            for e in sandbox.get("/api/v1/namespaces/default/events")["items"]
            if e["involvedObject"]["name"] == "mistaken" and e["reason"] == "InvalidAnnotation"
        ],
    )
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert "statetier.io/spill-volume='ssd'" in events[0]["message"]
    assert events[0]["involvedObject"]["uid"] == sandbox.get(f"{SPARK}/mistaken")["metadata"]["uid"]

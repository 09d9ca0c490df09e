"""Pure parts of the operator: annotations, mutation, memory budget, compaction objects and
conditions, and the emulator's patch formats."""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
from typing import Any

import kopf
import pytest
from statetier.backend.config import SETTINGS
from statetier.kubetest import controllers
from statetier.kubetest.patching import (
    PatchTestFailedError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from statetier.operator import annotations as ann
from statetier.operator import compaction_service, memory, sparkapp, webhooks


def _app(
    spec: dict[str, Any] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "a",
            "annotations": {"statetier.io/enabled": "true", **(annotations or {})},
        },
        "spec": spec if spec is not None else {"executor": {"cores": 4, "memory": "8g"}},
    }


def test_the_operator_writes_only_keys_of_the_schema() -> None:
    body = _app(annotations={"statetier.io/checkpoint-uri": "s3://b/p"})
    result = sparkapp.mutate(body, ann.parse(body["metadata"]["annotations"]), "http://g:1")
    written = {k for k in result.spec_changes["sparkConf"] if k.startswith("spark.statetier.")}
    assert written == {
        s.spark_key
        for s in SETTINGS
        if s.name
        in (
            "spill.enabled",
            "spill.dirs",
            "metrics.port",
            "memory.budget",
            "checkpoint.uri",
            "compaction.endpoints",
        )
    }


MI = 1 << 20


@pytest.mark.parametrize(
    ("spec", "annotations", "budget_mib", "base_mib", "words"),
    [
        # No memory given: Spark's 1g; a Python app's default overhead max(384Mi, 0.4 x 1g).
        ({"type": "Python"}, {}, 512, 409, "max(384Mi, 0.4 x 1g (Spark default))"),
        ({"type": "Python", "executor": {"memory": "4g"}}, {}, 2048, 1638, "0.4 x 4g"),
        ({"type": "Scala", "executor": {"memory": "4g"}}, {}, 2048, 409, "0.1 x 4g"),
        ({"type": "Scala", "executor": {"memory": "1g"}}, {}, 512, 384, "max(384Mi, 0.1 x 1g)"),
        ({"type": "Python", "executor": {"memory": "16g"}}, {}, 8192, 6553, "0.4 x 16g"),
        (
            {"type": "Python", "executor": {"memory": "16g", "memoryOverhead": "2g"}},
            {"statetier.io/memory-fraction": "0.25"},
            4096,
            2048,
            "spec.executor.memoryOverhead 2g",
        ),
        (
            {"type": "Python", "executor": {"memory": "4g", "memoryOverhead": "1024"}},
            {"statetier.io/memory-budget": "3g"},
            3072,
            1024,
            "spec.executor.memoryOverhead 1024",
        ),
        (
            {
                "type": "Python",
                "executor": {"memory": "4g"},
                "sparkConf": {"spark.executor.memoryOverheadFactor": "0.2"},
            },
            {},
            2048,
            819,
            "spark.executor.memoryOverheadFactor: max(384Mi, 0.2 x 4g)",
        ),
        (
            {"sparkConf": {"spark.executor.memory": "2g", "spark.executor.memoryOverhead": "1g"}},
            {},
            1024,
            1024,
            "spark.executor.memoryOverhead 1g",
        ),
    ],
)
def test_budget_and_memory_overhead_follow_the_one_formula(
    spec: dict[str, Any],
    annotations: dict[str, str],
    budget_mib: int,
    base_mib: int,
    words: str,
) -> None:
    body = _app(spec=spec, annotations=annotations)
    result = sparkapp.mutate(body, ann.parse(body["metadata"]["annotations"]), None)
    overhead_mib = base_mib + budget_mib + 256  # + the host allowance
    conf = result.spec_changes["sparkConf"]
    assert conf["spark.statetier.memory.budget"] == str(budget_mib * MI)
    assert result.spec_changes["executor"]["memoryOverhead"] == f"{overhead_mib}m"
    summary = result.summary
    assert summary["memoryBudget"] == budget_mib * MI
    assert summary["memoryOverhead"] == (
        f"{overhead_mib}Mi = {base_mib}Mi ({summary['memoryOverhead'].split('(', 1)[1]}"
    )
    assert words in summary["memoryOverhead"]
    assert f"+ {budget_mib}Mi budget + 256Mi host allowance" in summary["memoryOverhead"]
    if "statetier.io/memory-budget" in annotations:
        assert summary["memoryBudgetFrom"] == "annotation statetier.io/memory-budget"
    else:
        fraction = annotations.get("statetier.io/memory-fraction", "0.5")
        assert summary["memoryBudgetFrom"].startswith(f"{fraction} x executor memory ")
    assert memory.HOST_ALLOWANCE == 256 * MI


def _mutated(body: dict[str, Any]) -> dict[str, Any]:
    result = sparkapp.mutate(body, ann.parse(body["metadata"]["annotations"]), None)
    out = copy.deepcopy(body)
    out["spec"].update(result.spec_changes)
    out["metadata"]["annotations"].update(result.annotations)
    return out


def test_memory_overhead_is_added_once_and_follows_later_changes() -> None:
    body = _app(spec={"type": "Python", "executor": {"memory": "4g", "memoryOverhead": "1g"}})
    once = _mutated(body)
    assert once["spec"]["executor"]["memoryOverhead"] == f"{1024 + 2048 + 256}m"
    again = sparkapp.mutate(once, ann.parse(once["metadata"]["annotations"]), None)
    assert again.empty  # nothing added a second time
    # A new budget is computed from the original overhead, not from the raised one.
    once["metadata"]["annotations"]["statetier.io/memory-budget"] = "1g"
    smaller = _mutated(once)
    assert smaller["spec"]["executor"]["memoryOverhead"] == f"{1024 + 1024 + 256}m"
    # The user sets a new overhead by hand: it is the new original.
    smaller["spec"]["executor"]["memoryOverhead"] = "2g"
    edited = _mutated(smaller)
    assert edited["spec"]["executor"]["memoryOverhead"] == f"{2048 + 1024 + 256}m"
    assert "spec.executor.memoryOverhead 2g" in _summary(edited)["memoryOverhead"]


def _summary(body: dict[str, Any]) -> Any:
    return json.loads(body["metadata"]["annotations"][ann.STATUS])


def test_unusable_executor_memory_is_a_warning_naming_the_field() -> None:
    body = _app(spec={"executor": {"memory": "lots"}})
    result = sparkapp.mutate(body, ann.parse(body["metadata"]["annotations"]), None)
    assert "spark.statetier.memory.budget" not in result.spec_changes["sparkConf"]
    assert "memoryOverhead" not in result.spec_changes["executor"]
    (warning,) = [w for w in result.warnings if "memory" in w]
    assert "spec.executor.memory='lots'" in warning
    factor = _app(spec={"type": "Python", "memoryOverheadFactor": "nan"})
    result = sparkapp.mutate(factor, ann.parse(factor["metadata"]["annotations"]), None)
    assert any("spec.memoryOverheadFactor='nan'" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("annotations", "volume"),
    [
        (
            {"statetier.io/spill-volume": "hostPath", "statetier.io/spill-host-path": "/mnt/ssd"},
            {"hostPath": {"path": "/mnt/ssd", "type": "DirectoryOrCreate"}},
        ),
        ({}, {"emptyDir": {}}),
        (
            {"statetier.io/spill-volume": "ephemeral", "statetier.io/spill-size": "10Gi"},
            {"persistentVolumeClaim": {"claimName": "OnDemand"}},
        ),
    ],
)
def test_spill_volume_kinds(annotations: dict[str, str], volume: dict[str, Any]) -> None:
    body = _app(annotations=annotations)
    result = sparkapp.mutate(body, ann.parse(body["metadata"]["annotations"]), None)
    assert result.spec_changes["volumes"] == [{"name": sparkapp.VOLUME_NAME, **volume}]


CLAIM = "spark.kubernetes.executor.volumes.persistentVolumeClaim.spark-local-dir-statetier.options."


def test_an_ephemeral_spill_volume_is_sparks_on_demand_claim_and_leaves_no_options_behind() -> None:
    """The claim's class and size go to Spark conf (the Spark Operator maps only the claim
    name); switching to another kind removes them, or Spark would parse a volume with no
    mount path and refuse to start."""
    body = _app(
        annotations={
            "statetier.io/spill-volume": "ephemeral",
            "statetier.io/spill-size": "50Gi",
            "statetier.io/spill-storage-class": "local-nvme",
        }
    )
    conf = sparkapp.mutate(body, ann.parse(body["metadata"]["annotations"]), None).spec_changes[
        "sparkConf"
    ]
    assert conf[CLAIM + "sizeLimit"] == "50Gi" and conf[CLAIM + "storageClass"] == "local-nvme"
    assert conf["spark.statetier.spill.enabled"] == "true"
    body["spec"]["sparkConf"] = conf
    body["metadata"]["annotations"] = {"statetier.io/enabled": "true"}  # back to emptyDir
    after = sparkapp.mutate(body, ann.parse(body["metadata"]["annotations"]), None)
    assert not [k for k in after.spec_changes["sparkConf"] if k.startswith(CLAIM)]


def test_mutation_keeps_user_volumes_and_is_idempotent() -> None:
    spec = {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "executor": {
            "cores": 1,
            "memory": "2g",
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        },
    }
    body = _app(spec=spec)
    settings = ann.parse(body["metadata"]["annotations"])
    first = sparkapp.mutate(body, settings, None)
    mutated = copy.deepcopy(body)
    mutated["spec"].update(first.spec_changes)
    mutated["metadata"]["annotations"].update(first.annotations)
    assert [v["name"] for v in mutated["spec"]["volumes"]] == ["data", sparkapp.VOLUME_NAME]
    assert sparkapp.mutate(mutated, settings, None).empty


def test_annotation_problems_name_the_annotation_and_allowed_values() -> None:
    problems = ann.problems(
        {
            "statetier.io/enabled": "true",
            "statetier.io/checkpoint-retention": "forever",
            "statetier.io/compaction-service": "Not_A_Name",
            "other.io/ignored": "whatever",
        }
    )
    assert problems == [
        "annotation statetier.io/checkpoint-retention='forever' is not valid: allowed values: "
        "retain, delete",
        "annotation statetier.io/compaction-service='Not_A_Name' is not valid: allowed values: "
        "a CompactionService name, or namespace/name",
    ]
    assert ann.problems({"statetier.io/status": "{}"}) == []


def _spec(**workers: int) -> dict[str, Any]:
    return compaction_service.with_defaults(
        {"image": "i", "workers": workers, "objectStorage": {"allowedPrefixes": ["s3://b/"]}}
    )


def test_pods_take_the_service_account_and_pull_secrets_of_the_spec() -> None:
    body = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {
            **_spec(min=1, max=2),
            "serviceAccountName": "compaction-s3",
            "imagePullSecrets": [{"name": "registry"}],
        },
    }
    pods = [
        o["spec"]["template"]["spec"]
        for o in compaction_service.desired_objects(body)
        if o["kind"] == "Deployment"
    ]
    assert [p["serviceAccountName"] for p in pods] == ["compaction-s3", "compaction-s3"]
    assert [p["imagePullSecrets"] for p in pods] == [[{"name": "registry"}]] * 2
    plain = compaction_service.desired_objects({**body, "spec": _spec(min=1, max=2)})
    assert all(
        "serviceAccountName" not in o["spec"].get("template", {}).get("spec", {}) for o in plain
    )


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        ({"min": 2, "max": 5}, 2),
        ({"min": 2, "max": 5, "replicas": 9}, 5),
        ({"min": 2, "max": 5, "replicas": 0}, 2),
        ({"min": 0, "max": 5, "replicas": 0}, 0),
    ],
)
def test_desired_workers_is_clamped(workers: dict[str, int], expected: int) -> None:
    assert compaction_service.desired_workers(_spec(**workers)) == expected


def _deploy(ready: int, replicas: int = 2, *, rollout: str = "complete") -> dict[str, Any]:
    """A Deployment as its controller reports it (the emulator's controller computes it):
    ``pending`` not reported yet, ``progressing`` reported before Pods are ready, ``complete``
    once every replica was available, ``stalled`` past the progress deadline."""
    deployment: dict[str, Any] = {
        "metadata": {"name": "d", "generation": 1},
        "spec": {"replicas": replicas},
    }
    if rollout == "pending":
        deployment["status"] = {}
        return deployment
    deployment["status"] = {"readyReplicas": replicas if rollout == "complete" else 0}
    deployment["status"] = controllers.deployment_status(deployment)
    if rollout == "stalled":
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=601)
        deployment["status"] = controllers.deployment_status(deployment, later)
    deployment["status"]["readyReplicas"] = ready  # Pods come and go after the rollout
    return deployment


def _by_type(conditions: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in conditions}


def test_conditions_after_a_complete_rollout() -> None:
    spec = _spec(min=2, max=4)
    result = compaction_service.conditions(spec, [], _deploy(1, 1), _deploy(2), 3)
    assert _by_type(result) == {
        "Ready": ("True", "AllReplicasReady"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "AsExpected"),
    }
    assert {c["observedGeneration"] for c in result} == {3}
    # A worker goes away after the rollout: below min is Degraded.
    result = compaction_service.conditions(spec, [], _deploy(1, 1), _deploy(1), 1)
    assert _by_type(result)["Degraded"] == ("True", "WorkersBelowMinimum")
    assert _by_type(result)["Ready"] == ("False", "WorkersUnavailable")
    result = compaction_service.conditions(spec, [], _deploy(0, 1), _deploy(2), 1)
    assert _by_type(result)["Degraded"] == ("True", "GatewayUnavailable")


@pytest.mark.parametrize("rollout", ["pending", "progressing"])
def test_conditions_while_a_rollout_is_under_way(rollout: str) -> None:
    """Reported or not, a Deployment whose Pods are not ready yet is Progressing, not
    Degraded: the Deployment controller reports long before any Pod is ready."""
    spec = _spec(min=2, max=4)
    gateway, workers = _deploy(0, 1, rollout=rollout), _deploy(0, rollout=rollout)
    result = _by_type(compaction_service.conditions(spec, [], gateway, workers, 1))
    assert result == {
        "Ready": ("False", "GatewayUnavailable"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("False", "Progressing"),
    }
    assert compaction_service.rollout(workers) == "pending"


def test_conditions_of_a_stalled_rollout_and_an_invalid_spec() -> None:
    spec = _spec(min=2, max=4)
    stalled = _deploy(0, rollout="stalled")
    assert compaction_service.rollout(stalled) == "stalled"
    result = _by_type(compaction_service.conditions(spec, [], _deploy(1, 1), stalled, 1))
    assert result["Degraded"] == ("True", "ProgressDeadlineExceeded")
    assert result["Progressing"] == ("False", "ProgressDeadlineExceeded")
    problems = compaction_service.spec_problems(_spec(min=5, max=1))
    conditions = compaction_service.conditions(_spec(min=5, max=1), problems, None, None, 1)
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "workers.min (5)" in degraded["message"]


def test_condition_transition_time_is_kept_while_status_holds() -> None:
    spec = _spec(min=1, max=2)
    before = [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"},
        {"type": "Degraded", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"},
    ]
    conditions = compaction_service.conditions(spec, [], _deploy(1, 1), _deploy(1, 1), 1, before)
    times = {c["type"]: c["lastTransitionTime"] for c in conditions}
    assert times["Ready"] == "2020-01-01T00:00:00Z"
    assert times["Degraded"] != "2020-01-01T00:00:00Z"


def test_patch_formats() -> None:
    doc = {"a": {"b": 1, "c": 2}, "l": [1, 2]}
    assert merge_patch(doc, {"a": {"b": None, "d": 3}, "l": [3]}) == {
        "a": {"c": 2, "d": 3},
        "l": [3],
    }
    assert json_patch(
        doc, [{"op": "add", "path": "/l/-", "value": 3}, {"op": "remove", "path": "/a/b"}]
    ) == {"a": {"c": 2}, "l": [1, 2, 3]}
    with pytest.raises(PatchTestFailedError):
        json_patch(doc, [{"op": "test", "path": "/a/b", "value": 9}])
    assert doc == {"a": {"b": 1, "c": 2}, "l": [1, 2]}  # never modified in place
    containers = {"containers": [{"name": "x", "image": "1"}, {"name": "y", "image": "1"}]}
    patched = strategic_merge_patch(
        containers, {"containers": [{"name": "y", "image": "2"}, {"name": "x", "$patch": "delete"}]}
    )
    assert patched == {"containers": [{"name": "y", "image": "2"}]}


def test_storage_secret_reaches_driver_and_executors_as_environment_only() -> None:
    body = _app(
        spec={"executor": {"cores": 2, "memory": "4g"}, "driver": {"cores": 1}},
        annotations={
            "statetier.io/checkpoint-uri": "s3://b/p",
            "statetier.io/storage-secret": "object-store",
        },
    )
    settings = ann.parse(body["metadata"]["annotations"])
    result = sparkapp.mutate(body, settings, None)
    ref = {"secretRef": {"name": "object-store"}}
    assert result.spec_changes["executor"]["envFrom"] == [ref]
    assert result.spec_changes["driver"] == {
        "cores": 1,
        "envFrom": [ref],
        "labels": {"statetier.io/enabled": "true"},  # for the PodMonitor
    }
    conf = result.spec_changes["sparkConf"]
    assert not [v for v in conf.values() if "object-store" in str(v)]  # never in Spark conf
    mutated = copy.deepcopy(body)
    mutated["spec"].update(result.spec_changes)
    mutated["metadata"]["annotations"].update(result.annotations)
    assert sparkapp.mutate(mutated, settings, None).empty  # idempotent
    assert ann.problems({"statetier.io/storage-secret": "Not_A_Name"}) == [
        "annotation statetier.io/storage-secret='Not_A_Name' is not valid: allowed values: "
        "a Secret name (DNS subdomain)"
    ]


def test_compaction_token_reaches_driver_and_executors_from_its_secret_only() -> None:
    user_var = {"name": "STATETIER_COMPACTION_TOKEN", "value": "typed-by-hand"}
    body = _app(
        spec={"executor": {"memory": "4g", "env": [user_var]}, "driver": {"cores": 1}},
        annotations={"statetier.io/compaction-service": "svc"},
    )
    settings = ann.parse(body["metadata"]["annotations"])
    result = sparkapp.mutate(
        body, settings, "http://svc-gateway.default.svc:8080", None, ("s", "k")
    )
    token = {
        "name": "STATETIER_COMPACTION_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
    }
    for role in ("driver", "executor"):  # exactly one, the Secret's (a literal is replaced)
        assert result.spec_changes[role]["env"] == [token]
    conf = result.spec_changes["sparkConf"]
    assert not [k for k in conf if "token" in k.lower()]
    assert result.summary["compactionTokenSecret"] == "s/k"
    mutated = _mutated(body)  # without the token: the env is left as the user wrote it
    assert mutated["spec"]["executor"]["env"] == [user_var]
    # No endpoint (the service is unknown): no token either.
    result = sparkapp.mutate(body, settings, None, "not found", ("s", "k"))
    assert result.spec_changes["executor"]["env"] == [user_var]


def test_a_compaction_service_in_another_namespace_needs_its_token_secret_copied() -> None:
    index = {("other", "svc"): [("svc-compaction-token", "token")]}
    warnings: list[str] = []
    ref = webhooks._compaction_token("spark", "other/svc", index, warnings)  # type: ignore[arg-type]
    assert ref == ("svc-compaction-token", "token")
    (warning,) = warnings
    assert "copy its token Secret svc-compaction-token (key token) into namespace spark" in warning
    assert webhooks._compaction_token("spark", "absent", index, warnings) is None  # type: ignore[arg-type]


def test_operator_version() -> None:
    import subprocess
    import sys
    from importlib import metadata

    result = subprocess.run(
        [sys.executable, "-c", "import sys; from statetier.operator.cli import main; "
         "sys.exit(main(['--version']))"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"statetier-operator {metadata.version('statetier-operator')}"


@pytest.mark.parametrize(
    ("executor", "conf", "hosts"),
    [
        ({}, {}, 1),  # cores unknown: one host
        ({"cores": 4}, {}, 4),  # a host per task slot
        ({}, {"spark.executor.cores": "8", "spark.task.cpus": "2"}, 4),
        ({"cores": 4}, {"spark.statetier.host.per-executor": "1"}, 1),  # today's one host
        ({"cores": 4}, {"spark.statetier.host.per-executor": "0"}, 4),  # 0: one per slot
    ],
)
def test_each_state_host_of_an_executor_gets_its_own_runtime_allowance(
    executor: dict[str, Any], conf: dict[str, str], hosts: int
) -> None:
    """The budget is the executor's (the backend splits it across its hosts); each host is a
    process with its own interpreter, so the pod reserves an allowance per host."""
    spec = {"executor": {"memory": "4g", **executor}, "sparkConf": conf}
    assert memory.state_hosts(spec) == hosts
    plan = memory.plan(spec, ann.parse({}), None)
    assert plan.budget == 2048 * MI  # the executor's, whatever the hosts
    assert plan.overhead_mib == _mib_of(plan.base_overhead) + 2048 + hosts * 256
    assert ("state hosts" in plan.explanation) == (hosts > 1)


def _mib_of(size: int) -> int:
    return -(-size // MI)


def test_a_bad_task_cpus_is_named() -> None:
    with pytest.raises(ValueError, match=r"spark.task.cpus='two' is not a positive whole number"):
        memory.state_hosts({"sparkConf": {"spark.task.cpus": "two"}})


class _JobsOf:
    """The one call ``_require_own_job`` makes: the Job of that name as read now (or None)."""

    def __init__(self, found: dict[str, Any] | None) -> None:
        self.found = found

    async def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.found


def test_a_snapshot_job_name_taken_by_an_earlier_snapshot_is_retried_until_it_is_ours() -> None:
    from statetier.operator import snapshot_handlers

    job = {"metadata": {"namespace": "ns", "name": "s-savepoint"}}
    ours = {"metadata": {"ownerReferences": [{"uid": "new"}]}}
    theirs = {"metadata": {"ownerReferences": [{"uid": "old"}]}}
    asyncio.run(snapshot_handlers._require_own_job(_JobsOf(ours), job, "new"))  # type: ignore[arg-type]
    with pytest.raises(kopf.TemporaryError, match="belongs to an earlier StateSnapshot"):
        asyncio.run(snapshot_handlers._require_own_job(_JobsOf(theirs), job, "new"))  # type: ignore[arg-type]
    # the collector took the earlier Job between the create (409) and this read: the retry
    # creates ours (a fresh clone's upgrade test waited 90 s on a snapshot with no Job)
    with pytest.raises(kopf.TemporaryError, match="deleted just now"):
        asyncio.run(snapshot_handlers._require_own_job(_JobsOf(None), job, "new"))  # type: ignore[arg-type]

"""The emulator's model of what a real apiserver and control plane do to stored objects.

Pure functions, checked against values a real kube-apiserver gives (quantities as
``resource.Quantity.String()`` prints them, field ownership as server-side apply keeps it),
plus the wire behaviour kubectl depends on (``/openapi/v3``, strict field validation).
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from statetier.kubetest import apply as ssa
from statetier.kubetest import controllers, pruning, schema_check, typed
from statetier.kubetest.processes import Sandbox, free_port
from statetier.kubetest.processes import compaction_service_manifest as _manifest

from tests.operator.conftest import CRDS, SPARK_CRD

ADMISSION = "/apis/admissionregistration.k8s.io/v1"


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("0.5", "500m"),
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        (1, "1"),
        (2.5, "2500m"),
        ("1000m", "1"),
        ("2000", "2k"),
        ("100Ki", "100Ki"),
        ("1e3", "1e3"),
        ("128974848", "128974848"),
        ("0", "0"),
    ],
)
def test_quantities_are_canonical(given: Any, stored: str) -> None:
    assert typed.canonical_quantity(given) == stored


def test_a_schema_that_requires_metadata_accepts_any_object() -> None:
    """The Spark Operator's CRD requires ``metadata`` at the top; every stored object has it."""
    schema = {"type": "object", "required": ["metadata", "spec"], "properties": {}}
    assert schema_check.problems(schema, {"metadata": {"name": "a"}, "spec": {}}) == []
    assert schema_check.problems(schema, {"metadata": {"name": "a"}}) == ["spec: Required value"]


def test_typed_round_trip_drops_empty_lists_and_bad_quantities_are_refused() -> None:
    container = {"name": "c", "env": [], "args": [], "resources": {"requests": {"cpu": "0.5"}}}
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "d", "labels": {}},
        "spec": {"template": {"spec": {"containers": [container], "volumes": []}}},
    }
    stored = typed.round_trip(deployment)
    assert stored["spec"]["template"]["spec"] == {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]
    }
    assert "labels" not in stored["metadata"]
    container["resources"] = {"limits": {"memory": "lots"}}
    with pytest.raises(typed.QuantityError):
        typed.round_trip(deployment)


def _deployment(image: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "labels": {"a": "1"}},
        "spec": {
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "c", "image": image}]}},
        },
    }


def test_server_side_apply_owns_merges_conflicts_and_removes() -> None:
    first = ssa.apply(None, _deployment("i:1"), "op", force=False)
    (entry,) = first["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == ("op", "Apply")
    assert entry["fieldsV1"]["f:spec"]["f:replicas"] == {}
    # Someone scales by hand: they now own replicas.
    scaled = json.loads(json.dumps(first))
    scaled["spec"]["replicas"] = 7
    scaled = ssa.record_update(first, scaled, "kubectl", None)
    assert {e["manager"] for e in scaled["metadata"]["managedFields"]} == {"op", "kubectl"}
    with pytest.raises(ssa.ApplyConflictError, match=r'conflict with "kubectl": \.spec\.replicas'):
        ssa.apply(scaled, _deployment("i:1"), "op", force=False)
    taken = ssa.apply(scaled, _deployment("i:1"), "op", force=True)
    assert taken["spec"]["replicas"] == 1
    assert {e["manager"] for e in taken["metadata"]["managedFields"]} == {"op"}
    # The same apply again changes nothing, not even managedFields.
    assert ssa.apply(taken, _deployment("i:1"), "op", force=True) == taken
    # A field the manager stops applying is removed.
    smaller = _deployment("i:2")
    del smaller["metadata"]["labels"]
    result = ssa.apply(taken, smaller, "op", force=True)
    assert result["metadata"].get("labels", {}) == {}
    assert result["spec"]["template"]["spec"]["containers"] == [{"name": "c", "image": "i:2"}]


@pytest.mark.parametrize("repeat", range(5))  # removal order once depended on set order
def test_applying_a_changed_list_key_replaces_the_item(repeat: int) -> None:
    def service(port: int) -> dict[str, Any]:
        ports = [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "s"},
            "spec": {"ports": ports},
        }

    moved = ssa.apply(
        ssa.apply(None, service(8080), "op", force=True), service(8081), "op", force=True
    )
    assert moved["spec"]["ports"] == service(8081)["spec"]["ports"]


def test_manager_name_comes_from_the_query_or_the_user_agent() -> None:
    assert ssa.manager_name({"fieldManager": "x"}, "Python/3.11 aiohttp/3.12") == "x"
    assert ssa.manager_name({}, "Python/3.11 aiohttp/3.12") == "Python"


def test_pruning_of_undeclared_fields() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer"},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "map": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            }
        },
    }
    obj = {
        "metadata": {"name": "x"},
        "spec": {"a": 1, "b": 2, "free": {"any": 1}, "map": {"k": "v"}},
    }
    assert pruning.prune(obj, schema) == [".spec.b"]
    assert obj["spec"] == {"a": 1, "free": {"any": 1}, "map": {"k": "v"}}


def test_deployment_controller_status_before_and_after_pods_are_ready() -> None:
    deployment: dict[str, Any] = {
        "metadata": {"name": "d", "generation": 1},
        "spec": {"replicas": 2},
    }
    status = controllers.deployment_status(deployment)
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert status["observedGeneration"] == 1 and status["unavailableReplicas"] == 2
    assert "readyReplicas" not in status
    assert conditions == {
        "Available": ("False", "MinimumReplicasUnavailable"),
        "Progressing": ("True", "NewReplicaSetCreated"),
    }
    deployment["status"] = {**status, "readyReplicas": 2}
    status = controllers.deployment_status(deployment)
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Progressing"] == ("True", "NewReplicaSetAvailable")
    assert conditions["Available"] == ("True", "MinimumReplicasAvailable")
    # After the deadline without progress, the rollout is reported failed.
    deployment["status"] = controllers.deployment_status({**deployment, "status": {}})
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=601)
    stalled = controllers.deployment_status(deployment, later)
    progressing = next(c for c in stalled["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "ProgressDeadlineExceeded")


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(tmp_path_factory.mktemp("truth"), operator=False) as box:
        box.kubectl("apply", "-f", str(CRDS))
        yield box


def test_kubectl_validates_on_the_server_without_validate_false(apiserver: Sandbox) -> None:
    """kubectl reads /openapi/v3, sends fieldValidation=Strict, and the unknown field is
    refused, naming it; the same field is pruned for a client that does not ask."""
    body = json.loads(_manifest("strict"))
    body["spec"]["workerz"] = {"min": 1}
    out = apiserver.kubectl("apply", "-f", "-", stdin=json.dumps(body), check=False)
    assert 'strict decoding error: unknown field "spec.workerz"' in out
    created = apiserver.send(
        "POST",
        "/apis/statetier.io/v1alpha1/namespaces/default/compactionservices",
        body,
        "application/json",
    )
    assert "workerz" not in created["spec"] and created["spec"]["workers"]["min"] == 1


def test_a_crd_whose_rule_fails_on_its_default_is_refused(
    apiserver: Sandbox, tmp_path: Any
) -> None:
    crd = (CRDS / "compactionservice.yaml").read_text()
    crd = crd.replace(
        '"!has(self.min) || !has(self.max) || self.min <= self.max"', "self.min <= self.max"
    )
    crd = crd.replace("compactionservices.statetier.io", "compactionservices.example.com")
    crd = crd.replace("group: statetier.io", "group: example.com")
    path = tmp_path / "crd.yaml"
    path.write_text(crd)
    out = apiserver.kubectl("apply", "-f", str(path), check=False)
    assert (
        'properties[workers].default: Invalid value: "object": no such key: min evaluating '
        "rule: workers.min must not exceed workers.max"
    ) in out


def test_webhook_selectors_are_honoured() -> None:
    """namespaceSelector (on the namespace's labels, which include kubernetes.io/metadata.name
    as the apiserver sets it) and objectSelector decide whether a webhook is called."""
    from statetier.kubetest.emulator import ApiEmulator

    emulator = ApiEmulator()
    ns = emulator.read_object("", "namespaces", None, "default")
    assert ns is not None and ns["metadata"]["labels"] == {"kubernetes.io/metadata.name": "default"}
    hook = {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["default"]}
            ]
        },
        "objectSelector": {"matchLabels": {"statetier.io/enabled": "true"}},
    }
    opted_in = {"namespace": "default", "labels": {"statetier.io/enabled": "true"}}
    assert emulator._hook_selects(hook, {"metadata": opted_in})
    assert not emulator._hook_selects(hook, {"metadata": {**opted_in, "namespace": "kube-system"}})
    assert not emulator._hook_selects(hook, {"metadata": {"namespace": "default"}})
    assert emulator._hook_selects({}, {"metadata": {"namespace": "kube-system"}})


def test_the_openapi_schema_of_a_custom_resource_is_enforced(apiserver: Sandbox) -> None:
    body = json.loads(_manifest("bounds", workers={"min": 1, "max": 0}))
    body["spec"]["scheduling"] = {"policy": "random"}
    out = apiserver.kubectl("apply", "-f", "-", stdin=json.dumps(body), check=False)
    assert "spec.workers.max: Invalid value: 0" in out
    assert 'spec.scheduling.policy: Invalid value: "random"' in out
    del body["spec"]["image"]
    body["spec"]["workers"] = {}
    body["spec"]["scheduling"] = {}
    out = apiserver.kubectl("apply", "-f", "-", stdin=json.dumps(body), check=False)
    assert "spec.image: Required value" in out
    assert (
        apiserver.get("/apis/statetier.io/v1alpha1/namespaces/default/compactionservices/bounds")
        is None
    )


def test_a_crd_of_a_protected_group_needs_the_approval_annotation(
    apiserver: Sandbox, tmp_path: Any
) -> None:
    fixture = yaml.safe_load(SPARK_CRD.read_text())
    del fixture["metadata"]["annotations"]["api-approved.kubernetes.io"]
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump(fixture))
    out = apiserver.kubectl("apply", "-f", str(path), check=False)
    assert 'protected groups must have approval annotation "api-approved.kubernetes.io"' in out
    assert "created" in apiserver.kubectl("apply", "-f", str(SPARK_CRD))


def test_built_ins_get_the_apiservers_defaults_which_the_applier_does_not_own(
    apiserver: Sandbox,
) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "defaulted"},
        "spec": {"selector": {"a": "b"}, "ports": [{"name": "http", "port": 80}]},
    }
    path = "/api/v1/namespaces/default/services/defaulted?fieldManager=tester"
    stored = apiserver.send("PATCH", path, service, "application/apply-patch+yaml")
    spec = stored["spec"]
    assert spec["type"] == "ClusterIP" and spec["clusterIP"].startswith("10.96.")
    assert spec["ports"] == [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}]
    (entry,) = stored["metadata"]["managedFields"]
    owned = entry["fieldsV1"]["f:spec"]
    assert "f:clusterIP" not in owned and "f:type" not in owned
    assert set(owned) == {"f:selector", "f:ports"}
    again = apiserver.send("PATCH", path, service, "application/apply-patch+yaml")
    assert again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


def test_a_secret_s_string_data_is_stored_as_data(apiserver: Sandbox) -> None:
    """As on a real apiserver: stringData is write-only, merged into data (base64, its keys
    winning over data's), and the type defaults to Opaque."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "plain"},
        "data": {"a": base64.b64encode(b"old").decode(), "b": base64.b64encode(b"kept").decode()},
        "stringData": {"a": "new"},
    }
    apiserver.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    stored = apiserver.get("/api/v1/namespaces/default/secrets/plain")
    assert "stringData" not in stored and stored["type"] == "Opaque"
    decoded = {k: base64.b64decode(v).decode() for k, v in stored["data"].items()}
    assert decoded == {"a": "new", "b": "kept"}


def test_an_object_written_after_its_owner_is_gone_is_collected(apiserver: Sandbox) -> None:
    """A controller acting on a stale copy of a deleted owner creates dependents nobody owns:
    the garbage collector removes them, as it removes those of an owner being deleted."""
    owner = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "owner"}}
    apiserver.kubectl("apply", "-f", "-", stdin=json.dumps(owner))
    uid = apiserver.get("/api/v1/namespaces/default/secrets/owner")["metadata"]["uid"]
    apiserver.kubectl("delete", "secret", "owner")
    ref = {"apiVersion": "v1", "kind": "Secret", "name": "owner", "uid": uid}
    for name in ("late", "alive"):
        dependent: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
        }
        if name == "late":
            dependent["metadata"]["ownerReferences"] = [ref]
        apiserver.kubectl("apply", "-f", "-", stdin=json.dumps(dependent))
    apiserver.wait(
        "late collected", lambda: apiserver.get("/api/v1/namespaces/default/secrets/late") is None
    )
    assert apiserver.get("/api/v1/namespaces/default/secrets/alive") is not None


def _webhook_configuration(name: str, conditions: list[dict[str, str]], **hook: Any) -> str:
    """A ValidatingWebhookConfiguration whose one webhook judges the ConfigMaps labelled
    ``truth=<name>`` and points at a closed port: a call fails, under ``failurePolicy`` Fail
    unless ``hook`` says otherwise."""
    return json.dumps(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": f"{name}.example.com",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["configmaps"],
                            "operations": ["CREATE", "UPDATE", "DELETE"],
                        }
                    ],
                    "objectSelector": {"matchLabels": {"truth": name}},
                    "clientConfig": {"url": f"https://127.0.0.1:{free_port()}/{name}"},
                    "matchConditions": conditions,
                    **hook,
                }
            ],
        }
    )


def _config_map(name: str, label: str, **meta: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"truth": label}, **meta},
        }
    )


def test_a_match_condition_that_does_not_compile_is_refused(apiserver: Sandbox) -> None:
    bad = [{"name": "broken", "expression": "object.metadata.name =="}]
    out = apiserver.kubectl(
        "apply", "-f", "-", stdin=_webhook_configuration("broken", bad), check=False
    )
    assert 'ValidatingWebhookConfiguration.admissionregistration.k8s.io "broken" is invalid' in out
    assert "webhooks[0].matchConditions[0].expression" in out
    assert 'webhook "broken.example.com", condition "broken"' in out
    assert apiserver.get(f"{ADMISSION}/validatingwebhookconfigurations/broken") is None


def test_match_conditions_decide_whether_a_webhook_is_called(apiserver: Sandbox) -> None:
    """All true: called (and the closed port refuses); one false: skipped. ``object`` is null
    for DELETE, ``oldObject`` for CREATE; ``request`` carries the operation and the name."""
    conditions = [
        {"name": "not-spared", "expression": "request.name != 'spared'"},
        {
            "name": "create-or-delete",
            "expression": "(request.operation == 'CREATE' && oldObject == null)"
            " || (request.operation == 'DELETE' && object == null"
            " && oldObject.metadata.name == request.name)",
        },
    ]
    apiserver.kubectl("apply", "-f", "-", stdin=_webhook_configuration("decide", conditions))
    out = apiserver.kubectl("apply", "-f", "-", stdin=_config_map("judged", "decide"), check=False)
    assert 'failed calling webhook "decide.example.com"' in out
    apiserver.kubectl("apply", "-f", "-", stdin=_config_map("spared", "decide"))
    out = apiserver.kubectl("delete", "configmap", "spared", check=False)
    assert 'configmap "spared" deleted' in out  # DELETE of the spared one: skipped
    apiserver.kubectl("apply", "-f", "-", stdin=_config_map("doomed", "other"))
    # An UPDATE (create-or-delete is false): skipped, though it brings the object in scope.
    apiserver.kubectl("label", "configmap", "doomed", "truth=decide", "--overwrite")
    out = apiserver.kubectl("delete", "configmap", "doomed", check=False)
    assert 'failed calling webhook "decide.example.com"' in out
    apiserver.kubectl("delete", "validatingwebhookconfiguration", "decide")


def test_a_condition_that_errors_applies_the_failure_policy(apiserver: Sandbox) -> None:
    """A missing key is an error: Fail refuses the request, Ignore skips the webhook; a false
    condition wins over an error."""
    errs = [{"name": "reads-absent", "expression": "object.data['absent'] == 'x'"}]
    apiserver.kubectl("apply", "-f", "-", stdin=_webhook_configuration("errs", errs))
    out = apiserver.kubectl("apply", "-f", "-", stdin=_config_map("errs", "errs"), check=False)
    assert 'failed calling webhook "errs.example.com"' in out
    assert "failed evaluating match conditions" in out and "reads-absent" in out
    ignored = _webhook_configuration("ignored", errs, failurePolicy="Ignore")
    apiserver.kubectl("apply", "-f", "-", stdin=ignored)
    apiserver.kubectl("apply", "-f", "-", stdin=_config_map("ignored", "ignored"))
    spared = [*errs, {"name": "never", "expression": "false"}]
    apiserver.kubectl("apply", "-f", "-", stdin=_webhook_configuration("false-wins", spared))
    apiserver.kubectl("apply", "-f", "-", stdin=_config_map("false-wins", "false-wins"))
    for name in ("errs", "ignored", "false-wins"):
        apiserver.kubectl("delete", "validatingwebhookconfiguration", name)


def test_updates_of_an_object_being_deleted_are_admitted(apiserver: Sandbox) -> None:
    """The apiserver sends a finalizer's removal to the webhooks like any update: without a
    condition that skips objects being deleted, a webhook that is down blocks it."""
    apiserver.kubectl(
        "apply", "-f", "-", stdin=_config_map("held", "other", finalizers=["example.com/hold"])
    )
    apiserver.kubectl("delete", "configmap", "held", "--wait=false")
    apiserver.kubectl("label", "configmap", "held", "truth=held", "--overwrite")
    apiserver.kubectl("apply", "-f", "-", stdin=_webhook_configuration("held", []))
    remove = '[{"op": "remove", "path": "/metadata/finalizers"}]'
    args = ("patch", "configmap", "held", "--type=json", "-p", remove)
    assert 'failed calling webhook "held.example.com"' in apiserver.kubectl(*args, check=False)
    skip = [{"name": "not-being-deleted", "expression": "!has(object.metadata.deletionTimestamp)"}]
    apiserver.kubectl("apply", "-f", "-", stdin=_webhook_configuration("held", skip))
    apiserver.kubectl(*args)
    assert apiserver.get("/api/v1/namespaces/default/configmaps/held") is None
    apiserver.kubectl("delete", "validatingwebhookconfiguration", "held")

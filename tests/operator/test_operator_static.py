"""Static checks: CRDs are structural and valid, examples validate, manifests pass
kubernetes-validate, and the operator's defaults match the CRD's."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from statetier.kubetest import cel_rules
from statetier.operator import compaction_service

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33.0"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


CRD_FILES = [
    *sorted((REPO / "crds").glob("*.yaml")),
    Path(__file__).parent / "fixtures" / "sparkapplication-crd.yaml",
]
CRDS = {d["metadata"]["name"]: d for f in CRD_FILES for d in _docs(f)}


def _crd_schema(kind: str) -> dict[str, Any]:
    crd = next(c for c in CRDS.values() if c["spec"]["names"]["kind"] == kind)
    version = next(v for v in crd["spec"]["versions"] if v["storage"])
    return dict(version["schema"]["openAPIV3Schema"])


def _structural_problems(schema: dict[str, Any], where: str) -> list[str]:
    """The structural-schema rules of apiextensions.k8s.io/v1 that a YAML mistake breaks."""
    problems = []
    if "$ref" in schema:
        problems.append(f"{where}: $ref is not allowed")
    allowed_untyped = schema.get("x-kubernetes-int-or-string") or schema.get(
        "x-kubernetes-preserve-unknown-fields"
    )
    if "type" not in schema and not allowed_untyped:
        problems.append(f"{where}: no type")
    if schema.get("x-kubernetes-int-or-string") and schema.get("anyOf") not in (
        None,
        [{"type": "integer"}, {"type": "string"}],
    ):
        problems.append(f"{where}: int-or-string needs anyOf integer/string")
    if "anyOf" in schema and not schema.get("x-kubernetes-int-or-string"):
        problems.append(f"{where}: anyOf only with int-or-string here")
    for name, sub in (schema.get("properties") or {}).items():
        problems += _structural_problems(sub, f"{where}.{name}")
    if isinstance(schema.get("items"), dict):
        problems += _structural_problems(schema["items"], f"{where}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += _structural_problems(schema["additionalProperties"], f"{where}{{}}")
    for key in ("required",):
        for name in schema.get(key, []):
            if name not in (schema.get("properties") or {}):
                problems.append(f"{where}: required {name} is not a property")
    if "default" in schema:
        try:
            jsonschema.validate(schema["default"], _to_jsonschema(schema))
        except jsonschema.ValidationError as exc:
            problems.append(f"{where}: default does not validate: {exc.message}")
    return problems


def _to_jsonschema(schema: Any) -> Any:
    """OpenAPI v3 CRD schema -> JSON Schema (drop the x-kubernetes-* extensions)."""
    if isinstance(schema, dict):
        out = {k: _to_jsonschema(v) for k, v in schema.items() if not k.startswith("x-")}
        if schema.get("x-kubernetes-int-or-string"):
            out.pop("pattern", None)  # applies to the string form only
        return out
    if isinstance(schema, list):
        return [_to_jsonschema(v) for v in schema]
    return schema


@pytest.mark.parametrize("name", sorted(CRDS))
def test_crd_is_structural_and_passes_kubernetes_validate(name: str) -> None:
    crd = CRDS[name]
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        assert _structural_problems(schema, name) == []
        jsonschema.Draft4Validator.check_schema(_to_jsonschema(schema))


def test_compactionservice_crd_has_subresources_columns_and_short_name() -> None:
    crd = CRDS["compactionservices.statetier.io"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    scale = version["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.workers.replicas"
    assert scale["statusReplicasPath"] == ".status.workers.current"
    assert scale["labelSelectorPath"] == ".status.workers.selector"
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Endpoint", "Workers", "Ready", "Age"} <= columns
    assert crd["spec"]["names"]["shortNames"] == ["compsvc"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["scheduling"]["properties"]["policy"]["enum"] == ["fifo", "fair"]
    assert spec["properties"]["workers"]["properties"]["min"]["minimum"] == 0


def _undocumented(schema: dict[str, Any], where: str) -> list[str]:
    missing = [] if "description" in schema else [where]
    for name, sub in (schema.get("properties") or {}).items():
        missing += _undocumented(sub, f"{where}.{name}")
    return missing


def test_every_compactionservice_spec_field_is_described() -> None:
    spec = _crd_schema("CompactionService")["properties"]["spec"]
    assert _undocumented(spec, "spec") == []


def _apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _apply_defaults(value[name], sub)
    return value


@pytest.mark.parametrize(
    "example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name
)
def test_examples_validate(example: Path) -> None:
    docs = _docs(example)
    assert docs, f"{example} is empty"
    for doc in docs:
        if doc["kind"] in ("CompactionService", "SparkApplication"):
            schema = _to_jsonschema(_crd_schema(doc["kind"]))
            jsonschema.validate(doc, schema)
            defaulted = _apply_defaults(copy.deepcopy(doc), _crd_schema(doc["kind"]))
            jsonschema.validate(defaulted, schema)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_schema_rejects_what_it_should() -> None:
    schema = _to_jsonschema(_crd_schema("CompactionService"))
    example = next(
        d
        for d in _docs(REPO / "examples" / "compactionservice.yaml")
        if d["kind"] == "CompactionService"
    )
    for path, bad in (
        (("spec", "workers", "max"), 0),
        (("spec", "scheduling", "policy"), "random"),
        (("spec", "objectStorage", "allowedPrefixes"), ["ftp://x/"]),
        (("spec", "gateway", "port"), 70000),
    ):
        doc = copy.deepcopy(example)
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)


def test_generated_manifests_pass_kubernetes_validate() -> None:
    example = next(
        d
        for d in _docs(REPO / "examples" / "compactionservice.yaml")
        if d["kind"] == "CompactionService"
    )
    body = copy.deepcopy(example)
    body["metadata"]["uid"] = "8d2c1f9e-0000-4000-8000-000000000001"
    objects = compaction_service.desired_objects(body)
    assert [o["kind"] for o in objects] == ["Deployment", "Service", "Deployment"]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _example_objects() -> list[dict[str, Any]]:
    example = next(
        d
        for d in _docs(REPO / "examples" / "compactionservice.yaml")
        if d["kind"] == "CompactionService"
    )
    body = copy.deepcopy(example)
    body["metadata"]["uid"] = "8d2c1f9e-0000-4000-8000-000000000001"
    return compaction_service.desired_objects(body)


def _dockerfile_user() -> int:
    lines = (REPO / "compaction" / "Dockerfile").read_text().splitlines()
    return int(next(line.split()[1] for line in reversed(lines) if line.startswith("USER ")))


def test_compaction_pods_meet_the_restricted_pod_security_standard() -> None:
    """The checks of the "restricted" profile that a pod spec controls, per Deployment."""
    deployments = [o for o in _example_objects() if o["kind"] == "Deployment"]
    assert len(deployments) == 2
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == _dockerfile_user()
        assert security["seccompProfile"]["type"] == "RuntimeDefault"
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert context["readOnlyRootFilesystem"] is True
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]]  # the one writable path


def test_operator_defaults_match_the_crd() -> None:
    spec_schema = _crd_schema("CompactionService")["properties"]["spec"]
    minimal = {"image": "x", "objectStorage": {"allowedPrefixes": ["s3://b/"]}}
    defaulted = _apply_defaults(copy.deepcopy(minimal), spec_schema)
    assert compaction_service.with_defaults(minimal) == defaulted


# ------------------------------------------------- CEL rules (x-kubernetes-validations)


@pytest.mark.parametrize("name", sorted(CRDS))
def test_every_cel_rule_compiles_and_holds_on_its_defaults(name: str) -> None:
    """What the apiserver checks when the CRD is applied: a rule that fails on its node's
    ``default`` (e.g. reads a field the default lacks) makes the CRD uninstallable."""
    for version in CRDS[name]["spec"]["versions"]:
        assert cel_rules.check_defaults(version["schema"]["openAPIV3Schema"]) == []


def test_the_cel_check_catches_a_rule_that_cannot_read_its_default() -> None:
    """The check itself: the rule this CRD once had is refused the way kube-apiserver refused
    it (``no such key: min evaluating rule``)."""
    schema = copy.deepcopy(_crd_schema("CompactionService"))
    workers = schema["properties"]["spec"]["properties"]["workers"]
    workers["x-kubernetes-validations"] = [
        {"rule": "self.min <= self.max", "message": "workers.min must not exceed workers.max"}
    ]
    (problem,) = cel_rules.check_defaults(schema)
    assert problem.field.endswith("properties[spec].properties[workers].default")
    assert "no such key: min evaluating rule: workers.min must not exceed workers.max" in str(
        problem
    )


def test_examples_pass_every_cel_rule_once_defaulted() -> None:
    checked = 0
    for example in sorted((REPO / "examples").glob("*.yaml")):
        for doc in _docs(example):
            if doc["kind"] not in ("CompactionService", "SparkApplication"):
                continue
            schema = _crd_schema(doc["kind"])
            defaulted = _apply_defaults(copy.deepcopy(doc), schema)
            assert cel_rules.check_object(schema, defaulted) == [], example
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize(
    ("workers", "allowed"),
    [
        ({}, True),
        ({"min": 3}, True),
        ({"max": 9}, True),
        ({"min": 2, "max": 2}, True),
        ({"min": 5, "max": 2}, False),
        ({"min": 6}, False),  # max defaults to 4
    ],
)
def test_the_workers_rule_on_defaulted_objects(workers: dict[str, int], allowed: bool) -> None:
    schema = _crd_schema("CompactionService")
    doc = {"spec": {"image": "i", "objectStorage": {"allowedPrefixes": ["s3://b/"]}}}
    doc["spec"]["workers"] = workers
    problems = cel_rules.check_object(schema, _apply_defaults(doc, schema))
    assert (problems == []) is allowed, problems

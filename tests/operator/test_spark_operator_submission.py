"""Every SparkApplication our webhook writes must be one the Spark Operator can submit.

The API emulator serves the Spark Operator's own CRD (v2.5.2, tests/operator/fixtures/
spark-operator); the real operator and its webhooks run. Each official example, opted in with
each spill volume kind, and each SparkApplication under the repository's examples/, is
applied; the stored, mutated object is read back and given to the double of the Spark
Operator (:mod:`statetier.kubetest.spark_operator`), which must admit and submit it. The
resulting Spark conf must carry what statetier relies on: the spill volume mounted where the
backend spills, the storage Secret in the executors' environment, the memory overhead the
webhook wrote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from statetier.kubetest import spark_operator
from statetier.kubetest.processes import Sandbox
from statetier.operator.annotations import STATUS

from tests.operator.conftest import CRDS, EXAMPLES

Obj = dict[str, Any]
FIXTURES = Path(__file__).parent / "fixtures" / "spark-operator"
OFFICIAL_CRD = FIXTURES / "sparkoperator.k8s.io_sparkapplications.yaml"
SPARK = "/apis/sparkoperator.k8s.io/v1beta2/namespaces/default/sparkapplications"
OFFICIAL = [
    "spark-pi",
    "spark-pi-python",
    "spark-pi-pod-template",
    "spark-pi-configmap",
    "spark-pi-emptydir",
    "spark-pi-dynamic-allocation",
]
SECRET, SECRET_DATA = "store", {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}
SPILL_KINDS: dict[str, dict[str, str]] = {
    "emptyDir": {"statetier.io/spill-size": "20Gi"},
    "hostPath": {"statetier.io/spill-host-path": "/mnt/statetier"},
    "ephemeral": {
        "statetier.io/spill-size": "10Gi",
        "statetier.io/spill-storage-class": "local-ssd",
    },
}
LOCAL_DIR_MOUNT = re.compile(
    r"spark\.kubernetes\.executor\.volumes\.(\w+)\.spark-local-dir-statetier\.mount\.path"
)


def _applications(path: Path) -> list[Obj]:
    return [
        doc
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "SparkApplication"
    ]


def _secrets(path: Path) -> dict[str, dict[str, str]]:
    """The Secrets an example file brings (the pod template example's envFrom names one),
    with ours: what the executor's environment is made of."""
    found = {SECRET: SECRET_DATA}
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "Secret":
            found[doc["metadata"]["name"]] = doc.get("stringData") or {}
    return found


def _repo_applications() -> list[Path]:
    found = [p for p in sorted(EXAMPLES.rglob("*.yaml")) if _applications(p)]
    assert found, "no SparkApplication under examples/"
    return found


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """Emulator with the Spark Operator's own CRD, then the real operator with its webhooks."""
    box = Sandbox(tmp_path_factory.mktemp("spark-operator"), operator=False)
    with box:
        box.kubectl("apply", "-f", str(CRDS), "-f", str(OFFICIAL_CRD))
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": "default"},
            "stringData": SECRET_DATA,
        }
        box.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
        box.start_operator_process()
        box.wait_for_operator()
        yield box


def _stored(box: Sandbox, app: Obj) -> Obj:
    """Apply ``app`` through the webhooks and read back what the apiserver stored."""
    box.kubectl("apply", "-f", "-", stdin=json.dumps(app))
    stored: Obj = box.get(f"{SPARK}/{app['metadata']['name']}")
    return stored


def _opted_in(app: Obj, name: str, kind: str) -> Obj:
    meta = app["metadata"]
    annotations = {
        **(meta.get("annotations") or {}),
        "statetier.io/enabled": "true",
        "statetier.io/storage-secret": SECRET,
        "statetier.io/spill-volume": kind,
        **SPILL_KINDS[kind],
    }
    return {**app, "metadata": {**meta, "name": name, "annotations": annotations}}


def _submitted(box: Sandbox, app: Obj) -> tuple[Obj, spark_operator.Submission]:
    stored = _stored(box, app)
    spark_operator.validate(stored)
    return stored, spark_operator.submit(stored)


def _check_statetier_conf(
    stored: Obj, submission: spark_operator.Submission, secrets: dict[str, dict[str, str]]
) -> None:
    """The spill mount is the backend's spill dir, the Secret reaches the executors, the
    memory overhead is the webhook's."""
    conf = submission.conf
    mounts = {k: v for k, v in conf.items() if LOCAL_DIR_MOUNT.fullmatch(k)}
    assert list(mounts.values()) == [conf["spark.statetier.spill.dirs"]], mounts
    annotations = stored["metadata"]["annotations"]
    if "statetier.io/storage-secret" in annotations:
        assert {"secretRef": {"name": SECRET}} in submission.executor_container()["envFrom"]
        env = submission.executor_environment(secrets)
        assert {k: env[k] for k in SECRET_DATA} == SECRET_DATA
    summary = json.loads(annotations[STATUS])
    written = stored["spec"]["executor"]["memoryOverhead"]
    assert conf["spark.executor.memoryOverhead"] == written == summary["memoryOverheadWritten"]


def _check_on_demand_claim(conf: dict[str, str], annotations: dict[str, str]) -> None:
    """Spark's on-demand PVC: a claim per executor, of the size and class asked for."""
    prefix = "spark.kubernetes.executor.volumes.persistentVolumeClaim.spark-local-dir-statetier"
    assert conf[f"{prefix}.options.claimName"] == "OnDemand"
    assert conf[f"{prefix}.options.sizeLimit"] == annotations["statetier.io/spill-size"]
    storage_class = annotations["statetier.io/spill-storage-class"]
    assert conf[f"{prefix}.options.storageClass"] == storage_class


def _cases() -> Iterator[Any]:
    for example in OFFICIAL:
        for kind in SPILL_KINDS:
            yield pytest.param(example, kind, id=f"{example}-{kind}")


@pytest.mark.parametrize(("example", "kind"), list(_cases()))
def test_official_example_opted_in_is_submitted(sandbox: Sandbox, example: str, kind: str) -> None:
    (app,) = _applications(FIXTURES / f"{example}.yaml")
    name = f"{example}-{kind.lower()}"
    stored, submission = _submitted(sandbox, _opted_in(app, name, kind))
    assert submission.args[submission.args.index("--name") + 1] == name
    _check_statetier_conf(stored, submission, _secrets(FIXTURES / f"{example}.yaml"))
    if kind == "ephemeral":
        _check_on_demand_claim(submission.conf, stored["metadata"]["annotations"])


def _repo_cases() -> Iterator[Any]:
    for path in _repo_applications():
        for index in range(len(_applications(path))):
            case_id = f"{path.relative_to(EXAMPLES)}[{index}]"
            yield pytest.param(path, index, id=case_id)


@pytest.mark.parametrize(("path", "index"), list(_repo_cases()))
def test_repository_example_is_submitted(sandbox: Sandbox, path: Path, index: int) -> None:
    app = _applications(path)[index]
    annotations = app["metadata"].get("annotations") or {}
    if "statetier.io/storage-secret" in annotations:  # our test's Secret stands for the example's
        annotations = {**annotations, "statetier.io/storage-secret": SECRET}
    app = {**app, "metadata": {**app["metadata"], "annotations": annotations}}
    stored, submission = _submitted(sandbox, app)
    _check_statetier_conf(stored, submission, _secrets(path))
    if annotations.get("statetier.io/spill-volume") == "ephemeral":
        _check_on_demand_claim(submission.conf, annotations)


def test_the_official_crd_is_served(sandbox: Sandbox) -> None:
    """Not the minimal fixture CRD: the Spark Operator's schema checks what is stored."""
    crd = sandbox.get(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/sparkapplications.sparkoperator.k8s.io"
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "dynamicAllocation" in schema["properties"]["spec"]["properties"]

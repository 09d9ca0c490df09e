"""While no operator runs: admissions fail closed, deletions are never blocked.

The operator manages its webhook configurations (the ``statetier-operator run`` default) and
is stopped, normally (SIGTERM) or not (SIGKILL). The configurations must stay, with their
matchConditions, so the apiserver refuses an opted-in SparkApplication it cannot mutate
(``failurePolicy: Fail``) rather than admit it with no spill volume or settings; and what the
webhooks do not judge goes through: deletions (a CompactionService's webhook and the
SparkApplication webhooks judge CREATE and UPDATE only), writes to an object being deleted
(a finalizer removed by hand), metadata-only updates (a label), and SparkApplications that
never opted in. The applications are created while the operator runs, so they are mutated and,
for retention ``delete``, finalized.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from statetier.kubetest.processes import Sandbox
from statetier.kubetest.processes import compaction_service_manifest as _manifest
from statetier.operator import webhook_configuration

from tests.operator.conftest import CRDS, SPARK_CRD

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sparkapplication-wordcount.yaml"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
CS = "/apis/statetier.io/v1alpha1/namespaces/default/compactionservices"
SPARK = "/apis/sparkoperator.k8s.io/v1beta2/namespaces/default/sparkapplications"
DROPPING = {
    "statetier.io/checkpoint-retention": "delete",
    "statetier.io/checkpoint-uri": "file:///x",
}


def _app(name: str, annotations: dict[str, str] | None) -> str:
    """A SparkApplication, opted in with ``annotations`` (None: no statetier annotation)."""
    meta: dict[str, object] = {"name": name, "namespace": "default"}
    if annotations is not None:
        meta["annotations"] = {"statetier.io/enabled": "true", **annotations}
    return json.dumps(
        {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "SparkApplication",
            "metadata": meta,
            "spec": {"type": "Python", "mode": "cluster", "executor": {"instances": 1}},
        }
    )


def _create_while_running(box: Sandbox) -> None:
    """What the tests find once the operator is gone: a CompactionService reconciled, opted-in
    applications mutated, one with retention delete finalized."""
    box.kubectl("apply", "-f", "-", stdin=_manifest("kept"))
    for name, opted_in in (("retained", {}), ("labelled", {}), ("dropping", DROPPING)):
        box.kubectl("apply", "-f", "-", stdin=_app(name, opted_in))
        assert box.get(f"{SPARK}/{name}")["metadata"]["annotations"]["statetier.io/status"]
    box.wait(
        "kept reconciled",
        lambda: box.get("/apis/apps/v1/namespaces/default/deployments/kept-workers"),
    )
    box.wait(
        "dropping finalized",
        lambda: box.get(f"{SPARK}/dropping")["metadata"].get("finalizers"),
    )


@pytest.fixture(scope="module", params=["SIGTERM", "SIGKILL"])
def stopped(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sandbox]:
    """A sandbox whose operator ran, reconciled one CompactionService and admitted three
    opted-in applications, and was stopped normally (SIGTERM: kopf's shutdown) or killed
    (SIGKILL: nothing cleaned up)."""
    box = Sandbox(tmp_path_factory.mktemp("stopped"), operator=False)
    with box:
        box.kubectl("apply", "-f", str(CRDS), "-f", str(SPARK_CRD))
        box.start_operator_process()
        box.wait_for_operator()
        _create_while_running(box)
        assert box.operator is not None
        if request.param == "SIGKILL":
            box.operator.kill()
            box.operator.wait(timeout=10)
        box.stop_operator()
        yield box


def _webhooks(box: Sandbox, kind: str) -> list[dict[str, object]]:
    config = box.get(f"{ADMISSION}/{kind}webhookconfigurations/statetier.io")
    return list(config.get("webhooks") or [])


def test_webhook_configurations_stay_after_a_normal_stop(stopped: Sandbox) -> None:
    mutating = {w["name"] for w in _webhooks(stopped, "mutating")}
    validating = {w["name"] for w in _webhooks(stopped, "validating")}
    assert mutating == {"mutate-sparkapplication.statetier.io"}
    assert validating == {
        "validate-sparkapplication.statetier.io",
        "validate-compactionservice.statetier.io",
    }
    for hook in _webhooks(stopped, "mutating") + _webhooks(stopped, "validating"):
        assert hook["failurePolicy"] == "Fail"
        for rule in hook["rules"]:  # type: ignore[attr-defined]
            assert sorted(rule["operations"]) == ["CREATE", "UPDATE"], hook
        hook_id = str(hook["name"]).removesuffix(".statetier.io")
        assert hook["matchConditions"] == webhook_configuration.match_conditions(hook_id)


def test_an_opted_in_application_is_refused_while_no_operator_runs(stopped: Sandbox) -> None:
    out = stopped.kubectl("apply", "-f", str(EXAMPLE), check=False)
    assert "failed calling webhook" in out and "mutate-sparkapplication" in out
    assert (
        stopped.get(
            "/apis/sparkoperator.k8s.io/v1beta2/namespaces/default/sparkapplications/wordcount"
        )
        is None
    )


def test_a_compaction_service_can_be_deleted_while_no_operator_runs(stopped: Sandbox) -> None:
    out = stopped.kubectl("delete", "compactionservice", "kept", "--timeout=10s", check=False)
    assert 'compactionservice.statetier.io "kept" deleted' in out, out
    assert stopped.get(f"{CS}/kept") is None


def test_an_opted_in_application_is_deleted_at_once(stopped: Sandbox) -> None:
    """Default retention (retain): no finalizer, so nothing waits for the operator."""
    out = stopped.kubectl("delete", "sparkapplication", "retained", "--timeout=10s", check=False)
    assert 'sparkapplication.sparkoperator.k8s.io "retained" deleted' in out, out
    assert stopped.get(f"{SPARK}/retained") is None


def test_a_finalizer_can_be_removed_by_hand(stopped: Sandbox) -> None:
    """Retention delete: the deletion waits for the operator (its finalizer), and removing the
    finalizer by hand, a write to an object being deleted, is not sent to the webhooks; the
    checkpoints stay."""
    stopped.kubectl("delete", "sparkapplication", "dropping", "--wait=false")
    assert stopped.get(f"{SPARK}/dropping")["metadata"]["deletionTimestamp"]
    remove = '[{"op": "remove", "path": "/metadata/finalizers"}]'
    stopped.kubectl("patch", "sparkapplication", "dropping", "--type=json", "-p", remove)
    assert stopped.get(f"{SPARK}/dropping") is None


def test_a_label_patch_goes_through(stopped: Sandbox) -> None:
    """An update that changes neither spec nor annotations is not sent to the webhooks."""
    stopped.kubectl("label", "sparkapplication", "labelled", "team=data")
    assert stopped.get(f"{SPARK}/labelled")["metadata"]["labels"] == {"team": "data"}


def test_an_annotation_change_is_refused(stopped: Sandbox) -> None:
    """A change the webhooks judge fails closed, as a create does."""
    out = stopped.kubectl(
        "annotate", "sparkapplication", "labelled", "statetier.io/spill-size=4Gi", check=False
    )
    assert "failed calling webhook" in out, out
    annotations = stopped.get(f"{SPARK}/labelled")["metadata"]["annotations"]
    assert "statetier.io/spill-size" not in annotations


def test_an_application_that_never_opted_in_is_created(stopped: Sandbox) -> None:
    """No statetier.io/ annotation: statetier's webhooks are never asked."""
    out = stopped.kubectl("apply", "-f", "-", stdin=_app("unrelated", None), check=False)
    assert "sparkapplication.sparkoperator.k8s.io/unrelated created" in out, out
    assert "statetier.io/status" not in (
        stopped.get(f"{SPARK}/unrelated")["metadata"].get("annotations") or {}
    )

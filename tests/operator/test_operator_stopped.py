"""While no operator runs: admissions fail closed, deletions are never blocked.

The operator manages its webhook configurations (the ``statetier-operator run`` default) and
is stopped, normally (SIGTERM) or not (SIGKILL). The configurations must stay, so the
apiserver refuses an opted-in SparkApplication it cannot mutate (``failurePolicy: Fail``)
rather than admit it with no spill volume, settings or finalizer; and a CompactionService can
still be deleted, because its webhook judges CREATE and UPDATE only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from statetier.kubetest.processes import Sandbox
from statetier.kubetest.processes import compaction_service_manifest as _manifest

from tests.operator.conftest import CRDS, SPARK_CRD

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sparkapplication-wordcount.yaml"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
CS = "/apis/statetier.io/v1alpha1/namespaces/default/compactionservices"


@pytest.fixture(scope="module", params=["SIGTERM", "SIGKILL"])
def stopped(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sandbox]:
    """A sandbox whose operator ran, reconciled one CompactionService, and was stopped
    normally (SIGTERM: kopf's shutdown) or killed (SIGKILL: nothing cleaned up)."""
    box = Sandbox(tmp_path_factory.mktemp("stopped"), operator=False)
    with box:
        box.kubectl("apply", "-f", str(CRDS), "-f", str(SPARK_CRD))
        box.start_operator_process()
        box.wait_for_operator()
        box.kubectl("apply", "-f", "-", stdin=_manifest("kept"))
        box.wait(
            "kept reconciled",
            lambda: box.get("/apis/apps/v1/namespaces/default/deployments/kept-workers"),
        )
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

"""The Spark Operator controller double against what v2.5.2's ``controller.go`` and
``event_filter.go`` do, on the emulator over HTTP: the states an application passes through,
in order, read back from the API's own watch log, and the status fields of each step.

Each expectation was read in upstream's code (the state constants of ``api/v1beta2``, the
``reconcile*`` functions, ``submitSparkApplication``, ``resetSparkApplicationStatus``).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from statetier.kubetest.processes import Sandbox
from statetier.kubetest.spark_operator_controller import SparkOperatorController, invalidates

from tests.operator.conftest import SPARK_CRD

APPS = "/apis/sparkoperator.k8s.io/v1beta2/namespaces/default/sparkapplications"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(tmp_path_factory.mktemp("sparkop"), operator=False, webhooks=False) as sandbox:
        sandbox.kubectl("apply", "-f", str(SPARK_CRD))
        yield sandbox


@pytest.fixture
def spark(box: Sandbox) -> Iterator[SparkOperatorController]:
    with SparkOperatorController(box.url) as controller:
        yield controller
    assert controller.errors == []


def _app(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": name},
        "spec": {
            "type": "Python",
            "mode": "cluster",
            "image": "spark:4.0.0",
            "mainApplicationFile": "local:///app/main.py",
            "sparkVersion": "4.0.0",
            **spec,
        },
    }


def _status(box: Sandbox, name: str) -> Obj:
    status: Obj = box.get(f"{APPS}/{name}").get("status") or {}
    return status


def _state(box: Sandbox, name: str) -> str:
    return str((_status(box, name).get("applicationState") or {}).get("state", ""))


def _reach(box: Sandbox, name: str, state: str) -> Obj:
    box.wait(f"{name} in {state}", lambda: _state(box, name) == state)
    return _status(box, name)


def _states(box: Sandbox, name: str, since: str) -> list[str]:
    """Every state the application's status took after resource version ``since``, in order,
    from the emulator's watch log (consecutive repeats once)."""
    url = f"{box.url}{APPS}?watch=true&resourceVersion={since}&timeoutSeconds=1"
    seen: list[str] = []
    with urllib.request.urlopen(url, timeout=10) as stream:
        for line in stream:
            obj = json.loads(line)["object"]
            if obj.get("metadata", {}).get("name") != name:
                continue
            state = ((obj.get("status") or {}).get("applicationState") or {}).get("state", "")
            if not seen or seen[-1] != state:
                seen.append(state)
    return seen


def _version(box: Sandbox, name: str) -> str:
    return str(box.get(f"{APPS}/{name}")["metadata"]["resourceVersion"])


def _patch(box: Sandbox, name: str, spec: Obj) -> None:
    box.kubectl("patch", "sparkapplication", name, "--type=merge", "-p", json.dumps(spec))


def test_the_event_filter_ignores_suspend_and_ttl_only() -> None:
    old = _app("a")
    assert not invalidates(old, _app("a", suspend=True, timeToLiveSeconds=60))
    assert invalidates(old, _app("a", image="spark:4.0.1"))
    assert invalidates(old, _app("a", suspend=True, sparkConf={"k": "v"}))


def test_new_submitted_running_then_suspended_and_resumed(
    box: Sandbox, spark: SparkOperatorController
) -> None:
    box.kubectl("apply", "-f", "-", stdin=json.dumps(_app("cycle")))
    status = _reach(box, "cycle", "SUBMITTED")
    assert status["submissionAttempts"] == status["executionAttempts"] == 1
    assert status["driverInfo"] == {"podName": "cycle-driver"}
    assert status["submissionID"] and status["lastSubmissionAttemptTime"]
    assert status["terminationTime"] is None  # an unset metav1.Time is written as null
    first_id = status["submissionID"]
    spark.driver_running("cycle")
    _reach(box, "cycle", "RUNNING")
    before = _version(box, "cycle")
    _patch(box, "cycle", {"spec": {"timeToLiveSeconds": 600}})  # no invalidation
    _patch(box, "cycle", {"spec": {"suspend": True}})
    status = _reach(box, "cycle", "SUSPENDED")
    assert _states(box, "cycle", before) == ["RUNNING", "SUSPENDING", "SUSPENDED"]
    assert status["driverInfo"] == {} and status["submissionAttempts"] == 1
    before = _version(box, "cycle")
    _patch(box, "cycle", {"spec": {"suspend": False}})
    status = _reach(box, "cycle", "SUBMITTED")
    assert _states(box, "cycle", before) == ["SUSPENDED", "RESUMING", "SUBMITTED"]
    assert (status["submissionAttempts"], status["executionAttempts"]) == (2, 2)
    assert status["submissionID"] != first_id
    assert status["driverInfo"] == {"podName": "cycle-driver"}


def test_a_spec_change_of_a_running_app_invalidates_and_resubmits_it(
    box: Sandbox, spark: SparkOperatorController
) -> None:
    box.kubectl("apply", "-f", "-", stdin=json.dumps(_app("changed")))
    _reach(box, "changed", "SUBMITTED")
    spark.driver_running("changed")
    _reach(box, "changed", "RUNNING")
    before = _version(box, "changed")
    _patch(box, "changed", {"spec": {"image": "spark:4.0.1"}})
    box.wait("the resubmission", lambda: _states(box, "changed", before)[-1:] == ["SUBMITTED"])
    states = _states(box, "changed", before)
    assert states == ["RUNNING", "INVALIDATING", "PENDING_RERUN", "SUBMITTED"]
    status = _status(box, "changed")
    # the attempts were reset by the invalidation, then counted once more
    assert (status["submissionAttempts"], status["executionAttempts"]) == (1, 1)


def test_a_suspended_change_suspends_without_a_resubmission(
    box: Sandbox, spark: SparkOperatorController
) -> None:
    """What the savepoint upgrade does: the new spec and ``suspend: true`` in one write."""
    box.kubectl("apply", "-f", "-", stdin=json.dumps(_app("upgraded")))
    _reach(box, "upgraded", "SUBMITTED")
    spark.driver_running("upgraded")
    _reach(box, "upgraded", "RUNNING")
    before = _version(box, "upgraded")
    _patch(box, "upgraded", {"spec": {"image": "spark:4.0.1", "suspend": True}})
    status = _reach(box, "upgraded", "SUSPENDED")
    assert _states(box, "upgraded", before) == [
        "RUNNING",
        "INVALIDATING",
        "SUSPENDING",
        "SUSPENDED",
    ]
    assert status["submissionAttempts"] == 1  # nothing submitted while suspended


def test_a_refused_submission_fails_with_upstreams_message(
    box: Sandbox, spark: SparkOperatorController
) -> None:
    local = "spark-local-dir-spill"
    app = _app(
        "refused",
        volumes=[{"name": local, "configMap": {"name": "c"}}],
        executor={"volumeMounts": [{"name": local, "mountPath": "/spill"}]},
    )
    before = str(box.get(APPS)["metadata"]["resourceVersion"])
    box.kubectl("apply", "-f", "-", stdin=json.dumps(app))
    status = _reach(box, "refused", "FAILED")
    assert _states(box, "refused", before) == ["", "SUBMISSION_FAILED", "FAILED"]
    message = "failed to submit spark application: failed to build spark-submit arguments: "
    assert status["applicationState"]["errorMessage"] == message + "unsupported volume type"
    assert status["terminationTime"] and status["submissionAttempts"] == 1
    assert "executionAttempts" not in status

"""``statetier.io/upgrade-mode`` on the emulator with the real operator (``kopf run``): a spec
change of an opted-in SparkApplication, and what the next run starts from in each mode, with
the operator running, stopped before the change, and stopped in the middle of it.

The Kubeflow Spark Operator's part is played by its v2.5.2 controller double
(:mod:`statetier.kubetest.spark_operator_controller`), watching the emulator as the real one
watches the apiserver: it submits each application, invalidates and resubmits it on a spec
change, and suspends and resumes it on ``spec.suspend``; the tests report each driver running
(there is no kubelet). ``SUSPENDED`` is the one state the operator waits for. The
savepoint upgrade's Jobs run the real ``statetier checkpoint savepoint`` and ``restore-spark``
as processes (the emulator's Job double) against SeaweedFS, and the new run is started from
the configuration the webhook wrote, read as the Spark driver reads it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.ttl import ManualClock
from statetier.kubetest.processes import Sandbox
from statetier.kubetest.spark_operator_controller import SparkOperatorController
from statetier.tools.seaweed import BUCKET, SeaweedFS

from tests.checkpoint.ckpt_support import (
    CLOCK_MS,
    MAX_P,
    Accumulate,
    Location,
    S3Server,
    dump_keyed,
    records,
)
from tests.operator.storage_sandbox import storage_sandbox

APPS = "/apis/sparkoperator.k8s.io/v1beta2/namespaces/default/sparkapplications"
SNAPSHOTS = "/apis/statetier.io/v1alpha1/namespaces/default/statesnapshots"
EPOCHS = 4
CKPT = "spark.statetier.checkpoint.uri"
SPARK_CKPT = "spark.statetier.checkpoint.spark-uri"
RESTORE = "spark.statetier.checkpoint.restore-from"
UPGRADE = "statetier.io/upgrade"


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with SeaweedFS.start(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield S3Server(server.endpoint)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, seaweed: S3Server) -> Iterator[Sandbox]:
    """Emulator + operator (see storage_sandbox)."""
    with storage_sandbox(tmp_path_factory.mktemp("upgrades"), seaweed) as sandbox:
        yield sandbox


def _running(location: Location, spark_uri: str) -> LocalRunner:
    """The old run: EPOCHS committed epochs at ``location`` and the Spark log entries of their
    micro-batches (epoch N is micro-batch N - 1) at ``spark_uri``, as Spark writes them."""
    runner = location.runner(2, clock=ManualClock(CLOCK_MS))
    fs = location.store().fs
    root = spark_uri.removeprefix("s3://")
    for epoch in range(1, EPOCHS + 1):
        runner.process(records(epoch))
        runner.checkpoint()
        batch = epoch - 1
        offsets = (
            f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{batch}}}\n{{"logOffset":{batch}}}'
        )
        fs.pipe(f"{root}/offsets/{batch}", offsets.encode())
        fs.pipe(f"{root}/commits/{batch}", b'v1\n{"nextBatchWatermarkMs":0}')
    return runner


def _app(name: str, annotations: dict[str, str], image: str = "spark:4.0.0") -> str:
    return json.dumps(
        {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "SparkApplication",
            "metadata": {
                "name": name,
                "annotations": {
                    "statetier.io/enabled": "true",
                    "statetier.io/storage-secret": "store",
                    **annotations,
                },
            },
            "spec": {
                "type": "Python",
                "mode": "cluster",
                "image": image,
                "mainApplicationFile": "local:///app/wordcount.py",
                "sparkVersion": "4.0.0",
            },
        }
    )


@pytest.fixture
def spark(box: Sandbox) -> Iterator[SparkOperatorController]:
    """The Spark Operator's controller, for one test."""
    with SparkOperatorController(box.url) as controller:
        yield controller
    assert controller.errors == []


def _state(box: Sandbox, name: str) -> str:
    status = box.get(f"{APPS}/{name}").get("status") or {}
    return str((status.get("applicationState") or {}).get("state", ""))


def _reach(box: Sandbox, name: str, state: str, timeout: float = 15) -> None:
    box.wait(f"{name} in {state}", lambda: _state(box, name) == state, timeout)


def _start(box: Sandbox, spark: SparkOperatorController, name: str, app: str) -> None:
    """Create the application; the Spark Operator submits it and its driver runs."""
    box.kubectl("apply", "-f", "-", stdin=app)
    _reach(box, name, "SUBMITTED")
    spark.driver_running(name)
    _reach(box, name, "RUNNING")


def _submission(box: Sandbox, name: str) -> str:
    return str((box.get(f"{APPS}/{name}").get("status") or {}).get("submissionID", ""))


def _resubmitted(box: Sandbox, name: str, before: str) -> None:
    """Wait until the Spark Operator has submitted the application anew (after ``before``)."""
    box.wait(
        f"{name} resubmitted",
        lambda: _state(box, name) == "SUBMITTED" and _submission(box, name) != before,
    )


def _locations(seaweed: S3Server) -> tuple[Location, str]:
    location = Location.on_s3(seaweed)
    return location, f"s3://{BUCKET}/spark-{uuid.uuid4().hex[:8]}"


def _change_image(box: Sandbox, name: str, image: str, check: bool = True) -> str:
    patch = json.dumps({"spec": {"image": image}})
    return box.kubectl("patch", "sparkapplication", name, "--type=merge", "-p", patch, check=check)


def _record(box: Sandbox, name: str) -> dict[str, Any]:
    text = box.get(f"{APPS}/{name}")["metadata"]["annotations"].get(UPGRADE) or "{}"
    found: dict[str, Any] = json.loads(text)
    return found


def _conf(box: Sandbox, name: str) -> dict[str, str]:
    conf: dict[str, str] = box.get(f"{APPS}/{name}")["spec"]["sparkConf"]
    return conf


def test_last_state_resumes_the_running_checkpoint_and_refuses_to_move_it(
    box: Sandbox, seaweed: S3Server, spark: SparkOperatorController
) -> None:
    location, spark_uri = _locations(seaweed)
    annotations = {
        "statetier.io/upgrade-mode": "last-state",
        "statetier.io/checkpoint-uri": location.uri,
        "statetier.io/spark-checkpoint-uri": spark_uri,
    }
    _start(box, spark, "laststate", _app("laststate", annotations))
    first = _submission(box, "laststate")
    _change_image(box, "laststate", "spark:4.0.1")
    _resubmitted(box, "laststate", first)  # a spec change: the Spark Operator reruns it
    app = box.get(f"{APPS}/laststate")
    assert app["spec"]["image"] == "spark:4.0.1" and not app["spec"].get("suspend")
    conf = _conf(box, "laststate")
    assert (conf[CKPT], conf[SPARK_CKPT]) == (location.uri, spark_uri)
    assert UPGRADE not in app["metadata"]["annotations"]
    moved = json.dumps(
        {"metadata": {"annotations": {"statetier.io/checkpoint-uri": location.uri + "-2"}}}
    )
    out = box.kubectl(
        "patch", "sparkapplication", "laststate", "--type=merge", "-p", moved, check=False
    )
    assert "statetier.io/checkpoint-uri changed from" in out and "last-state" in out
    assert "set statetier.io/upgrade-mode to savepoint or stateless" in out
    assert _conf(box, "laststate")[CKPT] == location.uri


def test_stateless_starts_empty_in_new_locations_and_leaves_the_old_ones(
    box: Sandbox, seaweed: S3Server, spark: SparkOperatorController
) -> None:
    location, spark_uri = _locations(seaweed)
    _running(location, spark_uri).close()
    kept = location.store().epochs()  # (the old run's own retention keeps the newest three)
    annotations = {
        "statetier.io/upgrade-mode": "stateless",
        "statetier.io/checkpoint-uri": location.uri,
        "statetier.io/spark-checkpoint-uri": spark_uri,
        "statetier.io/restore-from": f"s3://{BUCKET}/some-savepoint",
    }
    _start(box, spark, "stateless", _app("stateless", annotations))
    assert _conf(box, "stateless")[RESTORE] == f"s3://{BUCKET}/some-savepoint"
    for number in (1, 2):
        before = _submission(box, "stateless")
        _change_image(box, "stateless", f"spark:4.0.{number}")
        _resubmitted(box, "stateless", before)
        app = box.get(f"{APPS}/stateless")
        conf, meta = app["spec"]["sparkConf"], app["metadata"]["annotations"]
        assert (
            conf[CKPT] == meta["statetier.io/checkpoint-uri"] == f"{location.uri}-upgrade-{number}"
        )
        assert conf[SPARK_CKPT] == f"{spark_uri}-upgrade-{number}"
        assert RESTORE not in conf and "statetier.io/restore-from" not in meta
        assert not app["spec"].get("suspend")
        record = _record(box, "stateless")
        assert (record["mode"], record["phase"], record["number"]) == ("stateless", "Done", number)
    assert record["from"]["checkpointUri"] == f"{location.uri}-upgrade-1"
    # the new run's configuration, as the driver reads it, starts from nothing
    config = load_config({"spill.enabled": False}, spark_conf=conf, env={})
    assert config.checkpoint_restore_from == ""
    runner = LocalRunner(
        Accumulate,
        2,
        max_parallelism=MAX_P,
        checkpoint_uri=config.checkpoint_uri,
        storage_options=location.options,
        config=config,
    )
    assert runner.last_epoch == 0 and dump_keyed(runner) == {}
    runner.close()
    assert location.store().epochs() == kept and kept[-1] == EPOCHS  # the old one as it was


def _savepoint_app(
    box: Sandbox, spark: SparkOperatorController, name: str, location: Location, spark_uri: str
) -> str:
    destination = f"s3://{BUCKET}/savepoints-{uuid.uuid4().hex[:8]}"
    annotations = {
        "statetier.io/upgrade-mode": "savepoint",
        "statetier.io/checkpoint-uri": location.uri,
        "statetier.io/spark-checkpoint-uri": spark_uri,
        "statetier.io/savepoint-destination": destination,
    }
    _start(box, spark, name, _app(name, annotations))
    return destination


def _check_new_run(box: Sandbox, name: str, old: LocalRunner, location: Location) -> None:
    """The resumed application's configuration, read as the driver reads it, starts a new
    location from the savepoint with exactly the old run's last committed state, and its Spark
    location holds the old run's last micro-batch."""
    conf = _conf(box, name)
    config = load_config({"spill.enabled": False}, spark_conf=conf, env={})
    assert config.checkpoint_uri == f"{location.uri}-upgrade-1"
    runner = LocalRunner(
        Accumulate,
        3,
        max_parallelism=MAX_P,
        checkpoint_uri=config.checkpoint_uri,
        storage_options=location.options,
        config=config,
        clock=ManualClock(CLOCK_MS),
    )
    assert runner.last_epoch == EPOCHS and dump_keyed(runner) == dump_keyed(old)
    runner.close()
    fs = location.store().fs
    root = config.checkpoint_spark_uri.removeprefix("s3://")
    fs.invalidate_cache()
    assert fs.cat(f"{root}/commits/{EPOCHS - 1}") == b'v1\n{"nextBatchWatermarkMs":0}'
    assert not fs.exists(f"{root}/offsets/{EPOCHS}") and fs.exists(f"{root}/metadata")
    assert location.store().epochs()[-1] == EPOCHS  # the old one as it was


def test_savepoint_suspends_snapshots_restores_and_resumes(box: Sandbox, seaweed: S3Server) -> None:
    location, spark_uri = _locations(seaweed)
    old = _running(location, spark_uri)
    drivers: set[tuple[str, str]] = set()  # the cluster's driver pods, across the two controllers
    with SparkOperatorController(box.url, drivers) as spark:
        destination = _savepoint_app(box, spark, "viasavepoint", location, spark_uri)
    # The Spark Operator is down: the change is stored but nothing suspends the old run yet.
    _change_image(box, "viasavepoint", "spark:4.0.1")
    app = box.get(f"{APPS}/viasavepoint")
    assert app["spec"]["suspend"] is True and app["spec"]["image"] == "spark:4.0.1"
    savepoint = f"{destination}/default/viasavepoint-upgrade-1"
    assert app["spec"]["sparkConf"][RESTORE] == savepoint
    assert _record(box, "viasavepoint")["phase"] == "Suspending"
    time.sleep(2)  # the old run still runs: nothing is taken before the Spark Operator stopped it
    assert _state(box, "viasavepoint") == "RUNNING"
    assert box.get(f"{SNAPSHOTS}/viasavepoint-upgrade-1") is None
    with SparkOperatorController(box.url, drivers) as spark:
        first = _submission(box, "viasavepoint")
        done = box.wait(
            "the upgrade done", lambda: _record(box, "viasavepoint")["phase"] == "Done", 90
        )
        assert done
        assert box.get(f"{APPS}/viasavepoint")["spec"]["suspend"] is False
        _resubmitted(box, "viasavepoint", first)  # resumed: RESUMING, then a new submission
    assert spark.errors == []
    snapshot = box.get(f"{SNAPSHOTS}/viasavepoint-upgrade-1")["status"]
    assert (snapshot["phase"], snapshot["epoch"], snapshot["uri"]) == (
        "Succeeded",
        EPOCHS,
        savepoint,
    )
    assert snapshot["sparkBatch"] == EPOCHS - 1
    _check_new_run(box, "viasavepoint", old, location)
    old.close()


def test_operator_down_before_the_change_refuses_it_in_every_mode(
    box: Sandbox, seaweed: S3Server
) -> None:
    apps = {}
    for mode in ("last-state", "stateless", "savepoint"):
        location, spark_uri = _locations(seaweed)
        name = f"down-{mode}"
        annotations = {
            "statetier.io/upgrade-mode": mode,
            "statetier.io/checkpoint-uri": location.uri,
            "statetier.io/spark-checkpoint-uri": spark_uri,
            "statetier.io/savepoint-destination": f"s3://{BUCKET}/sp",
        }
        box.kubectl("apply", "-f", "-", stdin=_app(name, annotations))
        apps[name] = box.get(f"{APPS}/{name}")
    box.stop_operator()
    try:
        for name, before in apps.items():
            out = _change_image(box, name, "spark:4.0.9", check=False)
            assert "failed calling webhook" in out, out
            after = box.get(f"{APPS}/{name}")
            assert after["spec"] == before["spec"]  # the old run goes on as it was
            assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    finally:
        box.start_operator_process()
        box.wait_for_operator()


def test_savepoint_with_the_operator_down_in_the_middle_stays_suspended_until_it_is_back(
    box: Sandbox, seaweed: S3Server, spark: SparkOperatorController
) -> None:
    location, spark_uri = _locations(seaweed)
    old = _running(location, spark_uri)
    _savepoint_app(box, spark, "midway", location, spark_uri)
    _change_image(box, "midway", "spark:4.0.1")
    box.stop_operator()
    try:
        _reach(box, "midway", "SUSPENDED")
        time.sleep(3)
        app = box.get(f"{APPS}/midway")
        assert app["spec"]["suspend"] is True  # the Spark Operator submits nothing meanwhile
        assert _state(box, "midway") == "SUSPENDED"
        assert _record(box, "midway")["phase"] == "Suspending"
        assert box.get(f"{SNAPSHOTS}/midway-upgrade-1") is None
    finally:
        box.start_operator_process()
        box.wait_for_operator()
    box.wait("the upgrade done", lambda: _record(box, "midway")["phase"] == "Done", 90)
    assert box.get(f"{APPS}/midway")["spec"]["suspend"] is False
    _reach(box, "midway", "SUBMITTED")  # resumed by the Spark Operator
    _check_new_run(box, "midway", old, location)
    old.close()


def _events(box: Sandbox, name: str) -> list[str]:
    items = box.kubectl_json("get", "events", "--field-selector", f"involvedObject.name={name}")
    return [e["reason"] for e in items["items"]]


def test_a_failed_savepoint_keeps_the_application_suspended_until_a_retry_succeeds(
    box: Sandbox, seaweed: S3Server, spark: SparkOperatorController
) -> None:
    location, spark_uri = _locations(seaweed)
    old = location.runner(2, clock=ManualClock(CLOCK_MS))
    for epoch in range(1, EPOCHS + 1):  # committed epochs, but the query's Spark log is missing
        old.process(records(epoch))
        old.checkpoint()
    _savepoint_app(box, spark, "retried", location, spark_uri)
    _change_image(box, "retried", "spark:4.0.1")
    _reach(box, "retried", "SUSPENDED")
    box.wait("the upgrade failed", lambda: _record(box, "retried")["phase"] == "Failed", 60)
    message = _record(box, "retried")["message"]
    assert "StateSnapshot retried-upgrade-1 failed" in message and "offset log entry" in message
    assert "kubectl delete statesnapshot retried-upgrade-1" in message
    assert box.wait("the warning", lambda: "UpgradeFailed" in _events(box, "retried"))
    out = box.kubectl(
        "patch", "sparkapplication", "retried", "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    assert "patched" in out
    assert box.get(f"{APPS}/retried")["spec"]["suspend"] is True  # held while the upgrade fails
    time.sleep(1)
    assert _state(box, "retried") == "SUSPENDED"  # so the Spark Operator submits nothing
    # the fix: the query's Spark log is where the annotation says; then the retry
    old.close()
    fs, root = location.store().fs, spark_uri.removeprefix("s3://")
    for batch in range(EPOCHS):
        fs.pipe(f"{root}/offsets/{batch}", b'v1\n{"batchWatermarkMs":0}\n{"logOffset":0}')
        fs.pipe(f"{root}/commits/{batch}", b'v1\n{"nextBatchWatermarkMs":0}')
    box.kubectl("delete", "statesnapshot", "retried-upgrade-1")
    box.wait("the upgrade done", lambda: _record(box, "retried")["phase"] == "Done", 90)
    assert box.get(f"{APPS}/retried")["spec"]["suspend"] is False
    assert box.wait("the event", lambda: "UpgradeDone" in _events(box, "retried"))
    _reach(box, "retried", "SUBMITTED")  # resumed by the Spark Operator

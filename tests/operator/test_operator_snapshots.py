"""StateSnapshots on the emulator with the real operator (``kopf run``): the Job it creates runs
the real ``statetier checkpoint savepoint`` as a process (the emulator's Job double) against a
real object store (SeaweedFS), with the application's storage Secret as its only credentials.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import s3fs  # type: ignore[import-untyped]
from statetier.backend.snapshot import SnapshotStore
from statetier.kubetest.processes import Sandbox
from statetier.tools.seaweed import BUCKET, KEY, SECRET, SeaweedFS

from tests.checkpoint.ckpt_support import Location, S3Server, records
from tests.operator.storage_sandbox import storage_sandbox

SNAPSHOTS = "/apis/statetier.io/v1alpha1/namespaces/default/statesnapshots"
EPOCHS = 5


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with SeaweedFS.start(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield S3Server(server.endpoint)


@pytest.fixture(scope="module")
def checkpoint(seaweed: S3Server) -> Location:
    """A real statetier checkpoint of EPOCHS committed epochs on SeaweedFS."""
    location = Location.on_s3(seaweed)
    runner = location.runner(2)
    for epoch in range(1, EPOCHS + 1):
        runner.process(records(epoch))
        runner.checkpoint()
    runner.close()
    return location


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, seaweed: S3Server) -> Iterator[Sandbox]:
    """Emulator + operator (see storage_sandbox)."""
    with storage_sandbox(
        tmp_path_factory.mktemp("snapshots"),
        seaweed,
        extra_args=("--checkpoint-delete-timeout", "30"),
    ) as sandbox:
        yield sandbox


def _app(name: str, annotations: dict[str, str]) -> str:
    return json.dumps(
        {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "SparkApplication",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "type": "Python",
                "mode": "cluster",
                "image": "spark:4.0.0",
                "mainApplicationFile": "local:///app/wordcount.py",
                "sparkVersion": "4.0.0",
            },
        }
    )


def _snapshot(name: str, destination: str, **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "statetier.io/v1alpha1",
            "kind": "StateSnapshot",
            "metadata": {"name": name},
            "spec": {"destination": destination, **spec},
        }
    )


@pytest.fixture(scope="module")
def app(box: Sandbox, checkpoint: Location) -> str:
    annotations = {
        "statetier.io/enabled": "true",
        "statetier.io/checkpoint-uri": checkpoint.uri,
        "statetier.io/storage-secret": "store",
    }
    box.kubectl("apply", "-f", "-", stdin=_app("wordcount", annotations))
    return "wordcount"


def _destination() -> str:
    return f"s3://{BUCKET}/savepoints-{uuid.uuid4().hex[:8]}"


def _s3(seaweed: S3Server) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(endpoint_url=seaweed.endpoint, key=KEY, secret=SECRET)


def _events(box: Sandbox, name: str) -> list[str]:
    items = box.kubectl_json("get", "events", "--field-selector", f"involvedObject.name={name}")
    return [e["reason"] for e in items["items"]]


def test_a_snapshot_runs_its_job_and_reports_epoch_uri_and_size(
    box: Sandbox, app: str, checkpoint: Location, seaweed: S3Server
) -> None:
    destination = _destination()
    manifest = _snapshot("wc-epoch4", destination, sparkApplication=app, epoch=4)
    box.kubectl("apply", "-f", "-", stdin=manifest)
    box.kubectl("wait", "--for=condition=Ready", "statesnapshot/wc-epoch4", "--timeout=60s")
    status = box.get(f"{SNAPSHOTS}/wc-epoch4")["status"]
    uri = f"{destination}/default/wc-epoch4"
    assert status["phase"] == "Succeeded" and status["uri"] == uri
    assert status["source"] == checkpoint.uri and status["epoch"] == 4
    saved = SnapshotStore(uri, **checkpoint.options).manifest()
    assert status["bytes"] == sum(f.size for f in saved.files()) > 0
    assert status["files"] == len(saved.files())
    assert status["startTime"] <= status["finishTime"]
    job = box.kubectl_json("get", "job", status["job"])
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "store"}}]  # no credentials inline
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(job)
    assert job["metadata"]["ownerReferences"][0]["kind"] == "StateSnapshot"
    table = box.kubectl("get", "statesnapshots", "wc-epoch4")
    assert "Succeeded" in table and " 4 " in table
    assert box.wait("the success event", lambda: "SnapshotSucceeded" in _events(box, "wc-epoch4"))
    url = f"http://127.0.0.1:{box.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    series = "statetier_snapshot_last_success_timestamp_seconds"
    line = f'{series}{{application="{app}",namespace="default"}}'
    value = float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])
    assert abs(value - time.time()) < 120


def test_a_snapshot_of_the_latest_epoch_needs_no_epoch(box: Sandbox, checkpoint: Location) -> None:
    manifest = _snapshot(
        "by-uri", _destination(), checkpointUri=checkpoint.uri, storageSecret="store"
    )
    box.kubectl("apply", "-f", "-", stdin=manifest)
    box.kubectl("wait", "--for=condition=Ready", "statesnapshot/by-uri", "--timeout=60s")
    assert box.get(f"{SNAPSHOTS}/by-uri")["status"]["epoch"] == EPOCHS


def test_a_failing_snapshot_reaches_failed_with_the_reason(box: Sandbox, app: str) -> None:
    box.kubectl(
        "apply", "-f", "-", stdin=_snapshot("wc-99", _destination(), sparkApplication=app, epoch=99)
    )

    def failed() -> Any:
        status = box.get(f"{SNAPSHOTS}/wc-99").get("status") or {}
        return status if status.get("phase") == "Failed" else None

    status = box.wait("a failed snapshot", failed, timeout=60)
    assert status["reason"] == "SavepointFailed"
    assert status["message"].startswith("exit code 1: ") and "99" in status["message"]
    ready = status["conditions"][0]
    assert ready["type"] == "Ready" and ready["status"] == "False"
    assert box.wait("the failure event", lambda: "SnapshotFailed" in _events(box, "wc-99"))
    text = urllib.request.urlopen(f"http://127.0.0.1:{box.metrics_port}/metrics").read().decode()
    assert (
        f'statetier_snapshots_total{{application="{app}",namespace="default",outcome="failed"}}'
        in text
    )


def test_an_application_without_a_checkpoint_fails_naming_the_fix(box: Sandbox) -> None:
    box.kubectl("apply", "-f", "-", stdin=_app("nockpt", {"statetier.io/enabled": "true"}))
    box.kubectl(
        "apply", "-f", "-", stdin=_snapshot("nockpt-1", _destination(), sparkApplication="nockpt")
    )
    status = box.wait(
        "a failed snapshot",
        lambda: (box.get(f"{SNAPSHOTS}/nockpt-1").get("status") or {}).get("reason"),
    )
    assert status == "InvalidSource"
    message = box.get(f"{SNAPSHOTS}/nockpt-1")["status"]["message"]
    assert "statetier.io/checkpoint-uri" in message and "spec.checkpointUri" in message


def test_the_spec_names_one_source_and_cannot_change(box: Sandbox, app: str) -> None:
    both = _snapshot("both", _destination(), sparkApplication=app, checkpointUri="s3://b/c")
    out = box.kubectl("apply", "-f", "-", stdin=both, check=False)
    assert "exactly one of sparkApplication and checkpointUri" in out


def test_deletion_policy_delete_removes_the_files_and_keep_keeps_them(
    box: Sandbox, app: str, seaweed: S3Server
) -> None:
    destination = _destination()
    for name, policy in (("wc-del", "delete"), ("wc-keep", "keep")):
        manifest = _snapshot(name, destination, sparkApplication=app, deletionPolicy=policy)
        box.kubectl("apply", "-f", "-", stdin=manifest)
    for name in ("wc-del", "wc-keep"):
        box.kubectl("wait", "--for=condition=Ready", f"statesnapshot/{name}", "--timeout=60s")
    fs = _s3(seaweed)
    root = destination.removeprefix("s3://")
    assert fs.ls(f"{root}/default/wc-del") and fs.ls(f"{root}/default/wc-keep")
    finalizers = box.wait(
        "the finalizer of the snapshot to delete",
        lambda: box.get(f"{SNAPSHOTS}/wc-del")["metadata"].get("finalizers"),
    )
    assert finalizers == ["statetier.io/finalizer"]
    assert not box.get(f"{SNAPSHOTS}/wc-keep")["metadata"].get("finalizers")
    box.kubectl("delete", "statesnapshot", "wc-del", "wc-keep", "--timeout=60s")
    fs.invalidate_cache()
    gone = f"{root}/default/wc-del"
    assert [p for p in fs.find(gone) if p != gone] == []  # (SeaweedFS keeps the empty folder)
    assert fs.ls(f"{root}/default/wc-keep")  # keep: the files outlive the resource
    assert "SavepointDeleted" in box.logs() or box.get(f"{SNAPSHOTS}/wc-del") is None


def test_a_schedule_keeps_keep_snapshots(box: Sandbox, app: str) -> None:
    body = {
        "apiVersion": "statetier.io/v1alpha1",
        "kind": "ScheduledStateSnapshot",
        "metadata": {"name": "every2s"},
        "spec": {
            "schedule": "*/2 * * * * *",
            "keep": 2,
            "snapshot": {"sparkApplication": app, "destination": _destination()},
        },
    }
    box.kubectl("apply", "-f", "-", stdin=json.dumps(body))
    taken: set[str] = set()

    def listing() -> list[dict[str, Any]]:
        found = box.kubectl_json(
            "get", "statesnapshots", "-l", "statetier.io/scheduledstatesnapshot=every2s"
        )
        items: list[dict[str, Any]] = found["items"]
        taken.update(i["metadata"]["name"] for i in items)
        return items

    def five() -> bool:
        listing()
        return len(taken) >= 5

    box.wait("five scheduled snapshots", five, timeout=60)
    box.kubectl(
        "patch",
        "scheduledstatesnapshot",
        "every2s",
        "--type=merge",
        "-p",
        '{"spec":{"suspend":true}}',
    )

    def settled() -> list[str] | None:
        items = listing()
        phases = [(i.get("status") or {}).get("phase") for i in items]
        done = [
            i["metadata"]["name"]
            for i in items
            if (i.get("status") or {}).get("phase") == "Succeeded"
        ]
        return done if len(items) == 2 and phases == ["Succeeded", "Succeeded"] else None

    kept = box.wait("two kept snapshots", settled, timeout=60)
    assert sorted(kept) == sorted(taken)[-2:]  # the newest two (names carry the time)
    status = box.get(
        "/apis/statetier.io/v1alpha1/namespaces/default/scheduledstatesnapshots/every2s"
    )["status"]
    assert status["lastSuccessfulSnapshot"] == sorted(taken)[-1]


RESTORE = "spark.statetier.checkpoint.restore-from"


def _restored(box: Sandbox, name: str, value: str) -> str:
    annotations = {"statetier.io/enabled": "true", "statetier.io/restore-from": value}
    annotations["statetier.io/checkpoint-uri"] = f"s3://{BUCKET}/new-{uuid.uuid4().hex[:8]}"
    return box.kubectl("apply", "-f", "-", stdin=_app(name, annotations), check=False)


def test_restore_from_a_snapshot_name_configures_its_savepoint_uri(box: Sandbox, app: str) -> None:
    manifest = _snapshot("for-restore", _destination(), sparkApplication=app, epoch=3)
    box.kubectl("apply", "-f", "-", stdin=manifest)
    box.kubectl("wait", "--for=condition=Ready", "statesnapshot/for-restore", "--timeout=60s")
    uri = box.get(f"{SNAPSHOTS}/for-restore")["status"]["uri"]
    _restored(box, "restored", "for-restore")
    conf = box.kubectl_json("get", "sparkapplication", "restored")["spec"]["sparkConf"]
    assert conf[RESTORE] == uri
    _restored(box, "restored-uri", uri)  # a URI is taken as it is
    conf = box.kubectl_json("get", "sparkapplication", "restored-uri")["spec"]["sparkConf"]
    assert conf[RESTORE] == uri


def test_restore_from_a_snapshot_that_did_not_succeed_is_refused(box: Sandbox, app: str) -> None:
    manifest = _snapshot("never", _destination(), sparkApplication=app, epoch=77)
    box.kubectl("apply", "-f", "-", stdin=manifest)
    box.wait(
        "a failed snapshot",
        lambda: (box.get(f"{SNAPSHOTS}/never").get("status") or {}).get("phase") == "Failed",
        timeout=60,
    )
    out = _restored(box, "from-failed", "never")
    assert "StateSnapshot default/never is Failed, not Succeeded" in out
    assert "kubectl wait --for=condition=Ready statesnapshot/never" in out
    assert (
        box.get(
            "/apis/sparkoperator.k8s.io/v1beta2/namespaces/default/sparkapplications/from-failed"
        )
        is None
    )
    out = _restored(box, "from-nothing", "no-such-snapshot")
    assert "no StateSnapshot default/no-such-snapshot" in out

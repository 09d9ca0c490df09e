"""An opted-in SparkApplication, admitted by the operator's webhook and turned into spark-submit
arguments by the Spark Operator's own rules, runs on real Spark with that conf and nothing else.

For each spill volume kind the docs offer (local-SSD per-executor claim, hostPath, emptyDir):
the application is applied to the API emulator with the real operator and its webhooks, read
back as stored, and submitted through :mod:`statetier.kubetest.spark_operator` (the Spark
Operator double, which refuses what the real one refuses); its spill directory must be the
volume's mount path. The ``--conf`` pairs of the local-SSD claim (the kind the docs recommend)
then run a word count on ``local-cluster[2,1,1024]`` (two executor JVMs); the other kinds differ
from it only in the volume, which Spark sees as the same directory, so a run of each (a cluster
start and a job: two minutes of a CI core each) would test no other code. The volume's mount
path, which on Kubernetes is a directory of each executor pod, is mapped into a temporary
folder; the master and the driver's address are what a local cluster needs instead of a
Kubernetes one. With a 4 MiB
budget the state hosts spill: the spill files must be under the mount path, the metrics
endpoint must answer on the port the chart's PodMonitor scrapes, and the counts must be exact.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
import yaml
from statetier.kubetest.processes import Sandbox
from statetier.kubetest.spark_operator import submit, validate

from tests.operator.conftest import CRDS, SPARK_CRD
from tests.spark.conftest import REPO, job_error, spark_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APP = REPO / "examples" / "sparkapplication-wordcount.yaml"
CHART_VALUES = REPO / "charts" / "statetier" / "values.yaml"
SPARK_APPS = "/apis/sparkoperator.k8s.io/v1beta2/namespaces/default/sparkapplications"
MOUNT = re.compile(r"^spark\.kubernetes\.executor\.volumes\.[^.]+\.([^.]+)\.mount\.path$")
KINDS = {
    "ephemeral": {
        "statetier.io/spill-volume": "ephemeral",
        "statetier.io/spill-size": "100Gi",
        "statetier.io/spill-storage-class": "local-ssd",
    },
    "hostPath": {
        "statetier.io/spill-volume": "hostPath",
        "statetier.io/spill-host-path": "/mnt/disks/ssd0/statetier",
    },
    "emptyDir": {"statetier.io/spill-volume": "emptyDir", "statetier.io/spill-size": "20Gi"},
}


@pytest.fixture(scope="module")
def admitted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Each kind's application as the apiserver stored it after the operator's webhooks."""
    box = Sandbox(tmp_path_factory.mktemp("admission"), operator=False)
    stored: dict[str, dict[str, Any]] = {}
    with box:
        box.kubectl("apply", "-f", str(CRDS), "-f", str(SPARK_CRD))
        box.start_operator_process()
        box.wait_for_operator()
        for kind in KINDS:
            box.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(application(kind)))
            stored[kind] = box.get(f"{SPARK_APPS}/wc-{kind.lower()}")
        yield stored


def application(kind: str) -> dict[str, Any]:
    """The example application with ``kind``'s spill volume, a budget small enough to spill,
    checkpoints on this machine, and executors that fit a local cluster's 1 GiB workers."""
    app = yaml.safe_load(APP.read_text())
    app["metadata"]["name"] = f"wc-{kind.lower()}"
    app["metadata"]["annotations"] = {
        "statetier.io/enabled": "true",
        "statetier.io/memory-budget": "4m",
        "statetier.io/checkpoint-uri": "file:///statetier-checkpoints",  # mapped by the test
        **KINDS[kind],
    }
    spec = app["spec"]
    spec["executor"] = {"instances": 2, "cores": 1, "memory": "512m"}
    spec["driver"] = {"cores": 1, "memory": "1g", "serviceAccount": "spark"}
    spec["sparkConf"] = {"spark.sql.shuffle.partitions": "8"}
    spec.pop("deps", None)
    return dict(app)


def mapped(conf: dict[str, str], root: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """``conf`` with every executor volume's mount path (and every value naming it) moved under
    ``root``: on Kubernetes each is a directory of the executor pod."""
    mounts = {value: root / value.lstrip("/") for key, value in conf.items() if MOUNT.match(key)}
    out = {}
    for key, value in conf.items():
        parts = value.split(",")
        for path, local in mounts.items():
            parts = [
                str(local) + p[len(path) :] if p == path or p.startswith(path + "/") else p
                for p in parts
            ]
        out[key] = ",".join(parts)
    for local in mounts.values():
        local.mkdir(parents=True, exist_ok=True)
    return out, mounts


def scraped_port() -> int:
    values = yaml.safe_load(CHART_VALUES.read_text())
    return int(values["executorMetrics"]["podMonitor"]["port"])


def submitted_conf(app: dict[str, Any]) -> dict[str, str]:
    """The ``--conf`` pairs the Spark Operator submits ``app`` with, once checked: spilling,
    under the statetier volume's mount path, with metrics on the port the chart scrapes."""
    validate(app)
    submission = submit(app)  # raises where the Spark Operator refuses the application
    conf = submission.conf
    assert conf["spark.statetier.spill.enabled"] == "true"
    spill = conf["spark.statetier.spill.dirs"]
    assert f"spark-local-dir-statetier.mount.path={spill}" in " ".join(submission.args)
    assert conf["spark.statetier.metrics.port"] == str(scraped_port())
    return conf


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_volume_kind_is_submitted_with_the_spill_under_its_mount(
    kind: str, admitted: dict[str, dict[str, Any]]
) -> None:
    submitted_conf(admitted[kind])


def test_the_submitted_conf_spills_under_the_mount_and_counts_exactly(
    admitted: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    conf = submitted_conf(admitted["ephemeral"])
    spill = conf["spark.statetier.spill.dirs"]
    conf["spark.statetier.checkpoint.uri"] = f"file://{tmp_path}/ckpt"
    conf, mounts = mapped(conf, tmp_path / "pod")
    report = run(tmp_path, conf, mounts[spill], scraped_port())
    assert report["exact"]
    assert report["hosts"] == 2
    assert sum(report["spilled"]) > 0, report
    assert report["spill_files"], f"no spill file under {mounts[spill]}"
    assert "statetier_" in report["metrics"]


def run(tmp_path: Path, conf: dict[str, str], spill: Path, port: int) -> dict[str, Any]:
    config = {
        "conf": conf,
        "local": {
            "spark.master": "local-cluster[2,1,1024]",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.ui.enabled": "false",
        },
        "spill": str(spill),
        "port": port,
        "work": str(tmp_path / "work"),
        "batches": 4,
        "words": 150_000,
        "vocabulary": 60_000,
    }
    (tmp_path / "job.json").write_text(json.dumps(config))
    env = {**os.environ, **spark_env(), "SPARK_HOME": os.path.dirname(pyspark.__file__)}
    # One job at a time holds the port, whichever test worker runs it: on Kubernetes each pod
    # has its own, here every process shares the machine's.
    with (Path(tempfile.gettempdir()) / f"statetier-port-{port}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(
            [sys.executable, "-m", "tests.spark.submitted_job", str(tmp_path / "job.json")],
            check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=540,
        )  # fmt: skip
    assert done.returncode == 0, job_error(done.stderr)
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report

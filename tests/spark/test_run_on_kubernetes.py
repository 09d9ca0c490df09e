"""docs/run-on-kubernetes.md, every step that needs no container runtime: the chart renders with
the doc's values, the example SparkApplication runs a file the Spark image really contains, the
operator turns it into Spark conf plus environment (credentials only in the environment), and
the job program runs with exactly that conf and environment against a real S3 server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from statetier.operator import annotations as ann
from statetier.operator import sparkapp
from statetier.tools.compaction_launch import Processes
from statetier.tools.seaweed import BUCKET, SeaweedFS

from tests.spark.conftest import REPO, spark_env

DOC = REPO / "docs" / "run-on-kubernetes.md"
APP = REPO / "examples" / "sparkapplication-wordcount.yaml"
DOCKERFILE = REPO / "backend" / "Dockerfile.spark"


def doc_block(language: str, contains: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)
    return str(next(b for b in blocks if contains in b))


def image_files() -> dict[str, Path]:
    """What the Spark image's COPY steps put where: destination -> source in the repository."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    copies = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not words[1].startswith("--"):
            copies[words[-1]] = REPO / words[1]
    return copies


def test_the_chart_renders_with_the_values_of_the_walkthrough(tmp_path: Path) -> None:
    values = tmp_path / "my-values.yaml"
    values.write_text(doc_block("yaml", "executorMetrics"))
    result = subprocess.run(
        [sys.executable, str(REPO / "charts" / "render.py"), "-f", str(values)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout) if d]
    assert kinds.count("PodMonitor") == 2 and "ServiceMonitor" in kinds
    dashboards = [
        d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ConfigMap"
        and "grafana_dashboard" in d["metadata"].get("labels", {})
    ]  # fmt: skip
    assert len(dashboards) == 3


def test_the_example_application_runs_a_file_of_the_image() -> None:
    app = yaml.safe_load(APP.read_text())
    main = app["spec"]["mainApplicationFile"].removeprefix("local://")
    source = image_files()[main]
    assert source.is_file(), source
    assert source == REPO / "examples" / "kubernetes" / "wordcount.py"
    assert app["spec"]["image"].startswith("statetier/spark:")


def mutated_app() -> dict[str, Any]:
    """The example application as the operator's mutating webhook leaves it."""
    app = yaml.safe_load(APP.read_text())
    settings = ann.parse(app["metadata"]["annotations"])
    app["spec"].update(
        sparkapp.mutate(app, settings, "http://compaction-gateway:8080").spec_changes
    )
    return dict(app)


def test_the_operator_passes_credentials_as_environment_only() -> None:
    spec = mutated_app()["spec"]
    ref = {"secretRef": {"name": "checkpoint-store"}}
    assert ref in spec["driver"]["envFrom"] and ref in spec["executor"]["envFrom"]
    conf = spec["sparkConf"]
    assert conf["spark.statetier.checkpoint.uri"] == "s3://statetier-checkpoints/wordcount"
    assert not [k for k in conf if re.search(r"secret|access.key|password", k, re.I)]


@pytest.mark.slow
def test_the_job_runs_with_the_operators_conf_and_the_secret_as_environment(
    tmp_path: Path,
) -> None:
    spec = mutated_app()["spec"]
    conf = {k: v for k, v in spec["sparkConf"].items() if k.startswith("spark.statetier.")}
    # what differs on this machine: the bucket of the local server, a writable spill dir, the
    # compaction gateway's address (a process here, not the Service's DNS name), and chains
    # compacted after 2 deltas so that 4 epochs see a compaction
    uri = f"s3://{BUCKET}/k8s-wordcount"
    conf["spark.statetier.checkpoint.uri"] = uri
    conf["spark.statetier.spill.dirs"] = str(tmp_path / "spill")
    assert conf["spark.statetier.compaction.endpoints"] == "http://compaction-gateway:8080"
    conf["spark.statetier.compaction.delta-trigger"] = "2"
    with SeaweedFS.start(tmp_path / "seaweedfs") as weed:
        secret = {  # the Secret's keys and the pods' env, as the pods get them
            "AWS_ACCESS_KEY_ID": weed.options["key"],
            "AWS_SECRET_ACCESS_KEY": weed.options["secret"],
            "AWS_ENDPOINT_URL_S3": weed.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        token = {"STATETIER_COMPACTION_TOKEN": "t0ken-of-the-compaction-service"}
        service = Processes(tmp_path, env={**secret, "AWS_ENDPOINT_URL": weed.endpoint, **token})
        with service:
            gateway, _ = service.gateway([f"s3://{BUCKET}/"], port=0)
            service.worker(gateway, [f"s3://{BUCKET}/"])
            conf["spark.statetier.compaction.endpoints"] = gateway
            job, listing = run_job(spec, conf, {**secret, **token}, tmp_path)
            jobs = gateway_metric(gateway, token, uri)
    assert job.returncode == 0, job.stdout + job.stderr[-3000:]
    assert f"committed to {uri}" in job.stdout
    assert secret["AWS_SECRET_ACCESS_KEY"] not in job.stdout + job.stderr
    assert token["STATETIER_COMPACTION_TOKEN"] not in job.stdout + job.stderr
    assert listing.returncode == 0, listing.stderr
    epochs = [int(line.split()[0]) for line in listing.stdout.splitlines()[1:]]
    assert epochs and max(epochs) >= 4
    assert jobs >= 1  # the job's chains were compacted by the service, under its tenant


def run_job(
    spec: dict[str, Any], conf: dict[str, str], environment: dict[str, str], tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The job program with ``conf`` and the pods' ``environment``, then a checkpoint listing."""
    local = {
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
    }
    submit = " ".join(f"--conf {k}={v}" for k, v in {**local, **conf}.items())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STATETIER_"))},
        **spark_env(),
        **environment,
        "PYSPARK_SUBMIT_ARGS": f"{submit} pyspark-shell",
    }
    job = subprocess.run(
        [
            sys.executable, str(image_files()[spec["mainApplicationFile"][8:]]),
            "--checkpoint-location", str(tmp_path / "spark-checkpoint"),
            "--rows-per-second", "200", "--trigger", "1 second", "--parallelism", "2",
            "--stop-after", "4",
        ],
        capture_output=True, text=True, timeout=280, check=False, env=env,
    )  # fmt: skip
    listing = subprocess.run(
        [sys.executable, "-m", "statetier.backend", "checkpoint", "list",
         conf["spark.statetier.checkpoint.uri"]],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    return job, listing


def gateway_metric(gateway: str, token: dict[str, str], tenant: str) -> float:
    """Jobs of ``tenant`` the gateway says succeeded (its metrics need the token too)."""
    request = urllib.request.Request(
        f"{gateway}/metrics",
        headers={"Authorization": f"Bearer {token['STATETIER_COMPACTION_TOKEN']}"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read().decode()
    series = f'statetier_compaction_tenant_jobs_total{{outcome="succeeded",tenant="{tenant}"}}'
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series)
    ]
    return values[0] if values else 0.0

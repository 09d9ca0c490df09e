"""``make sandbox``: watch the operator work on a laptop, without a cluster.

It starts the Kubernetes API emulator and the real operator with its webhook server on
127.0.0.1, applies the CRDs and the examples with kubectl, plays the Deployment controller the
emulator lacks, and prints every step and what the operator did. Everything it started is
stopped at the end, also on Ctrl-C or failure.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from statetier.kubetest.processes import Sandbox

__all__ = ["main"]

DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
CS = "/apis/statetier.io/v1alpha1/namespaces/default/compactionservices"


def _step(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def _show(box: Sandbox, *args: str) -> None:
    print(f"$ kubectl {' '.join(args)}")
    print(box.kubectl(*args, check=False).rstrip(), flush=True)


def _mark_ready(box: Sandbox, name: str) -> None:
    """Play the kubelet: every Pod of the Deployment is ready (the emulator's Deployment
    controller turns that into the conditions a real one reports)."""
    replicas = box.get(f"{DEPLOY}/{name}")["spec"]["replicas"]
    box.send(
        "PATCH",
        f"{DEPLOY}/{name}/status",
        {"status": {"readyReplicas": replicas, "availableReplicas": replicas}},
    )


def run(repo: Path) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="statetier-sandbox-") as tmp,
        Sandbox(Path(tmp), operator=False) as box,
    ):
        _step(f"Kubernetes API emulator on {box.url} (kubeconfig {box.kubeconfig})")
        _step("Apply the CRDs (and the SparkApplication CRD the Spark Operator would install)")
        _show(
            box,
            "apply",
            "-f",
            str(repo / "crds"),
            "-f",
            str(repo / "tests/operator/fixtures/sparkapplication-crd.yaml"),
        )
        _step("Start the operator: statetier-operator run (kopf) with its HTTPS webhook server")
        box.start_operator_process()
        box.wait_for_operator()
        print(
            f"operator up; metrics on http://127.0.0.1:{box.metrics_port}/metrics, "
            f"webhooks on https://127.0.0.1:{box.webhook_port}"
        )
        _show(box, "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations")

        _step("Apply examples/compactionservice.yaml")
        _show(box, "apply", "-f", str(repo / "examples/compactionservice.yaml"))
        box.wait("Deployments", lambda: box.get(f"{DEPLOY}/compaction-workers"))
        _show(box, "get", "compsvc,deployments,services")
        _step("Play the Deployment controller (the emulator has none): pods become ready")
        for name in ("compaction-gateway", "compaction-workers"):
            _mark_ready(box, name)
        box.wait(
            "Ready",
            lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in box.get(f"{CS}/compaction")["status"]["conditions"]
            ),
        )
        _show(box, "get", "compsvc", "-o", "wide")

        _step("Scale the workers through the scale subresource (max is 4: 10 is clamped)")
        _show(box, "scale", "compsvc/compaction", "--replicas=10")
        box.wait(
            "4 workers", lambda: box.get(f"{DEPLOY}/compaction-workers")["spec"]["replicas"] == 4
        )
        _show(
            box,
            "get",
            "deployment",
            "compaction-workers",
            "-o",
            'jsonpath={.metadata.name} replicas={.spec.replicas}{"\\n"}',
        )

        _step("Apply examples/sparkapplication-wordcount.yaml: the mutating webhook configures it")
        _show(box, "apply", "-f", str(repo / "examples/sparkapplication-wordcount.yaml"))
        app = box.kubectl_json("get", "sparkapplication", "wordcount")
        print("sparkConf written by the operator:")
        for key, value in sorted(app["spec"]["sparkConf"].items()):
            print(f"  {key} = {value}")
        print("volumes:", json.dumps(app["spec"]["volumes"]))
        print("executor.volumeMounts:", json.dumps(app["spec"]["executor"]["volumeMounts"]))
        print("statetier.io/status:", app["metadata"]["annotations"]["statetier.io/status"])

        _step("A bad annotation is rejected by the validating webhook")
        bad = dict(app)
        bad["metadata"] = {
            "name": "typo",
            "namespace": "default",
            "annotations": {"statetier.io/enabled": "true", "statetier.io/spill-volume": "nvme"},
        }
        print(box.kubectl("apply", "-f", "-", stdin=json.dumps(bad), check=False).strip())

        _step("Events the operator posted")
        time.sleep(0.5)
        events = box.get("/api/v1/namespaces/default/events")["items"]
        for event in events:
            print(
                f"  {event['type']:8} {event['involvedObject']['kind']}/"
                f"{event['involvedObject']['name']} {event['reason']}: {event['message']}"
            )

        _step("Metrics (statetier_*)")
        url = f"http://127.0.0.1:{box.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("statetier_") and "_bucket" not in line:
                    print("  " + line)

        _step("Delete the application (finalizer: retention) and the compaction service")
        _show(box, "delete", "sparkapplication", "wordcount")
        _show(box, "delete", "compsvc", "compaction")
        # The garbage collector removes the owned objects in the background, a moment later.
        _show(
            box,
            "wait",
            "--for=delete",
            "deployment/compaction-gateway",
            "deployment/compaction-workers",
            "service/compaction-gateway",
            "--timeout=30s",
        )
        _show(box, "get", "compsvc,deployments,services,sparkapplications")
        _step("Stopping the operator and the emulator")
    print("done: everything the sandbox started has stopped")


def main(argv: Sequence[str] | None = None) -> int:
    """``statetier-operator sandbox`` (``make sandbox``)."""
    parser = argparse.ArgumentParser(
        prog="statetier-operator sandbox",
        description="The operator at work without a cluster: the API emulator, the operator and "
        "its webhooks on 127.0.0.1, kubectl apply of crds/ and examples/, narrated; everything "
        "it started stops at the end.",
    )
    parser.add_argument("--repo", default=".", help="repository root (crds/, examples/)")
    run(Path(parser.parse_args(argv).repo).resolve())
    return 0

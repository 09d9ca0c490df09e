"""Helpers of the packaging tests: the chart rendered with helm-python-sdk, and the API
emulator run in this process so its request log can be read (who called what, with which verb).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "statetier"

# Every optional feature of the chart switched on.
ALL_ON: dict[str, Any] = {
    "watchNamespaces": ["spark-jobs", "analytics"],
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "podMonitor": {"enabled": True},
    },
    "executorMetrics": {"podMonitor": {"enabled": True, "namespaces": ["spark-jobs"]}},
    "compactionMetrics": {"podMonitor": {"enabled": True}},
    "certManager": {"enabled": True},
    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    "grafana": {"dashboards": {"enabled": True}},
    "webhooks": {
        "namespaceSelector": {"matchLabels": {"statetier.io/webhooks": "enabled"}},
        "objectSelector": {"matchLabels": {"statetier.io/enabled": "true"}},
    },
    "extraEnv": [{"name": "AWS_REGION", "value": "eu-west-1"}],
    "networkPolicy": {
        "enabled": True,
        "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
    },
}


def render(
    values: dict[str, Any] | None = None, *, namespace: str = "statetier"
) -> list[dict[str, Any]]:
    """The chart's manifests for ``values``, as a list of objects (empty documents dropped)."""
    import helm_python

    with helm_python.Chart.load(str(CHART)) as chart:
        rendered = chart.render(
            values or {}, name="statetier", namespace=namespace, is_install=True
        )
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def notes(values: dict[str, Any] | None = None) -> str:
    import helm_python

    with helm_python.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values or {}, name="statetier", namespace="statetier")
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


# ---------------------------------------------------------------------- in-process API emulator

CORE_PATH = re.compile(r"^/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<rest>.+)$")
GROUP_PATH = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<rest>.+)$"
)


def classify(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str, str] | None:
    """An API request as RBAC sees it: (verb, apiGroup, resource[/subresource], namespace).

    None for non-resource paths (discovery, /version), which every authenticated client may
    read. A namespace object itself (``/api/v1/namespaces/x``) is the resource ``namespaces``.
    """
    path = path.rstrip("/")
    group = ""
    match = CORE_PATH.match(path)
    if match is None:
        match = GROUP_PATH.match(path)
        if match is None:
            return None
        group = match["group"]
    parts = match["rest"].split("/")
    namespace = match["ns"] or ""
    if match["ns"] is None and parts[0] == "namespaces" and len(parts) == 1:
        parts = ["namespaces"]
    if len(parts) > 3:
        return None
    resource = parts[0] + (f"/{parts[2]}" if len(parts) == 3 else "")
    named = len(parts) >= 2
    method = method.upper()
    if method == "GET":
        verb = "watch" if query.get("watch") in ("true", "1") else ("get" if named else "list")
    else:
        verb = {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection",
        }[method]
    return verb, group, resource, namespace


def yaml_stream(docs: list[dict[str, Any]]) -> str:
    """Documents as one YAML stream, as ``kubectl apply -f`` takes a rendered chart."""
    return "---\n".join(json.dumps(doc) + "\n" for doc in docs)


def kubeconfig_text(url: str, token: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": url}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "u"}},
            ],
        }
    )


class ThreadedEmulator:
    """statetier's API emulator in a thread of this process; its request log stays readable.
    Its Jobs' pods write their files under ``job_workdir`` (the test's folder, not /tmp)."""

    def __init__(self, job_workdir: Path) -> None:
        self.job_workdir = job_workdir
        self.url = ""
        self.emulator: Any = None
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        from statetier.kubetest.emulator import serve

        self._stop = asyncio.Event()
        async with serve() as (emulator, url):
            self.emulator, self.url = emulator, url
            emulator.job_workdir = self.job_workdir
            self._ready.set()
            await self._stop.wait()

    def start(self) -> ThreadedEmulator:
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the API emulator did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def requests_by(self, token: str) -> list[tuple[str, str, str, str]]:
        """Every resource request sent with ``token``, classified as RBAC sees it."""
        seen = []
        for request in list(self.emulator._requests):
            if request.headers.get("Authorization", "") != f"Bearer {token}":
                continue
            query = {k: str(v) for k, v in request.params.items()}
            found = classify(request.method, request.url.path, query)
            if found is not None:
                seen.append(found)
                seen += implied_checks(found, request.headers, request.text)
        return seen


# Owner kinds the operator sets blockOwnerDeletion on, by (apiVersion, kind): their resource.
OWNER_RESOURCES = {
    ("statetier.io/v1alpha1", "CompactionService"): ("statetier.io", "compactionservices"),
    ("statetier.io/v1alpha1", "StateSnapshot"): ("statetier.io", "statesnapshots"),
    ("statetier.io/v1alpha1", "ScheduledStateSnapshot"): (
        "statetier.io",
        "scheduledstatesnapshots",
    ),
}


def implied_checks(
    found: tuple[str, str, str, str], headers: Any, text: str
) -> list[tuple[str, str, str, str]]:
    """Authorization checks a real apiserver makes beyond the request's own verb.

    A server-side apply that creates the object is authorized as ``create`` as well; and the
    OwnerReferencesPermissionEnforcement admission plugin (on in OpenShift) lets a write set
    ``blockOwnerDeletion`` only for a client that may ``update`` the owner's ``finalizers``.
    """
    verb, _, _, namespace = found
    extra: list[tuple[str, str, str, str]] = []
    if verb == "patch" and headers.get("Content-Type", "").startswith("application/apply-patch"):
        extra.append(("create", *found[1:]))
    if verb not in ("create", "patch", "update"):
        return extra
    try:
        body = json.loads(text) if text else {}
    except ValueError:
        return extra
    refs = (
        ((body.get("metadata") or {}).get("ownerReferences") or [])
        if isinstance(body, dict)
        else []
    )
    for ref in refs:
        owner = OWNER_RESOURCES.get((ref.get("apiVersion"), ref.get("kind")))
        if ref.get("blockOwnerDeletion") and owner:
            extra.append(("update", owner[0], f"{owner[1]}/finalizers", namespace))
    return extra


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# ---------------------------------------------------------------------- the operator, as charted

OPERATOR_TOKEN = "statetier-operator"
TESTER_TOKEN = "tester"
SPARK_CRD = REPO / "tests" / "operator" / "fixtures" / "sparkapplication-crd.yaml"
DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments"


def chart_operator_args(docs: list[dict[str, Any]]) -> list[str]:
    """The operator's arguments from the chart's Deployment (after ``statetier-operator``)."""
    deployment = find(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return [str(a) for a in container["args"]]


POD_NAME = "statetier-5d8c7b9f6d-x2v4q"


def chart_operator_command(docs: list[dict[str, Any]]) -> list[str]:
    """The container command of the chart's Deployment, expanded as the kubelet does."""
    container = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {"POD_NAME": POD_NAME}
    return [kubelet_expand(str(a), env) for a in container["command"]]


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of command/args: ``$(VAR)`` of a defined variable is replaced,
    ``$$`` is a literal ``$``, anything else stays as written."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def loopback_args(
    args: list[str], *, ports: dict[str, int], certfile: str, keyfile: str
) -> list[str]:
    """The chart's arguments with addresses, ports and certificate paths for this machine."""
    out = list(args)
    replace = {
        "--metrics-addr": "127.0.0.1",
        "--webhook-addr": "127.0.0.1",
        "--webhook-host": "127.0.0.1",
        "--metrics-port": str(ports["metrics"]),
        "--webhook-port": str(ports["webhooks"]),
        "--liveness": f"http://127.0.0.1:{ports['liveness']}/healthz",
        "--certfile": certfile,
        "--keyfile": keyfile,
    }
    for i, arg in enumerate(out[:-1]):
        if arg in replace:
            out[i + 1] = replace[arg]
    return out


class OperatorRun:
    """The real operator with the chart's arguments against :class:`ThreadedEmulator`."""

    def __init__(
        self, emulator: ThreadedEmulator, workdir: Path, command: list[str], args: list[str]
    ) -> None:
        import subprocess
        import sys

        from statetier.kubetest.certs import self_signed
        from statetier.kubetest.processes import free_port

        self.emulator = emulator
        self.workdir = workdir
        self.ports = {"metrics": free_port(), "webhooks": free_port(), "liveness": free_port()}
        certfile, keyfile = self_signed(str(workdir))
        self.operator_kubeconfig = workdir / "operator.kubeconfig"
        self.operator_kubeconfig.write_text(kubeconfig_text(emulator.url, OPERATOR_TOKEN))
        self.kubeconfig = workdir / "tester.kubeconfig"
        self.kubeconfig.write_text(kubeconfig_text(emulator.url, TESTER_TOKEN))
        self.certfile = certfile
        self.command = command
        self.args = loopback_args(args, ports=self.ports, certfile=certfile, keyfile=keyfile)
        self.log = workdir / "operator.log"
        self._subprocess = subprocess
        self._python = sys.executable
        self.proc: Any = None

    def start(self) -> None:
        import os

        # The chart's own command (a shell giving the replica its peering priority, then exec
        # of the statetier-operator console script of this environment), with the pod's env.
        bindir = str(Path(self._python).parent)
        env = {
            **os.environ,
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
            "POD_NAME": POD_NAME,
            "KUBECONFIG": str(self.operator_kubeconfig),
        }
        with open(self.log, "ab") as log:
            self.proc = self._subprocess.Popen(
                [*self.command, *self.args],
                stdout=log,
                stderr=self._subprocess.STDOUT,
                env=env,
            )
        self.wait_for(
            "the liveness endpoint", lambda: self.http_get(self.ports["liveness"], "/healthz")
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except self._subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    @staticmethod
    def http_get(port: int, path: str) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            return str(response.read().decode())

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        from statetier.kubetest.processes import kubectl_path

        proc = self._subprocess.run(
            [kubectl_path(), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}\n{self.tail()}")
        return str(proc.stdout + proc.stderr)

    def read(self, group: str, plural: str, namespace: str | None, name: str) -> Any:
        return self.emulator.emulator.read_object(group, plural, namespace, name)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def wait_for(self, what: str, predicate: Any, timeout: float = 20.0) -> Any:
        import contextlib
        import time

        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the operator exited:\n{self.tail()}")
            with contextlib.suppress(Exception):
                last = predicate()
                if last:
                    return last
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what} (last {last!r})\n{self.tail()}")


class FlowResult:
    """What one run of the operator integration flow recorded."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str, str]] = []
        self.metrics = ""
        self.wait_output = ""
        self.wait_before_ready = ""
        self.status_before_ready: dict[str, Any] = {}
        self.status: dict[str, Any] = {}
        self.generation = 0
        self.docs: list[dict[str, Any]] = []
        self.admissions: dict[str, dict[str, Any]] = {}
        self.peering: dict[str, Any] = {}


def flow_checkpoint(workdir: Path) -> str:
    """A real checkpoint of two committed epochs on file://, for the flow's StateSnapshots (a
    Job's process reads it: memory:// would be empty there)."""
    from tests.checkpoint.ckpt_support import Location, records

    root = workdir / "flow-checkpoint"
    location = Location("file", f"file://{root}", str(root), {})
    runner = location.runner(2)
    for epoch in (1, 2):
        runner.process(records(epoch))
        runner.checkpoint()
    runner.close()
    return location.uri


def snapshot_flow(run: OperatorRun, workdir: Path, namespace: str) -> None:
    """A StateSnapshot that succeeds and is deleted with its files (its Job, the finalizer and
    the cleanup Job), and a schedule that takes snapshots and prunes them beyond ``keep``. The
    emulator runs in this process: its Job double finds ``statetier`` on this PATH."""
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{path}"
    try:
        _snapshot_flow(run, workdir, namespace)
    finally:
        os.environ["PATH"] = path


def _snapshot_flow(run: OperatorRun, workdir: Path, namespace: str) -> None:
    snapshots = ("statetier.io", "statesnapshots", namespace)
    spec = {"sparkApplication": "flow-app", "destination": f"file://{workdir}/savepoints"}
    snap: dict[str, Any] = {"apiVersion": "statetier.io/v1alpha1", "kind": "StateSnapshot"}
    snap["metadata"] = {"name": "flow-snap", "namespace": namespace}
    snap["spec"] = {**spec, "deletionPolicy": "delete"}
    run.kubectl("apply", "-f", "-", stdin=json.dumps(snap))
    run.wait_for(
        "the snapshot's finalizer",
        lambda: (run.read(*snapshots, "flow-snap") or {}).get("metadata", {}).get("finalizers"),
        timeout=60,
    )
    schedule: dict[str, Any] = {
        "apiVersion": "statetier.io/v1alpha1",
        "kind": "ScheduledStateSnapshot",
    }
    schedule["metadata"] = {"name": "flow-sched", "namespace": namespace}
    schedule["spec"] = {"schedule": "* * * * * *", "keep": 1, "snapshot": spec}
    run.kubectl("apply", "-f", "-", stdin=json.dumps(schedule))
    seen: set[str] = set()

    def pruned() -> bool:
        names = {
            o["metadata"]["name"]
            for o in run.emulator.emulator.list_objects("statetier.io", "statesnapshots")
            if o["metadata"]["name"].startswith("flow-sched-")
        }
        gone = seen - names
        seen.update(names)
        return bool(gone)

    run.wait_for("a pruned scheduled snapshot", pruned, timeout=60)
    run.kubectl("delete", "scheduledstatesnapshot", "flow-sched", "-n", namespace)
    run.kubectl("delete", "statesnapshot", "flow-snap", "-n", namespace, "--timeout=60s")


def run_flow(values: dict[str, Any], workdir: Path, namespace: str = "default") -> FlowResult:
    """Install the chart's CRDs, run the operator with the chart's arguments, and drive every
    API path it has: CompactionService create/ready/scale/drift/autoscaler/delete, an opted-in
    SparkApplication with its event and finalizer (checkpoint deletion), peering, shutdown."""
    from statetier.kubetest.processes import compaction_service_manifest, free_port

    result = FlowResult()
    docs = render(values)
    result.docs = docs
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    (workdir / "jobs").mkdir(exist_ok=True)
    emulator = ThreadedEmulator(workdir / "jobs").start()
    run: OperatorRun | None = None
    try:
        run = OperatorRun(
            emulator, workdir, chart_operator_command(docs), chart_operator_args(docs)
        )
        crd_file = workdir / "crds.yaml"
        crd_file.write_text(yaml_stream(crds))
        run.kubectl("apply", "-f", str(crd_file), "-f", str(SPARK_CRD))
        peerings = [d for d in docs if d["kind"] in ("KopfPeering", "ClusterKopfPeering")]
        peering_file = workdir / "peering.yaml"
        peering_file.write_text(yaml_stream(peerings))
        run.kubectl("apply", "-f", str(peering_file))
        run.start()
        name = "flow"
        deploy = DEPLOYMENTS.format(ns=namespace)
        manifest = json.loads(compaction_service_manifest(name, namespace=namespace))
        manifest["spec"]["workers"] = {
            "min": 1,
            "max": 4,
            "autoscaling": {
                "enabled": True,
                "periodSeconds": 1,
                "gatewayURL": f"http://127.0.0.1:{free_port()}",
            },
        }
        run.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        for part in ("gateway", "workers"):
            run.wait_for(
                f"Deployment {name}-{part}",
                lambda part=part: run.read("apps", "deployments", namespace, f"{name}-{part}"),
            )
        # Not ready yet (no Deployment controller has reported): kubectl wait must time out.
        run.wait_for(
            "a first status",
            lambda: (
                (run.read("statetier.io", "compactionservices", namespace, name) or {})
                .get("status", {})
                .get("conditions")
            ),
        )
        result.wait_before_ready = run.kubectl(
            "wait",
            "--for=condition=Ready",
            f"compactionservice/{name}",
            "-n",
            namespace,
            "--timeout=1s",
            check=False,
        )
        result.status_before_ready = run.read(
            "statetier.io", "compactionservices", namespace, name
        )["status"]
        # Play the Deployment controller (the emulator runs none), without the operator's token.
        for part in ("gateway", "workers"):
            current = run.read("apps", "deployments", namespace, f"{name}-{part}")
            replicas = current["spec"]["replicas"]
            _send(
                emulator.url,
                f"{deploy}/{name}-{part}/status",
                {
                    "status": {
                        "observedGeneration": current["metadata"]["generation"],
                        "replicas": replicas,
                        "updatedReplicas": replicas,
                        "readyReplicas": replicas,
                        "availableReplicas": replicas,
                    }
                },
            )
        result.wait_output = run.kubectl(
            "wait",
            "--for=condition=Ready",
            f"compactionservice/{name}",
            "-n",
            namespace,
            "--timeout=30s",
        )
        cs = run.read("statetier.io", "compactionservices", namespace, name)
        result.status, result.generation = cs["status"], cs["metadata"]["generation"]
        run.wait_for(
            "the autoscaler's GatewayUnreachable observation",
            lambda: (
                (run.read("statetier.io", "compactionservices", namespace, name) or {})
                .get("status", {})
                .get("autoscaling", {})
                .get("reason")
                == "GatewayUnreachable"
            ),
        )
        run.kubectl("scale", f"compactionservice/{name}", "-n", namespace, "--replicas=3")
        run.wait_for(
            "3 workers",
            lambda: (
                run.read("apps", "deployments", namespace, f"{name}-workers")["spec"]["replicas"]
                == 3
            ),
        )
        run.kubectl(
            "patch",
            f"compactionservice/{name}",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"spec": {"gateway": {"port": 8081}}}',
        )
        run.wait_for(
            "the gateway Service on the new port",
            lambda: (
                run.read("", "services", namespace, f"{name}-gateway")["spec"]["ports"][0]["port"]
                == 8081
            ),
        )
        run.kubectl("delete", "deployment", f"{name}-workers", "-n", namespace)
        run.wait_for(
            "the worker Deployment recreated",
            lambda: run.read("apps", "deployments", namespace, f"{name}-workers"),
        )
        app = {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "SparkApplication",
            "metadata": {
                "name": "flow-app",
                "namespace": namespace,
                "annotations": {
                    "statetier.io/enabled": "true",
                    "statetier.io/checkpoint-uri": flow_checkpoint(workdir),
                    "statetier.io/checkpoint-retention": "delete",
                    "statetier.io/status": '{"volume": "emptyDir"}',
                },
            },
            "spec": {"type": "Python", "mode": "cluster", "sparkVersion": "4.3.0"},
        }
        run.kubectl("apply", "-f", "-", stdin=json.dumps(app))
        objects = {"sparkapplications": app, "compactionservices": manifest}
        for doc in docs:
            if doc["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                for hook in doc["webhooks"]:
                    path = hook["clientConfig"]["service"]["path"]
                    rule = hook["rules"][0]
                    result.admissions[path] = admission_review(
                        run, path, rule, objects[rule["resources"][0]]
                    )
        run.wait_for(
            "the finalizer",
            lambda: (
                "statetier.io/finalizer"
                in (
                    run.read("sparkoperator.k8s.io", "sparkapplications", namespace, "flow-app")
                    or {}
                )
                .get("metadata", {})
                .get("finalizers", [])
            ),
        )
        snapshot_flow(run, workdir, namespace)
        run.kubectl("delete", "sparkapplication", "flow-app", "-n", namespace, "--timeout=30s")
        result.metrics = run.http_get(run.ports["metrics"], "/metrics")
        peering = next(d for d in docs if d["kind"] in ("KopfPeering", "ClusterKopfPeering"))
        result.peering = run.read(
            "kopf.dev",
            "clusterkopfpeerings" if peering["kind"] == "ClusterKopfPeering" else "kopfpeerings",
            peering["metadata"].get("namespace"),
            peering["metadata"]["name"],
        )
        run.kubectl("delete", "compactionservice", name, "-n", namespace, "--timeout=30s")
        run.wait_for(
            "the worker Deployment collected",
            lambda: run.read("apps", "deployments", namespace, f"{name}-workers") is None,
        )
    finally:
        if run is not None:
            run.stop()
        result.requests = emulator.requests_by(OPERATOR_TOKEN)
        emulator.stop()
    return result


def admission_review(
    run: OperatorRun, path: str, rule: dict[str, Any], obj: dict[str, Any]
) -> dict[str, Any]:
    """POST an AdmissionReview to the operator's webhook server as the apiserver would (HTTPS,
    certificate verified), at a path of the chart's webhook configuration."""
    import ssl
    import urllib.request

    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b6f6d8e-0000-4000-8000-000000000001",
            "kind": {
                "group": rule["apiGroups"][0],
                "version": rule["apiVersions"][0],
                "kind": obj["kind"],
            },
            "resource": {
                "group": rule["apiGroups"][0],
                "version": rule["apiVersions"][0],
                "resource": rule["resources"][0],
            },
            "operation": "CREATE",
            "namespace": obj["metadata"].get("namespace", "default"),
            "name": obj["metadata"]["name"],
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "userInfo": {"username": "tester"},
        },
    }
    context = ssl.create_default_context(cafile=run.certfile)
    request = urllib.request.Request(
        f"https://127.0.0.1:{run.ports['webhooks']}{path}",
        method="POST",
        data=json.dumps(review).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def _send(url: str, path: str, body: Any) -> Any:
    import urllib.request

    request = urllib.request.Request(
        url + path,
        method="PATCH",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)

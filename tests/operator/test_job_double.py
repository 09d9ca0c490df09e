"""The emulator's Job double (Kubernetes 1.31 Job controller + a kubelet for Jobs): a Job's
container runs as a real process with the environment the kubelet gives it, and the Job's
status follows from its exit as the 1.31 controller writes it."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from statetier.kubetest import jobs
from statetier.kubetest.processes import Sandbox

JOBS = "/apis/batch/v1/namespaces/default/jobs"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(tmp_path_factory.mktemp("jobs"), operator=False) as sandbox:
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}}
        secret["stringData"] = {"USER_NAME": "ada"}
        sandbox.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
        yield sandbox


def _job(name: str, script: str, **spec: object) -> str:
    container = {
        "name": "main",
        "image": "python:3",
        "command": [sys.executable, "-c", script, "/dev/termination-log"],
        "envFrom": [{"secretRef": {"name": "creds"}}],
        "env": [
            {"name": "WHO", "value": "job-$(USER_NAME)"},
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "USER_NAME"}}},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    template = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}}
    body["spec"] = {"template": template, **spec}
    return json.dumps(body)


WRITE = (
    "import os, sys; open(sys.argv[1], 'w').write(os.environ['WHO'] + ' ' + os.environ['KEY'] "
    "+ ' ' + str(sorted(k for k in os.environ if k.startswith('USER'))))"
)


def test_a_job_runs_its_command_with_its_environment_and_completes(box: Sandbox) -> None:
    box.kubectl("apply", "-f", "-", stdin=_job("ok", WRITE))
    box.kubectl("wait", "--for=condition=complete", "job/ok", "--timeout=30s")
    job = box.get(f"{JOBS}/ok")
    status = job["status"]
    assert status["succeeded"] == 1 and status["active"] == 0
    assert status["startTime"] <= status["completionTime"]
    assert [c["type"] for c in status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert {c["reason"] for c in status["conditions"]} == {"CompletionsReached"}
    assert job["spec"]["backoffLimit"] == 6  # the API default
    pods = box.kubectl_json("get", "pods", "-l", "batch.kubernetes.io/job-name=ok")["items"]
    assert len(pods) == 1 and pods[0]["status"]["phase"] == "Succeeded"
    terminated = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    assert terminated["message"] == "job-ada ada ['USER_NAME']"


def test_a_failing_job_fails_after_its_backoff_limit_with_the_output_as_message(
    box: Sandbox,
) -> None:
    script = "import sys; print('no bucket named x', file=sys.stderr); sys.exit(3)"
    box.kubectl("apply", "-f", "-", stdin=_job("bad", script, backoffLimit=0))
    box.kubectl("wait", "--for=condition=failed", "job/bad", "--timeout=30s")
    status = box.get(f"{JOBS}/bad")["status"]
    assert status["failed"] == 1 and status.get("succeeded") is None
    assert [c["type"] for c in status["conditions"]] == ["FailureTarget", "Failed"]
    assert status["conditions"][1]["reason"] == "BackoffLimitExceeded"
    pod = box.kubectl_json("get", "pods", "-l", "job-name=bad")["items"][0]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    assert terminated["message"].strip() == "no bucket named x"


def test_a_missing_secret_leaves_the_pod_pending_as_the_kubelet_does(box: Sandbox) -> None:
    body = json.loads(_job("nosecret", WRITE))
    body["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [
        {"secretRef": {"name": "absent"}}
    ]
    box.kubectl("apply", "-f", "-", stdin=json.dumps(body))

    def waiting() -> str:
        pods = box.kubectl_json("get", "pods", "-l", "job-name=nosecret")["items"]
        state = pods[0]["status"]["containerStatuses"][0]["state"]
        return str(state["waiting"]["reason"])

    assert box.wait("a waiting container", waiting) == "CreateContainerConfigError"
    assert box.get(f"{JOBS}/nosecret")["status"]["active"] == 1


def test_backoff_doubles_and_is_capped() -> None:
    assert [jobs.backoff(n) for n in (0, 1, 2, 3)] == [0.0, 10.0, 20.0, 40.0]
    assert jobs.backoff(10) == 360.0


def test_expansion_follows_the_kubelet() -> None:
    env = {"A": "1"}
    assert jobs.expand("$(A)-$(B)-$$(A)", env) == "1-$(B)-$(A)"

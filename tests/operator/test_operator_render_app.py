"""``statetier-operator render-app``: the webhook's configuration without the webhook.

The command runs as a user would run it (a subprocess, files in, YAML out); its output must be
what the mutating webhook would produce, so the webhook, if it runs later, changes nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from statetier.operator import annotations as ann
from statetier.operator import sparkapp

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "sparkapplication-wordcount.yaml"
ENDPOINT = "http://compaction-gateway.default.svc:8080"


def _render(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statetier.operator.cli", "render-app", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_rendered_application_is_what_the_webhook_writes() -> None:
    proc = _render(str(APP), "--compaction-endpoint", ENDPOINT)
    assert proc.returncode == 0, proc.stderr
    (app,) = _docs(proc.stdout)
    settings = ann.parse(app["metadata"]["annotations"])
    # The webhook's token reference for a service without tokenSecretRef: the generated one.
    generated = ("compaction-compaction-token", "token")
    assert sparkapp.mutate(app, settings, ENDPOINT, None, generated).empty  # nothing to change
    for role in ("driver", "executor"):
        (var,) = [e for e in app["spec"][role]["env"] if e["name"] == "STATETIER_COMPACTION_TOKEN"]
        assert var["valueFrom"]["secretKeyRef"] == {"name": generated[0], "key": "token"}
    # The executor's memory covers its state hosts: 1g overhead + 2g budget (shared) + a 256Mi
    # allowance for each host, one per task slot (2 cores).
    assert app["spec"]["executor"]["memoryOverhead"] == f"{1024 + 2048 + 2 * 256}m"
    conf = app["spec"]["sparkConf"]
    assert conf["spark.statetier.compaction.endpoints"] == ENDPOINT
    assert conf["spark.statetier.spill.dirs"] == "/var/lib/statetier/spill"
    assert [v["name"] for v in app["spec"]["volumes"]] == [sparkapp.VOLUME_NAME]
    for role in ("driver", "executor"):
        assert app["spec"][role]["labels"] == {sparkapp.POD_LABEL: "true"}


def test_a_token_secret_of_the_service_s_own_is_named_on_the_command_line() -> None:
    proc = _render(
        str(APP), "--compaction-endpoint", ENDPOINT, "--compaction-token-secret", "team:api"
    )
    assert proc.returncode == 0, proc.stderr
    (app,) = _docs(proc.stdout)
    (var,) = [e for e in app["spec"]["driver"]["env"] if e["name"] == "STATETIER_COMPACTION_TOKEN"]
    assert var["valueFrom"]["secretKeyRef"] == {"name": "team", "key": "api"}
    assert not [v for v in app["spec"]["sparkConf"] if "token" in v.lower()]
    bad = _render(str(APP), "--compaction-endpoint", ENDPOINT, "--compaction-token-secret", ":k")
    assert bad.returncode == 2 and "--compaction-token-secret ':k'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_pod_template_form_and_pass_through_of_other_documents() -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}
    plain = yaml.safe_load(APP.read_text())
    plain["metadata"]["name"] = "not-opted-in"
    plain["metadata"]["annotations"] = {}
    stream = yaml.safe_dump_all([other, plain]) + "---\n" + APP.read_text()
    proc = _render("-", "--pod-template", stdin=stream)
    assert proc.returncode == 0, proc.stderr
    passed, untouched, app = _docs(proc.stdout)
    assert passed == other and untouched == plain
    spec = app["spec"]
    assert "volumes" not in spec and "volumeMounts" not in spec["executor"]
    template = spec["executor"]["template"]
    assert template["metadata"]["labels"] == {sparkapp.POD_LABEL: "true"}
    assert spec["driver"]["template"]["metadata"]["labels"] == {sparkapp.POD_LABEL: "true"}
    (volume,) = template["spec"]["volumes"]
    (container,) = template["spec"]["containers"]
    # A pod template takes any volume kind: a generic ephemeral volume there, and the
    # on-demand claim's options (Spark conf's way of asking for one) are gone.
    assert volume["name"] == sparkapp.VOLUME_NAME and "ephemeral" in volume
    claim = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "local-ssd"
    assert claim["resources"]["requests"]["storage"] == "100Gi"
    assert not [k for k in spec["sparkConf"] if "persistentVolumeClaim" in k]
    assert container["volumeMounts"] == [
        {"name": sparkapp.VOLUME_NAME, "mountPath": "/var/lib/statetier/spill"}
    ]
    assert "spark.statetier.spill.dirs" in spec["sparkConf"]


def test_invalid_annotations_are_an_error_naming_file_and_annotation(tmp_path: Path) -> None:
    bad = yaml.safe_load(APP.read_text())
    bad["metadata"]["annotations"]["statetier.io/spill-volume"] = "nvme"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = _render(str(path))
    assert proc.returncode == 2
    assert f"{path}: wordcount:" in proc.stderr and "statetier.io/spill-volume" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_output_has_no_yaml_anchors_or_aliases() -> None:
    # the driver and the executor get equal env entries: a plain dump shares them as &id/*id
    for extra in ([], ["--pod-template"]):
        proc = _render(str(APP), "--compaction-endpoint", ENDPOINT, *extra)
        assert proc.returncode == 0, proc.stderr
        events = list(yaml.parse(proc.stdout))
        assert not [e for e in events if isinstance(e, yaml.AliasEvent)], extra
        assert not [e for e in events if getattr(e, "anchor", None)], extra


def test_the_webhook_s_warnings_go_to_stderr(tmp_path: Path) -> None:
    app = yaml.safe_load(APP.read_text())
    del app["metadata"]["annotations"]["statetier.io/checkpoint-uri"]
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump(app))
    proc = _render(str(path))  # no endpoint either
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"warning: {path}: wordcount: no statetier.io/checkpoint-uri")
    assert lines[1].startswith(f"warning: {path}: wordcount: CompactionService compaction")
    (rendered,) = _docs(proc.stdout)  # the manifest itself is still written
    assert "spark.statetier.spill.dirs" in rendered["spec"]["sparkConf"]


def test_a_service_in_another_namespace_warns_that_its_token_secret_must_be_copied() -> None:
    app = yaml.safe_load(APP.read_text())
    app["metadata"]["annotations"]["statetier.io/compaction-service"] = "shared/compaction"
    proc = _render("-", "--compaction-endpoint", ENDPOINT, stdin=yaml.safe_dump(app))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (
        "warning: wordcount: CompactionService shared/compaction is in another namespace: copy "
        "its token Secret compaction-compaction-token (key token) into namespace default, where "
        "the Spark pods read it\n"
    )
    same = dict(
        app["metadata"]["annotations"], **{"statetier.io/compaction-service": "default/compaction"}
    )
    app["metadata"]["annotations"] = same
    quiet = _render("-", "--compaction-endpoint", ENDPOINT, stdin=yaml.safe_dump(app))
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_help_is_plain_words_without_internal_names() -> None:
    for args in ([], ["render-app"]):
        proc = subprocess.run(
            [sys.executable, "-m", "statetier.operator.cli", *args, "--help"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        for internal in ("``", ":class:", ":func:", "COMMANDS_GROUP", "OperatorSettings", "memo"):
            assert internal not in proc.stdout, (args, internal)

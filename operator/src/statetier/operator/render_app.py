"""statetier-operator render-app: configure SparkApplications without the mutating webhook.

Some clusters allow no mutating webhooks, and the Kubeflow Spark Operator plans to drop its own
in favour of pod templates. This command writes what the webhook would write into the
application manifests themselves, for a GitOps pipeline (kustomize, a Helm post-renderer, CI),
and prints the configured manifests on stdout. The CompactionService's endpoint is given with
--compaction-endpoint; its token Secret is the one the operator generates
(<service>-compaction-token) unless --compaction-token-secret NAME[:KEY] names the service's
own. A Secret is readable only in its own namespace: for a service in another namespace, copy
the Secret into the application's. With --pod-template the spill volume, its mount and the
opt-in pod label go into the Spark Operator's pod templates (spec.driver.template,
spec.executor.template) instead of its volumes, volumeMounts and labels fields. Either way, a
webhook that does run later finds nothing left to change for the first form. What the webhook
would warn about (no checkpoint URI, a service without an endpoint, a token Secret to copy) is
printed on stderr, one "warning:" line each.

Example: statetier-operator render-app app.yaml --compaction-endpoint http://gateway.ns.svc:8080
"""

# The configuration is :func:`statetier.operator.sparkapp.mutate`'s, the webhook's own, with
# the endpoint from the command line instead of the operator's index of CompactionServices.

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml
from statetier.operator import annotations as ann
from statetier.operator import compaction_token, sparkapp

__all__ = ["RenderError", "render", "render_stream"]

Obj = dict[str, Any]
EXECUTOR_CONTAINER = "spark-kubernetes-executor"  # Spark's default executor container name


class RenderError(ValueError):
    """An application that cannot be configured (its statetier.io annotations are invalid)."""


def _into_pod_templates(spec: Obj, settings: ann.AppSettings) -> Obj:
    """Move the volume, mount and label from the SparkPodSpec fields into the pod templates.
    The volume is the template's kind of it (:func:`sparkapp.pod_template_volume`: an
    ``ephemeral`` spill volume becomes a generic ephemeral volume, so the on-demand claim's
    options leave sparkConf)."""
    spec = copy.deepcopy(spec)
    volumes = spec.get("volumes") or []
    ours = [sparkapp.pod_template_volume(settings)]
    spec["volumes"] = [v for v in volumes if v.get("name") != sparkapp.VOLUME_NAME]
    spec["sparkConf"] = sparkapp.without_claim_options(spec.get("sparkConf") or {})
    executor, driver = spec.setdefault("executor", {}), spec.setdefault("driver", {})
    mounts = executor.get("volumeMounts") or []
    mine = [m for m in mounts if m.get("name") == sparkapp.VOLUME_NAME]
    executor["volumeMounts"] = [m for m in mounts if m.get("name") != sparkapp.VOLUME_NAME]
    for role in (driver, executor):
        template = role.setdefault("template", {})
        labels = template.setdefault("metadata", {}).setdefault("labels", {})
        labels[sparkapp.POD_LABEL] = role.get("labels", {}).pop(sparkapp.POD_LABEL, "true")
    pod = executor["template"].setdefault("spec", {})
    pod["volumes"] = [*(pod.get("volumes") or []), *ours]
    containers = pod.setdefault("containers", [{"name": EXECUTOR_CONTAINER}])
    containers[0]["volumeMounts"] = [*(containers[0].get("volumeMounts") or []), *mine]
    for field in ("volumes",):
        if not spec[field]:
            del spec[field]
    for role in (driver, executor):
        for field in ("labels", "volumeMounts"):
            if field in role and not role[field]:
                del role[field]
    return spec


def _default_token(settings: ann.AppSettings) -> tuple[str, str] | None:
    """The token Secret the operator generates for the named CompactionService (the one to
    use unless the service names its own: then pass ``--compaction-token-secret``)."""
    if not settings.compaction_service:
        return None
    service = settings.compaction_service.rpartition("/")[2]
    return service + compaction_token.SECRET_SUFFIX, compaction_token.TOKEN_KEY


def _token_elsewhere(
    app: Obj, settings: ann.AppSettings, token: tuple[str, str] | None
) -> list[str]:
    """The webhook's warning for a CompactionService in another namespace than the
    application's: its token Secret must be copied next to the Spark pods. An application
    without a namespace is compared with none: it is warned about whenever the service names
    one, since it will be created in whatever namespace kubectl is given."""
    service = settings.compaction_service or ""
    service_ns, _, _ = service.rpartition("/")
    namespace = (app.get("metadata") or {}).get("namespace")
    if token is None or not service_ns or service_ns == namespace:
        return []
    return [compaction_token.copy_warning(service, *token, namespace or "<the application's>")]


def render(
    app: Obj,
    endpoint: str | None,
    *,
    pod_template: bool = False,
    where: str = "",
    token: tuple[str, str] | None = None,
    warnings: list[str] | None = None,
) -> Obj:
    """``app`` configured for statetier (unchanged unless it opted in). ``token``: (Secret,
    key) of the CompactionService's API token, by default the operator-generated Secret.
    ``warnings`` receives what the webhook would have warned about."""
    annotations = dict((app.get("metadata") or {}).get("annotations") or {})
    if app.get("kind") != "SparkApplication" or not ann.enabled(annotations):
        return app
    problems = ann.problems(annotations)
    if problems:
        raise RenderError(f"{where}{app['metadata'].get('name', '?')}: {'; '.join(problems)}")
    settings = ann.parse(annotations)
    token = token or _default_token(settings)
    result = sparkapp.mutate(app, settings, endpoint, None, token)
    if warnings is not None:
        warnings.extend(result.warnings)
        warnings.extend(_token_elsewhere(app, settings, token if endpoint else None))
    out = copy.deepcopy(app)
    out["spec"] = {**(out.get("spec") or {}), **result.spec_changes}
    out["metadata"].setdefault("annotations", {}).update(result.annotations)
    if pod_template:
        out["spec"] = _into_pod_templates(out["spec"], settings)
    return out


def render_stream(
    source: TextIO,
    sink: TextIO,
    endpoint: str | None,
    *,
    pod_template: bool,
    where: str,
    token: tuple[str, str] | None = None,
) -> None:
    """Every document of ``source`` to ``sink``, opted-in SparkApplications configured."""
    docs = [d for d in yaml.safe_load_all(source) if d]
    rendered = []
    for doc in docs:
        warnings: list[str] = []
        rendered.append(
            render(doc, endpoint, pod_template=pod_template, where=where, token=token,
                   warnings=warnings)
        )  # fmt: skip
        name = (doc.get("metadata") or {}).get("name", "?")
        for warning in warnings:
            print(f"warning: {where}{name}: {warning}", file=sys.stderr)
    yaml.dump_all(rendered, sink, Dumper=_NoAliases, sort_keys=False)


class _NoAliases(yaml.SafeDumper):
    """A dumper that writes a repeated object out again instead of an ``&anchor``/``*alias``
    pair: the webhook's changes share objects between the driver and the executor (the same
    env var), and aliases confuse reviewers and tools that patch the YAML."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def parse_token_secret(text: str | None) -> tuple[str, str] | None:
    """``NAME`` or ``NAME:KEY`` of ``--compaction-token-secret`` (the key defaults to token)."""
    if not text:
        return None
    name, _, key = text.partition(":")
    if not name:
        raise RenderError(f"--compaction-token-secret {text!r}: expected NAME or NAME:KEY")
    return name, key or compaction_token.TOKEN_KEY


def main(
    files: list[str], endpoint: str | None, pod_template: bool, token_secret: str | None = None
) -> int:
    """The CLI: exit 2 naming the file and the annotation when an application is invalid."""
    try:
        token = parse_token_secret(token_secret)
        for name in files or ["-"]:
            options: dict[str, Any] = {"pod_template": pod_template, "token": token}
            if name == "-":
                render_stream(sys.stdin, sys.stdout, endpoint, where="", **options)
                continue
            with Path(name).open(encoding="utf-8") as handle:
                render_stream(handle, sys.stdout, endpoint, where=f"{name}: ", **options)
    except (RenderError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

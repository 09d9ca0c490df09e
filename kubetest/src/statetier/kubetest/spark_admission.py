"""The Spark Operator's admission of a SparkApplication: its defaults and what it refuses.

The Spark Operator (v2.5.2) registers two webhooks for SparkApplications. The mutating one
fills defaults (``api/v1beta2/defaults.go``): type Scala, mode cluster, restart policy Never,
one core and ``1g`` for driver and executors unless sparkConf sets them, one executor unless
dynamic allocation is on, shuffle tracking on with dynamic allocation. The validating one
(``internal/webhook/sparkapplication_validator.go`` and ``sparkconf_validator.go``) refuses a
name that is no DNS-1035 label, pod templates before Spark 3.0.0, node selectors at both the
application and a role, broken driver ingress options, and sparkConf keys the Spark Operator
manages itself. :func:`defaulted` and :func:`validate` apply the same rules, with upstream's
messages, so a test sees the refusal a cluster would give. Where upstream walks a Go map
(random order) and stops at the first problem, we walk the keys sorted.

Not modelled: the resource quota check (off unless the Spark Operator runs with
``--enable-resource-quota-enforcement``) and the rule that an update with an unchanged spec
is not validated again.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

__all__ = ["ValidationError", "compare_versions", "defaulted", "validate"]

Obj = dict[str, Any]
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_VERSION = re.compile(
    r"v(0|[1-9][0-9]*)(?:\.(0|[1-9][0-9]*)(?:\.(0|[1-9][0-9]*)"
    r"(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?)?)?"
)
_MANAGED = "authentication credentials are managed by the operator"
_IMAGE = "use the image field on the CRD instead"
_ACCOUNT = "configure the service account via the CRD spec instead"
_DENIED_KEYS = {
    "spark.kubernetes.authenticate.driver.serviceAccountName": _ACCOUNT,
    "spark.kubernetes.authenticate.executor.serviceAccountName": _ACCOUNT,
    "spark.kubernetes.authenticate.oauthTokenFile": _MANAGED,
    "spark.kubernetes.authenticate.oauthToken": _MANAGED,
    "spark.kubernetes.authenticate.driver.oauthTokenFile": _MANAGED,
    "spark.kubernetes.authenticate.driver.oauthToken": _MANAGED,
    "spark.kubernetes.authenticate.executor.oauthTokenFile": _MANAGED,
    "spark.kubernetes.authenticate.executor.oauthToken": _MANAGED,
    "spark.master": "this value is managed by the operator",
    "spark.kubernetes.driver.master": "this value is managed by the operator",
    "spark.kubernetes.container.image": _IMAGE,
    "spark.kubernetes.driver.container.image": _IMAGE,
    "spark.kubernetes.executor.container.image": _IMAGE,
}
_TRUE, _FALSE = ("1", "t", "T", "TRUE", "true", "True"), ("0", "f", "F", "FALSE", "false", "False")


class ValidationError(Exception):
    """The Spark Operator's validating webhook refused the application (upstream's message)."""


def _version_key(text: str) -> tuple[int, int, int, list[Any]] | None:
    """Go's ``golang.org/x/mod/semver`` reading of a version ("v" added as upstream adds it);
    None for an invalid one. A missing minor or patch is 0, as semver's shorthand."""
    text = text if text.startswith("v") else "v" + text
    match = _VERSION.fullmatch(text)
    if match is None:
        return None
    major, minor, patch, pre = match.groups()
    parts: list[Any] = []
    for item in (pre or "").split(".") if pre else []:
        parts.append((0, int(item), "") if item.isdigit() else (1, 0, item))
    return int(major), int(minor or 0), int(patch or 0), parts


def compare_versions(left: str, right: str) -> int:
    """-1, 0 or 1 as upstream's ``CompareSemanticVersion``: an invalid version is less than
    any valid one, and equal to another invalid one; a pre-release is less than its release."""
    a, b = _version_key(left), _version_key(right)
    if a is None or b is None:
        return (a is not None) - (b is not None)
    if a[:3] != b[:3]:
        return 1 if a[:3] > b[:3] else -1
    if a[3] == b[3]:
        return 0
    if not a[3] or not b[3]:  # the release sorts after its pre-releases
        return 1 if not a[3] else -1
    return 1 if a[3] > b[3] else -1


def _dynamic_allocation_on(conf: Obj, allocation: Obj | None) -> bool:
    """Upstream's ``isDynamicAllocationEnabled``: the spec block if any, else the sparkConf key
    it reads, which it spells in lower case (``spark.dynamicallocation.enabled``)."""
    if allocation is not None:
        return bool(allocation.get("enabled"))
    return conf.get("spark.dynamicallocation.enabled") in _TRUE


def _default_role(role: Obj, conf: Obj, name: str) -> None:
    if f"spark.{name}.cores" not in conf and role.get("cores") is None:
        role["cores"] = 1
    if f"spark.{name}.memory" not in conf and role.get("memory") is None:
        role["memory"] = "1g"


def defaulted(app: Obj) -> Obj:
    """A copy of ``app`` with the mutating webhook's defaults (``SetSparkApplicationDefaults``)."""
    app = copy.deepcopy(app)
    spec = app.setdefault("spec", {})
    spec["type"] = spec.get("type") or "Scala"
    spec["mode"] = spec.get("mode") or "cluster"
    policy = spec.setdefault("restartPolicy", {})
    policy["type"] = policy.get("type") or "Never"
    if policy["type"] != "Never":
        policy.setdefault("onFailureRetryInterval", 5)
        policy.setdefault("onSubmissionFailureRetryInterval", 5)
    conf = spec.get("sparkConf") or {}
    driver, executor = spec.setdefault("driver", {}), spec.setdefault("executor", {})
    _default_role(driver, conf, "driver")
    _default_role(executor, conf, "executor")
    allocation = spec.get("dynamicAllocation")
    dynamic = _dynamic_allocation_on(conf, allocation)
    unset = executor.get("instances") is None and not conf.get("spark.executor.instances")
    if unset and not dynamic:
        executor["instances"] = 1
    if dynamic and allocation is not None and allocation.get("shuffleTrackingEnabled") is None:
        allocation["shuffleTrackingEnabled"] = True
    return app


def _check_name(name: str) -> None:
    problems = []
    if len(name) > 63:
        problems.append("must be no more than 63 characters")
    if not _DNS1035.fullmatch(name):
        problems.append(_DNS1035_MESSAGE)
    if problems:
        raise ValidationError(
            f"invalid SparkApplication name {json.dumps(name)}: " + ", ".join(problems)
        )


def _check_ingress_options(options: list[Obj]) -> None:
    ports: set[int] = set()
    formats: set[str] = set()
    for item in options:
        port, url_format = item.get("servicePort"), item.get("ingressURLFormat") or ""
        if port is None:
            raise ValidationError("DriverIngressOptions has nill ServicePort")
        if port in ports:
            raise ValidationError(f"DriverIngressOptions has duplicate ServicePort: {port}")
        ports.add(port)
        if not url_format:
            raise ValidationError("DriverIngressOptions has empty IngressURLFormat")
        if url_format in formats:
            raise ValidationError(
                f"DriverIngressOptions has duplicate IngressURLFormat: {url_format}"
            )
        formats.add(url_format)


def _check_spark_conf(conf: Obj, namespace: str) -> None:
    for key in sorted(conf):
        reason = _DENIED_KEYS.get(key)
        if reason is None and key == "spark.kubernetes.namespace" and conf[key] != namespace:
            got = json.dumps(conf[key])
            reason = f"must equal the application namespace {json.dumps(namespace)}, got {got}"
        if reason is not None:
            raise ValidationError(f"sparkConf key {json.dumps(key)} is not allowed: {reason}")


def validate(app: Obj) -> None:
    """Raise :class:`ValidationError` where the Spark Operator's webhook refuses ``app``."""
    meta, spec = app.get("metadata") or {}, app.get("spec") or {}
    _check_name(meta.get("name") or "")
    driver, executor = spec.get("driver") or {}, spec.get("executor") or {}
    templates = driver.get("template") is not None or executor.get("template") is not None
    if templates and compare_versions(spec.get("sparkVersion") or "", "3.0.0") < 0:
        raise ValidationError("pod template feature requires Spark version 3.0.0 or higher")
    if spec.get("nodeSelector") is not None and (
        driver.get("nodeSelector") is not None or executor.get("nodeSelector") is not None
    ):
        raise ValidationError(
            "node selector cannot be defined at both SparkApplication and Driver/Executor"
        )
    _check_ingress_options(spec.get("driverIngressOptions") or [])
    _check_spark_conf(spec.get("sparkConf") or {}, meta.get("namespace") or "")

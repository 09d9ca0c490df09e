"""A double of the Kubeflow Spark Operator v2.5.2's submission path, so a test fails where a
cluster would.

Nothing else in the tests runs the Spark Operator's rules, and a SparkApplication our webhook
writes can be stored by the apiserver and still be refused when the Spark Operator submits it:
it maps ``spark-local-dir-*`` volumes to Spark conf only for emptyDir, hostPath, nfs and
persistentVolumeClaim, and fails any other kind with ``unsupported volume type``. This module
follows the rules of release v2.5.2, read from its source and rewritten here:

* :func:`validate` and the defaults: :mod:`.spark_admission`
  (``internal/webhook/sparkapplication_validator.go``, ``sparkconf_validator.go``,
  ``api/v1beta2/defaults.go``);
* :func:`submit`: ``buildSparkSubmitArgs`` and its option functions
  (``internal/controller/sparkapplication/submission.go``), with the conf keys of
  ``pkg/common/spark.go`` and the local-volume selection of ``pkg/util/sparkapplication.go``:
  the same flags in the same order, the same ``--conf`` keys and values, the same failures
  (``volume X not found``, ``unsupported volume type``), the pod template files and their conf;
* :meth:`Submission.pod`: what the pod webhook then adds to the driver or executor pod
  (:mod:`.spark_pod_webhook`, ``internal/webhook/sparkpod_defaulter.go``).

Upstream walks Go maps (sparkConf, hadoopConf, labels, annotations, envVars, envSecretKeyRefs,
nodeSelector) in random order; the double emits their ``--conf`` pairs sorted by key, which is
one of the orders upstream may produce.

Not modelled: running spark-submit and Spark itself (Spark's own checks of the conf, the pods
it creates beyond the template), the controller's web UI service and ingress and Prometheus
steps that add conf before submission, batch schedulers, the ``LoadSparkDefaults`` feature
gate (off by default), resource quota enforcement, the submission ID (a fixed one stands for
upstream's random UUID) and the Go zero values in the YAML of the template files.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from statetier.kubetest import spark_pod_webhook
from statetier.kubetest.spark_admission import (
    ValidationError,
    compare_versions,
    defaulted,
    validate,
)
from statetier.kubetest.typed import canonical_quantity

__all__ = [
    "DEFAULT_MASTER",
    "SubmissionError",
    "Submission",
    "ValidationError",
    "compare_versions",
    "defaulted",
    "driver_pod_name",
    "submit",
    "validate",
]

Obj = dict[str, Any]
DEFAULT_MASTER = "k8s://https://kubernetes.default.svc:443"
_VOLUME_KINDS = ("emptyDir", "hostPath", "nfs", "persistentVolumeClaim")
_LAUNCHED = "sparkoperator.k8s.io/launched-by-spark-operator"
_CONTAINERS = {"driver": "spark-kubernetes-driver", "executor": "spark-kubernetes-executor"}


class SubmissionError(Exception):
    """The Spark Operator could not submit the application; the message is upstream's
    (``failed to build spark-submit arguments: ...``, as the application's status shows it
    after ``failed to submit spark application: ``)."""


class _BuildError(Exception):
    """An option function's failure, before :func:`submit` wraps it as upstream does."""


@dataclass(frozen=True)
class _Request:
    app: Obj
    master: str
    submission_id: str
    template_dir: Path | None

    @property
    def spec(self) -> Obj:
        spec: Obj = self.app["spec"]
        return spec

    def role(self, name: str) -> Obj:
        return self.spec.get(name) or {}


def _conf(key: str, value: object) -> list[str]:
    return ["--conf", f"{key}={value}"]


def _go(value: object) -> str:
    """A value as Go's ``%t``/``%d``/``%s`` prints it (booleans in lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _set(value: object) -> bool:
    """A pointer field that is set and, for upstream's string checks, not empty."""
    return value is not None and value != ""


def _sorted_conf(template: str, values: Mapping[str, Any] | None) -> list[str]:
    args: list[str] = []
    for key in sorted(values or {}):
        args += _conf(template % key, _go((values or {})[key]))
    return args


# ------------------------------------------------------------------ options, upstream's order


def _master(r: _Request) -> list[str]:
    return ["--master", r.master]


def _deploy_mode(r: _Request) -> list[str]:
    return ["--deploy-mode", r.spec.get("mode") or ""]


def _main_class(r: _Request) -> list[str]:
    return [] if r.spec.get("mainClass") is None else ["--class", r.spec["mainClass"]]


def _name(r: _Request) -> list[str]:
    return ["--name", r.app["metadata"]["name"]]


def _dependencies(r: _Request) -> list[str]:
    deps, args = r.spec.get("deps") or {}, []
    for field_name, flag in (
        ("jars", "--jars"),
        ("packages", "--packages"),
        ("excludePackages", "--exclude-packages"),
        ("repositories", "--repositories"),
        ("pyFiles", "--py-files"),
        ("files", "--files"),
        ("archives", "--archives"),
    ):
        if deps.get(field_name):
            args += [flag, ",".join(deps[field_name])]
    return args


def _namespace(r: _Request) -> list[str]:
    return _conf("spark.kubernetes.namespace", r.app["metadata"].get("namespace") or "")


def _image(r: _Request) -> list[str]:
    args: list[str] = []
    if _set(r.spec.get("image")):
        args += _conf("spark.kubernetes.container.image", r.spec["image"])
    if _set(r.spec.get("imagePullPolicy")):
        args += _conf("spark.kubernetes.container.image.pullPolicy", r.spec["imagePullPolicy"])
    if r.spec.get("imagePullSecrets"):
        secrets = ",".join(r.spec["imagePullSecrets"])
        args += _conf("spark.kubernetes.container.image.pullSecrets", secrets)
    return args


def _python_version(r: _Request) -> list[str]:
    version = r.spec.get("pythonVersion")
    return _conf("spark.kubernetes.pyspark.pythonVersion", version) if _set(version) else []


def _memory_overhead_factor(r: _Request) -> list[str]:
    factor = r.spec.get("memoryOverheadFactor")
    return _conf("spark.kubernetes.memoryOverheadFactor", factor) if _set(factor) else []


def _no_waiting(_: _Request) -> list[str]:
    return _conf("spark.kubernetes.submission.waitAppCompletion", "false")


def _spark_conf(r: _Request) -> list[str]:
    conf = {
        k: v
        for k, v in (r.spec.get("sparkConf") or {}).items()
        if k != "spark.kubernetes.driver.pod.name"  # set by its own option below
    }
    return _sorted_conf("%s", conf)


def _hadoop_conf(r: _Request) -> list[str]:
    return _sorted_conf("spark.hadoop.%s", r.spec.get("hadoopConf"))


def _template_path(r: _Request, role: str) -> str:
    base = r.template_dir if r.template_dir is not None else Path("/tmp/spark")
    return str(base / r.submission_id / f"{role}-pod-template.yaml")


def _template_option(role: str) -> Callable[[_Request], list[str]]:
    def option(r: _Request) -> list[str]:
        return _conf(f"spark.kubernetes.{role}.podTemplateFile", _template_path(r, role)) + _conf(
            f"spark.kubernetes.{role}.podTemplateContainerName", _CONTAINERS[role]
        )

    return option


def driver_pod_name(app: Obj) -> str:
    """Upstream's ``GetDriverPodName``: spec.driver.podName, the sparkConf key, or <name>-driver."""
    spec = app.get("spec") or {}
    name = (spec.get("driver") or {}).get("podName")
    if name:
        return str(name)
    from_conf = (spec.get("sparkConf") or {}).get("spark.kubernetes.driver.pod.name")
    return str(from_conf) if from_conf else f"{app['metadata']['name']}-driver"


def _driver_pod_name(r: _Request) -> list[str]:
    return _conf("spark.kubernetes.driver.pod.name", driver_pod_name(r.app))


def _operator_labels(r: _Request, role: str) -> list[str]:
    """The labels by which the Spark Operator finds (and its pod webhook mutates) the pods."""
    label = f"spark.kubernetes.{role}.label.%s"
    args = _conf(label % "sparkoperator.k8s.io/app-name", r.app["metadata"]["name"])
    args += _conf(label % _LAUNCHED, "true")
    old_spark = compare_versions(r.spec.get("sparkVersion") or "", "3.0.0") < 0
    if old_spark or r.role(role).get("template") is None:
        args += _conf(label % "sparkoperator.k8s.io/mutated-by-spark-operator", "true")
    return args + _conf(label % "sparkoperator.k8s.io/submission-id", r.submission_id)


def _role_image(r: _Request, role: str) -> list[str]:
    image = r.role(role).get("image")
    image = image if _set(image) else r.spec.get("image")
    key = f"spark.kubernetes.{role}.container.image"
    return _conf(key, image) if _set(image) else []


def _app_labels(r: _Request, role: str) -> list[str]:
    """The application's own labels, but Kueue's, go to the pods."""
    labels = r.app["metadata"].get("labels") or {}
    kept = {k: v for k, v in labels.items() if not k.startswith("kueue.x-k8s.io/")}
    return _sorted_conf(f"spark.kubernetes.{role}.label.%s", kept)


def _secret_key_refs(r: _Request, role: str) -> list[str]:
    refs = r.role(role).get("envSecretKeyRefs") or {}
    values = {k: f"{v['name']}:{v['key']}" for k, v in refs.items()}
    return _sorted_conf(f"spark.kubernetes.{role}.secretKeyRef.%s", values)


def _fields(role: Obj, keys: tuple[tuple[str, str], ...]) -> list[str]:
    """``--conf key=value`` for each of the role's fields that is set, in the given order."""
    args: list[str] = []
    for field_name, key in keys:
        if role.get(field_name) is not None:
            args += _conf(key, _go(role[field_name]))
    return args


_DRIVER_FIELDS = (
    ("cores", "spark.driver.cores"),
    ("coreRequest", "spark.kubernetes.driver.request.cores"),
    ("coreLimit", "spark.kubernetes.driver.limit.cores"),
    ("memory", "spark.driver.memory"),
    ("memoryOverhead", "spark.driver.memoryOverhead"),
    ("serviceAccount", "spark.kubernetes.authenticate.driver.serviceAccountName"),
    ("javaOptions", "spark.driver.extraJavaOptions"),
    ("kubernetesMaster", "spark.kubernetes.driver.master"),
)
_EXECUTOR_FIELDS = (
    ("cores", "spark.executor.cores"),
    ("coreRequest", "spark.kubernetes.executor.request.cores"),
    ("coreLimit", "spark.kubernetes.executor.limit.cores"),
    ("memory", "spark.executor.memory"),
    ("memoryOverhead", "spark.executor.memoryOverhead"),
    ("serviceAccount", "spark.kubernetes.authenticate.executor.serviceAccountName"),
    ("deleteOnTermination", "spark.kubernetes.executor.deleteOnTermination"),
)


def _driver_conf(r: _Request) -> list[str]:
    driver = r.role("driver")
    args = _operator_labels(r, "driver") + _role_image(r, "driver")
    args += _fields(driver, _DRIVER_FIELDS) + _app_labels(r, "driver")
    args += _sorted_conf("spark.kubernetes.driver.label.%s", driver.get("labels"))
    args += _sorted_conf("spark.kubernetes.driver.annotation.%s", driver.get("annotations"))
    args += _sorted_conf("spark.kubernetes.driver.service.label.%s", driver.get("serviceLabels"))
    service_annotations = driver.get("serviceAnnotations")
    args += _sorted_conf("spark.kubernetes.driver.service.annotation.%s", service_annotations)
    return args + _secret_key_refs(r, "driver")


def _executor_conf(r: _Request) -> list[str]:
    executor = r.role("executor")
    args = _operator_labels(r, "executor")
    args += _fields(executor, (("instances", "spark.executor.instances"),))
    args += _role_image(r, "executor") + _fields(executor, _EXECUTOR_FIELDS)
    args += _app_labels(r, "executor")
    args += _sorted_conf("spark.kubernetes.executor.label.%s", executor.get("labels"))
    args += _sorted_conf("spark.kubernetes.executor.annotation.%s", executor.get("annotations"))
    args += _secret_key_refs(r, "executor")
    return args + _fields(executor, (("javaOptions", "spark.executor.extraJavaOptions"),))


def _env_option(template: str, role: str) -> Callable[[_Request], list[str]]:
    """The deprecated ``envVars`` map of a role, as Spark conf."""

    def option(r: _Request) -> list[str]:
        return _sorted_conf(template, r.role(role).get("envVars"))

    return option


_SECRET_FILES = {
    "GCPServiceAccount": ("GOOGLE_APPLICATION_CREDENTIALS", "key.json"),
    "HadoopDelegationToken": ("HADOOP_TOKEN_FILE_LOCATION", "hadoop.token"),
}


def _secret_option(role: str, env_template: str) -> Callable[[_Request], list[str]]:
    def option(r: _Request) -> list[str]:
        args: list[str] = []
        for secret in r.role(role).get("secrets") or []:
            path = secret["path"]
            args += _conf(f"spark.kubernetes.{role}.secrets.{secret['name']}", path)
            if secret.get("secretType") in _SECRET_FILES:
                env, file = _SECRET_FILES[secret["secretType"]]
                args += _conf(env_template % env, str(Path(path) / file))
        return args

    return option


def _volume_kind(volume: Obj) -> str:
    for kind in _VOLUME_KINDS:
        if volume.get(kind) is not None:
            return kind
    raise _BuildError("unsupported volume type")


def _volume_options(kind: str, volume: Obj) -> list[tuple[str, str]]:
    """The ``options.*`` of a local-dir volume, as upstream writes them for each kind."""
    source, out = volume[kind], []
    if kind == "emptyDir":
        if source.get("sizeLimit") is not None:
            out.append(("sizeLimit", canonical_quantity(source["sizeLimit"])))
        if source.get("medium"):
            out.append(("medium", source["medium"]))
    elif kind == "hostPath":
        out.append(("path", source.get("path") or ""))
        if source.get("type") is not None:
            out.append(("type", source["type"]))
    elif kind == "nfs":
        out += [("path", source.get("path") or ""), ("server", source.get("server") or "")]
        if source.get("readOnly"):
            out.append(("readOnly", "true"))
    else:
        out.append(("claimName", source.get("claimName") or ""))
        if source.get("readOnly"):
            out.append(("readOnly", "true"))
    return out


def _local_dir_conf(role: str, mount: Obj, volume: Obj) -> list[str]:
    kind, name = _volume_kind(volume), mount["name"]
    prefix = f"spark.kubernetes.{role}.volumes.{kind}.{name}"
    args: list[str] = []
    if mount.get("mountPath"):
        args += _conf(f"{prefix}.mount.path", mount["mountPath"])
    if mount.get("subPath"):
        args += _conf(f"{prefix}.mount.subPath", mount["subPath"])
    if mount.get("readOnly"):
        args += _conf(f"{prefix}.mount.readOnly", "true")
    for option, value in _volume_options(kind, volume):
        args += _conf(f"{prefix}.options.{option}", value)
    return args


def _volume_mounts_option(role: str) -> Callable[[_Request], list[str]]:
    """Spark mounts the ``spark-local-dir-*`` volumes itself, from conf; a mount of that prefix
    without its volume, or of a kind Spark cannot mount, fails the submission."""

    def option(r: _Request) -> list[str]:
        prefix = spark_pod_webhook.LOCAL_DIR_PREFIX
        volumes = {
            v["name"]: v for v in r.spec.get("volumes") or [] if v["name"].startswith(prefix)
        }
        args: list[str] = []
        for mount in r.role(role).get("volumeMounts") or []:
            if not mount["name"].startswith(prefix):
                continue
            if mount["name"] not in volumes:
                raise _BuildError(f"volume {mount['name']} not found")
            args += _local_dir_conf(role, mount, volumes[mount["name"]])
        return args

    return option


def _node_selector(r: _Request) -> list[str]:
    return _sorted_conf("spark.kubernetes.node.selector.%s", r.spec.get("nodeSelector"))


def _dynamic_allocation(r: _Request) -> list[str]:
    allocation = r.spec.get("dynamicAllocation")
    if not allocation or not allocation.get("enabled"):
        return []
    args = _conf("spark.dynamicAllocation.enabled", "true")
    args += _fields(
        allocation,
        (
            ("initialExecutors", "spark.dynamicAllocation.initialExecutors"),
            ("minExecutors", "spark.dynamicAllocation.minExecutors"),
            ("maxExecutors", "spark.dynamicAllocation.maxExecutors"),
        ),
    )
    tracking = allocation.get("shuffleTrackingEnabled")
    args += _conf(
        "spark.dynamicAllocation.shuffleTracking.enabled",
        _go(True if tracking is None else tracking),
    )
    timeout = (("shuffleTrackingTimeout", "spark.dynamicAllocation.shuffleTracking.timeout"),)
    return args + _fields(allocation, timeout)


def _proxy_user(r: _Request) -> list[str]:
    user = r.spec.get("proxyUser")
    return ["--proxy-user", str(user)] if _set(user) else []


def _main_file(r: _Request) -> list[str]:
    main = r.spec.get("mainApplicationFile")
    return [] if main is None else [str(main)]


def _arguments(r: _Request) -> list[str]:
    return list(r.spec.get("arguments") or [])


_OPTIONS: tuple[Callable[[_Request], list[str]], ...] = (
    _master,
    _deploy_mode,
    _main_class,
    _name,
    _dependencies,
    _namespace,
    _image,
    _python_version,
    _memory_overhead_factor,
    _no_waiting,
    _spark_conf,
    _hadoop_conf,
    _template_option("driver"),
    _driver_pod_name,
    _driver_conf,
    _env_option("spark.kubernetes.driverEnv.%s", "driver"),
    _secret_option("driver", "spark.kubernetes.driverEnv.%s"),
    _volume_mounts_option("driver"),
    _template_option("executor"),
    _executor_conf,
    _env_option("spark.executorEnv.%s", "executor"),
    _secret_option("executor", "spark.executorEnv.%s"),
    _volume_mounts_option("executor"),
    _node_selector,
    _dynamic_allocation,
    _proxy_user,
    _main_file,
    _arguments,
)


# ------------------------------------------------------------------ pod templates


def _owner_reference(app: Obj, *, controller: bool) -> Obj:
    meta = app["metadata"]
    ref: Obj = {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "name": meta["name"],
        "uid": meta.get("uid", ""),
    }
    return {**ref, "controller": True, "blockOwnerDeletion": True} if controller else ref


def _pod_template(app: Obj, role: str) -> Obj:
    """The template upstream writes for ``role``: the application's, or one naming only the
    Spark container; owned by the application (the executors' without ``controller``, so
    that another controller, such as Kueue, may own them)."""
    given = ((app.get("spec") or {}).get(role) or {}).get("template")
    template = copy.deepcopy(given) if given is not None else None
    if template is None:
        template = {"spec": {"containers": [{"name": _CONTAINERS[role]}]}}
    meta = template.setdefault("metadata", {})
    ref = _owner_reference(app, controller=role == "driver")
    if ref not in meta.setdefault("ownerReferences", []):
        meta["ownerReferences"].append(ref)
    return template


# ------------------------------------------------------------------ the result


def _conf_pairs(args: list[str]) -> dict[str, str]:
    """Every ``--conf k=v`` of ``args``, a later key winning as in spark-submit."""
    conf: dict[str, str] = {}
    for flag, value in itertools.pairwise(args):
        if flag == "--conf":
            key, _, val = value.partition("=")
            conf[key] = val
    return conf


@dataclass(frozen=True)
class Submission:
    """What the Spark Operator would run and write for one application.

    ``app`` is the application as the Spark Operator submits it (its defaults filled in);
    ``templates`` maps "driver" and "executor" to the pod templates written at submission.
    """

    app: Obj
    args: list[str]
    main_file: str | None
    arguments: list[str]
    templates: dict[str, Obj] = field(default_factory=dict)

    @property
    def conf(self) -> dict[str, str]:
        return _conf_pairs(self.args)

    def pod(self, role: str) -> Obj:
        """The ``role``'s pod as far as the double knows it: the template, with the labels
        that select it for the pod webhook, then mutated by the pod webhook."""
        pod = copy.deepcopy(self.templates[role])
        # Spark adds its container when the template names none.
        containers = pod.setdefault("spec", {}).setdefault("containers", [])
        if not containers:
            containers.append({"name": _CONTAINERS[role]})
        labels = pod["metadata"].setdefault("labels", {})
        labels[_LAUNCHED] = "true"
        return spark_pod_webhook.mutate_pod(pod, self.app, role)

    def container(self, role: str) -> Obj:
        """The ``role``'s Spark container after the pod webhook (env, envFrom, mounts...)."""
        return spark_pod_webhook.spark_container(self.pod(role), role)

    def executor_container(self) -> Obj:
        return self.container("executor")

    def executor_environment(
        self, secrets: Mapping[str, Mapping[str, str]] | None = None
    ) -> dict[str, str]:
        """The executor's environment variables: Spark's ``spark.executorEnv.*``, then the
        container's ``envFrom`` (``secrets`` maps a Secret's name to its data; a ConfigMap
        or a missing optional Secret adds nothing), then its ``env`` (a ``valueFrom``
        variable is left out: its source is not modelled); later names win, as in the
        kubelet. A missing Secret that is not optional raises LookupError, as the pod would
        fail to start."""
        env = {
            k.removeprefix("spark.executorEnv."): v
            for k, v in self.conf.items()
            if k.startswith("spark.executorEnv.")
        }
        container = self.executor_container()
        for source in container.get("envFrom") or []:
            env.update(_env_from(source, secrets or {}))
        for var in container.get("env") or []:
            if "value" in var or "valueFrom" not in var:
                env[var["name"]] = var.get("value", "")
        return env


def _env_from(source: Obj, secrets: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    ref = source.get("secretRef")
    if ref is None:
        return {}
    if ref["name"] not in secrets:
        if ref.get("optional"):
            return {}
        raise LookupError(f'secret "{ref["name"]}" not found')
    prefix = source.get("prefix") or ""
    return {prefix + k: v for k, v in secrets[ref["name"]].items()}


def _write_templates(templates: dict[str, Obj], r: _Request) -> None:
    for role, template in templates.items():
        path = Path(_template_path(r, role))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(template, sort_keys=True))


def submit(
    app: Obj,
    *,
    master: str = DEFAULT_MASTER,
    template_dir: Path | None = None,
    submission_id: str = "00000000-0000-0000-0000-000000000000",
) -> Submission:
    """Build the spark-submit arguments the Spark Operator v2.5.2 would run for ``app`` (the
    stored object; its admission defaults are filled in first), or raise
    :class:`SubmissionError` where upstream fails. With ``template_dir`` the pod templates are
    written under it as upstream writes them under ``/tmp/spark``; the conf names that path.
    """
    app = defaulted(app)
    request = _Request(app, master, submission_id, template_dir)
    args: list[str] = []
    try:
        for option in _OPTIONS:
            args += option(request)
    except _BuildError as exc:
        raise SubmissionError(f"failed to build spark-submit arguments: {exc}") from None
    templates = {role: _pod_template(app, role) for role in ("driver", "executor")}
    if template_dir is not None:
        _write_templates(templates, request)
    main = app["spec"].get("mainApplicationFile")
    return Submission(app, args, main, list(app["spec"].get("arguments") or []), templates)

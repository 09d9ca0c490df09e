"""The Spark Operator double against what its v2.5.2 source does (submission.go, the webhooks).

Each expectation here was read in upstream's code, not in the double: the conf keys of each
local-dir volume kind, the refusals and their messages, the order of the first arguments.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from statetier.kubetest import spark_operator as so

Obj = dict[str, Any]
LOCAL = "spark-local-dir-spill"
EXEC_VOLUMES = f"spark.kubernetes.executor.volumes.%s.{LOCAL}"


def _app(**spec: Any) -> Obj:
    base: Obj = {
        "type": "Python",
        "mode": "cluster",
        "sparkVersion": "3.5.1",
        "image": "spark:3.5.1",
        "mainApplicationFile": "local:///app.py",
        "driver": {},
        "executor": {},
    }
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": "app", "namespace": "jobs", "uid": "u-1"},
        "spec": {**base, **spec},
    }


def _with_local_dir(volume_source: Obj, **mount: Any) -> Obj:
    return _app(
        volumes=[{"name": LOCAL, **volume_source}],
        executor={"volumeMounts": [{"name": LOCAL, "mountPath": "/spill", **mount}]},
    )


def test_arguments_start_as_upstream_orders_them() -> None:
    args = so.submit(_app(mainClass="org.Main", arguments=["a", "b"])).args
    assert args[:8] == [
        "--master",
        so.DEFAULT_MASTER,
        "--deploy-mode",
        "cluster",
        "--class",
        "org.Main",
        "--name",
        "app",
    ]
    assert args[8:10] == ["--conf", "spark.kubernetes.namespace=jobs"]
    assert args[-3:] == ["local:///app.py", "a", "b"]


def test_submission_never_waits_and_names_the_driver_pod() -> None:
    conf = so.submit(_app()).conf
    assert conf["spark.kubernetes.submission.waitAppCompletion"] == "false"
    assert conf["spark.kubernetes.driver.pod.name"] == "app-driver"


@pytest.mark.parametrize(
    ("source", "options"),
    [
        ({"emptyDir": {}}, {}),
        (
            {"emptyDir": {"sizeLimit": "1024Mi", "medium": "Memory"}},
            {"sizeLimit": "1Gi", "medium": "Memory"},  # Quantity.String(): canonical
        ),
        ({"hostPath": {"path": "/mnt/ssd"}}, {"path": "/mnt/ssd"}),
        (
            {"hostPath": {"path": "/mnt/ssd", "type": "DirectoryOrCreate"}},
            {"path": "/mnt/ssd", "type": "DirectoryOrCreate"},
        ),
        (
            {"nfs": {"server": "nfs.local", "path": "/x", "readOnly": True}},
            {"path": "/x", "server": "nfs.local", "readOnly": "true"},
        ),
        (
            {"persistentVolumeClaim": {"claimName": "OnDemand"}},
            {"claimName": "OnDemand"},
        ),
    ],
)
def test_each_local_dir_kind_becomes_spark_volume_conf(
    source: Obj, options: dict[str, str]
) -> None:
    kind = next(iter(source))
    conf = so.submit(_with_local_dir(source)).conf
    prefix = EXEC_VOLUMES % kind
    found = {k.removeprefix(prefix + "."): v for k, v in conf.items() if k.startswith(prefix)}
    assert found == {"mount.path": "/spill", **{f"options.{k}": v for k, v in options.items()}}


def test_mount_sub_path_and_read_only() -> None:
    app = _with_local_dir({"emptyDir": {}}, subPath="s", readOnly=True)
    conf = so.submit(app).conf
    assert conf[(EXEC_VOLUMES % "emptyDir") + ".mount.subPath"] == "s"
    assert conf[(EXEC_VOLUMES % "emptyDir") + ".mount.readOnly"] == "true"


@pytest.mark.parametrize(
    "source",
    [
        {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
        {"configMap": {"name": "c"}},
        {"secret": {"secretName": "s"}},
    ],
)
def test_other_local_dir_kinds_fail_submission(source: Obj) -> None:
    with pytest.raises(so.SubmissionError) as caught:
        so.submit(_with_local_dir(source))
    assert str(caught.value) == "failed to build spark-submit arguments: unsupported volume type"


def test_a_local_dir_mount_without_its_volume_fails_submission() -> None:
    app = _app(executor={"volumeMounts": [{"name": LOCAL, "mountPath": "/spill"}]})
    with pytest.raises(so.SubmissionError, match=f"volume {LOCAL} not found$"):
        so.submit(app)


def test_other_volumes_are_the_pod_webhooks_not_spark_conf() -> None:
    app = _app(
        volumes=[{"name": "cfg", "configMap": {"name": "c"}}],
        executor={"volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]},
    )
    submission = so.submit(app)
    assert not [k for k in submission.conf if ".volumes." in k]
    pod = submission.pod("executor")
    assert pod["spec"]["volumes"] == [{"name": "cfg", "configMap": {"name": "c"}}]
    assert submission.executor_container()["volumeMounts"] == [{"name": "cfg", "mountPath": "/cfg"}]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("spark.master", "this value is managed by the operator"),
        ("spark.kubernetes.container.image", "use the image field on the CRD instead"),
        (
            "spark.kubernetes.authenticate.executor.serviceAccountName",
            "configure the service account via the CRD spec instead",
        ),
        (
            "spark.kubernetes.authenticate.oauthToken",
            "authentication credentials are managed by the operator",
        ),
    ],
)
def test_denied_spark_conf_keys(key: str, message: str) -> None:
    with pytest.raises(so.ValidationError) as caught:
        so.validate(_app(sparkConf={key: "x"}))
    assert str(caught.value) == f'sparkConf key "{key}" is not allowed: {message}'


def test_spark_conf_namespace_must_be_the_applications() -> None:
    so.validate(_app(sparkConf={"spark.kubernetes.namespace": "jobs"}))
    with pytest.raises(so.ValidationError, match=r'namespace "jobs", got "other"$'):
        so.validate(_app(sparkConf={"spark.kubernetes.namespace": "other"}))


def test_name_must_be_a_dns_1035_label() -> None:
    app = _app()
    app["metadata"]["name"] = "1-app"
    with pytest.raises(so.ValidationError, match=r'^invalid SparkApplication name "1-app": a DNS'):
        so.validate(app)


def test_templates_need_spark_3_and_node_selectors_one_level() -> None:
    old = _app(sparkVersion="2.4.8", executor={"template": {"spec": {}}})
    with pytest.raises(so.ValidationError, match=r"requires Spark version 3\.0\.0 or higher"):
        so.validate(old)
    both = _app(nodeSelector={"a": "b"}, driver={"nodeSelector": {"c": "d"}})
    with pytest.raises(so.ValidationError, match="node selector cannot be defined at both"):
        so.validate(both)


def test_duplicate_ingress_ports_are_refused() -> None:
    options = [{"servicePort": 80, "ingressURLFormat": "a"}, {"servicePort": 80}]
    with pytest.raises(so.ValidationError, match="duplicate ServicePort: 80"):
        so.validate(_app(driverIngressOptions=options))


def test_labels_reach_both_roles_but_kueues() -> None:
    app = _app(executor={"labels": {"team": "x"}})
    app["metadata"]["labels"] = {"env": "prod", "kueue.x-k8s.io/queue-name": "q"}
    conf = so.submit(app).conf
    assert conf["spark.kubernetes.driver.label.env"] == "prod"
    assert conf["spark.kubernetes.executor.label.env"] == "prod"
    assert conf["spark.kubernetes.executor.label.team"] == "x"
    assert not [k for k in conf if "kueue" in k]
    assert conf["spark.kubernetes.executor.label.sparkoperator.k8s.io/app-name"] == "app"
    launched = "spark.kubernetes.executor.label.sparkoperator.k8s.io/launched-by-spark-operator"
    assert conf[launched] == "true"


def test_memory_cores_and_overhead() -> None:
    app = _app(executor={"cores": 2, "memory": "4g", "memoryOverhead": "3328m", "instances": 3})
    conf = so.submit(app).conf
    assert conf["spark.executor.memoryOverhead"] == "3328m"
    assert (conf["spark.executor.cores"], conf["spark.executor.memory"]) == ("2", "4g")
    assert conf["spark.executor.instances"] == "3"
    # Defaults of the Spark Operator's mutating webhook.
    assert (conf["spark.driver.cores"], conf["spark.driver.memory"]) == ("1", "1g")


def test_env_secret_key_refs_and_env_vars() -> None:
    refs = {"TOKEN": {"name": "tok", "key": "t"}}
    app = _app(executor={"envSecretKeyRefs": refs, "envVars": {"A": "1"}})
    conf = so.submit(app).conf
    assert conf["spark.kubernetes.executor.secretKeyRef.TOKEN"] == "tok:t"
    assert conf["spark.executorEnv.A"] == "1"


def test_map_conf_is_sorted_by_key() -> None:
    args = so.submit(_app(sparkConf={"spark.b": "2", "spark.a": "1"})).args
    assert args.index("spark.a=1") < args.index("spark.b=2")


def test_pod_template_files_and_owner(tmp_path: Path) -> None:
    template = {"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "c"}]}}
    submission = so.submit(_app(executor={"template": template}), template_dir=tmp_path)
    conf = submission.conf
    path = Path(conf["spark.kubernetes.executor.podTemplateFile"])
    assert path == tmp_path / "00000000-0000-0000-0000-000000000000/executor-pod-template.yaml"
    assert conf["spark.kubernetes.executor.podTemplateContainerName"] == "spark-kubernetes-executor"
    written = yaml.safe_load(path.read_text())
    assert written == submission.templates["executor"]
    assert written["metadata"]["ownerReferences"] == [
        {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication"}
        | {"name": "app", "uid": "u-1"}
    ]
    driver = submission.templates["driver"]
    assert driver["spec"] == {"containers": [{"name": "spark-kubernetes-driver"}]}
    assert driver["metadata"]["ownerReferences"][0]["controller"] is True
    # With a template the executors are not labelled for mutation; the driver still is.
    assert (
        "spark.kubernetes.executor.label.sparkoperator.k8s.io/mutated-by-spark-operator" not in conf
    )
    assert conf["spark.kubernetes.driver.label.sparkoperator.k8s.io/mutated-by-spark-operator"]


def test_dynamic_allocation_tracks_shuffles_by_default() -> None:
    app = _app(dynamicAllocation={"enabled": True, "minExecutors": 1, "maxExecutors": 4})
    submission = so.submit(app)
    conf = submission.conf
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.dynamicAllocation.shuffleTracking.enabled"] == "true"
    assert (
        conf["spark.dynamicAllocation.minExecutors"],
        conf["spark.dynamicAllocation.maxExecutors"],
    ) == ("1", "4")
    assert "spark.executor.instances" not in conf  # not defaulted with dynamic allocation
    off = copy.deepcopy(app)
    off["spec"]["dynamicAllocation"]["shuffleTrackingEnabled"] = False
    assert so.submit(off).conf["spark.dynamicAllocation.shuffleTracking.enabled"] == "false"


def test_the_pod_webhook_appends_env_and_env_from_to_the_executor() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "sidecar"},
                {"name": "spark-kubernetes-executor", "env": [{"name": "T", "value": "t"}]},
            ]
        }
    }
    executor = {
        "template": template,
        "env": [{"name": "E", "value": "e"}],
        "envFrom": [{"secretRef": {"name": "store"}}],
        "envVars": {"V": "v"},
    }
    submission = so.submit(_app(executor=executor))
    container = submission.executor_container()
    assert container["name"] == "spark-kubernetes-executor"
    assert container["env"] == [{"name": "T", "value": "t"}, {"name": "E", "value": "e"}]
    assert container["envFrom"] == [{"secretRef": {"name": "store"}}]
    env = submission.executor_environment({"store": {"AWS_ACCESS_KEY_ID": "k"}})
    assert env == {"V": "v", "AWS_ACCESS_KEY_ID": "k", "T": "t", "E": "e"}
    with pytest.raises(LookupError, match='secret "store" not found'):
        submission.executor_environment({})


def test_spark_and_hadoop_config_maps_are_mounted_by_the_pod_webhook() -> None:
    container = so.submit(_app(sparkConfigMap="spark-cm")).executor_container()
    assert {"name": "SPARK_CONF_DIR", "value": "/etc/spark/conf"} in container["env"]
    assert container["volumeMounts"] == [
        {"name": "spark-configmap-volume", "readOnly": True, "mountPath": "/etc/spark/conf"}
    ]


@pytest.mark.parametrize(
    ("left", "right", "order"),
    [("3.5.1", "3.0.0", 1), ("2.4", "3.0.0", -1), ("3.0.0-rc1", "3.0.0", -1), ("", "3.0.0", -1)],
)
def test_versions_compare_as_go_semver(left: str, right: str, order: int) -> None:
    assert so.compare_versions(left, right) == order

"""The Helm chart renders and lints (helm-python-sdk: Helm's Go SDK, no helm binary) with the
default values and with every optional feature on; the manifests pass kubernetes-validate
--strict; values are checked against values.schema.json; the pieces agree with each other."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from cryptography import x509

from tests.packaging.packaging_support import ALL_ON, CHART, REPO, find, notes, render

VARIANTS = {"default": {}, "all-on": ALL_ON}
# Kinds of other projects' CRDs (prometheus-operator, cert-manager, ours, kopf's): not in the
# Kubernetes schemas kubernetes-validate ships; they are checked by shape below instead.
CUSTOM_KINDS = {
    "ServiceMonitor",
    "PodMonitor",
    "PrometheusRule",
    "Certificate",
    "Issuer",
    "KopfPeering",
    "ClusterKopfPeering",
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_chart_lints_clean(variant: str) -> None:
    report = helm_python.lint(str(CHART), VARIANTS[variant], strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_manifests_pass_kubernetes_validate_strict(variant: str, tmp_path: Path) -> None:
    docs = [d for d in render(VARIANTS[variant]) if d["kind"] not in CUSTOM_KINDS]
    files = []
    for i, doc in enumerate(docs):
        path = tmp_path / f"{i:02d}-{doc['kind']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        files.append(str(path))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" passed for resource ") == len(files), proc.stdout


def test_optional_features_render_only_when_enabled() -> None:
    default = {d["kind"] for d in render({})}
    every = {d["kind"] for d in render(ALL_ON)}
    optional = {
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "Certificate",
        "Issuer",
        "ConfigMap",
        "Role",
        "RoleBinding",
    }
    assert not default & optional
    assert optional <= every
    assert "Secret" in default and "Secret" not in every  # cert-manager writes it instead


def test_bad_values_are_rejected_naming_the_key() -> None:
    with helm_python.Chart.load(str(CHART)) as chart:
        chart.validate_schema({})
        chart.validate_schema(ALL_ON)
        cases: dict[str, dict[str, Any]] = {
            "/replicaCount": {"replicaCount": 0},
            "/webhooks/failurePolicy": {"webhooks": {"failurePolicy": "Sometimes"}},
            "/metrics/port": {"metrics": {"port": 70000}},
            "/image/tag": {"image": {"tag": 3}},
            "replicas": {"replicas": 2},  # a typo of replicaCount
        }
        for key, values in cases.items():
            with pytest.raises(helm_python.HelmValuesError) as error:
                chart.render(values, name="statetier", namespace="statetier")
            assert key in str(error.value), str(error.value)


def test_every_value_is_documented() -> None:
    """Each key of values.yaml has a description in the schema and is typed there."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(vals: dict[str, Any], node: dict[str, Any], path: str) -> None:
        for key, value in vals.items():
            sub = node.get("properties", {}).get(key)
            assert sub is not None, f"{path}{key} is not in values.schema.json"
            assert sub.get("description") or isinstance(value, dict), f"{path}{key}"
            if isinstance(value, dict) and "properties" in sub:
                walk(value, sub, f"{path}{key}.")

    walk(values, schema, "")


def test_operator_pod_is_hardened_and_probed() -> None:
    deployment = find(render({}), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["requests"]["memory"]
    # The probe asks the port kopf's --liveness endpoint listens on.
    args = container["args"]
    liveness = args[args.index("--liveness") + 1]
    port = next(p for p in container["ports"] if p["name"] == "healthz")["containerPort"]
    assert liveness == f"http://0.0.0.0:{port}/healthz"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    # The metrics and webhook ports are the ones the Services target.
    metrics_port = int(args[args.index("--metrics-port") + 1])
    assert {"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"} in container[
        "ports"
    ]
    assert "--no-manage-webhooks" in args


def test_generated_certificate_matches_the_webhook_configurations() -> None:
    docs = render({})
    secret = find(docs, "Secret")
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    service = find(docs, "Service", "statetier-webhook")
    assert "statetier-webhook.statetier.svc" in names.get_values_for_type(x509.DNSName)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(docs, kind)["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
            assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
    # The pod restarts when the certificate changes.
    annotations = find(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/webhook-tls"]


def test_cert_manager_variant_injects_the_ca() -> None:
    docs = render(ALL_ON)
    certificate = find(docs, "Certificate")
    assert certificate["spec"]["secretName"] == "statetier-webhook-tls"
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": "statetier-selfsigned"}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = find(docs, kind)
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            "statetier/statetier-webhook"
        )
        for hook in config["webhooks"]:
            assert "caBundle" not in hook["clientConfig"]
            if "sparkapplication" in hook["name"]:
                assert hook["namespaceSelector"] == ALL_ON["webhooks"]["namespaceSelector"]


def test_chart_crds_are_the_repository_crds() -> None:
    """charts/statetier/files/crds links to crds/: the chart installs exactly those CRDs."""
    assert (CHART / "files" / "crds").resolve() == (REPO / "crds").resolve()
    rendered = {
        d["metadata"]["name"]: d for d in render({}) if d["kind"] == "CustomResourceDefinition"
    }
    for path in sorted((REPO / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            got = rendered[crd["metadata"]["name"]]
            assert got["spec"] == crd["spec"]
            assert got["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not [d for d in render({"crds": {"install": False}}) if d["kind"].endswith("Definition")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_crds_pass_their_cel_rules(variant: str) -> None:
    """What kube-apiserver checks on ``kubectl apply`` of the rendered CRDs: every CEL rule
    compiles and holds on its node's default (the emulator refuses the CRD otherwise)."""
    from statetier.kubetest import cel_rules

    crds = [d for d in render(VARIANTS[variant]) if d["kind"] == "CustomResourceDefinition"]
    assert crds
    rules = 0
    for crd in crds:
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            assert cel_rules.check_defaults(schema) == [], crd["metadata"]["name"]
            rules += len(list(cel_rules.rules_of(schema)))
    assert rules >= 1


def test_webhook_configurations_match_the_operators_handlers() -> None:
    """The chart owns what kopf would register: same handler ids (paths) and resources."""
    from statetier.operator import webhooks

    source = Path(webhooks.__file__).read_text()
    docs = render({})
    paths = {
        hook["clientConfig"]["service"]["path"].lstrip("/")
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for hook in find(docs, kind)["webhooks"]
    }
    ids = set(__import__("re").findall(r'id="([a-z-]+)"', source))
    assert paths == ids
    # Each judges CREATE and UPDATE only: a DELETE never waits for the operator.
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(docs, kind)["webhooks"]:
            assert [r["operations"] for r in hook["rules"]] == [["CREATE", "UPDATE"]]
            assert hook["failurePolicy"] == "Fail"


def test_webhook_configurations_are_the_ones_the_operator_applies() -> None:
    """The chart renders what ``statetier-operator run`` applies itself: the same webhooks with
    the same rules, policies and matchConditions (statetier.operator.webhook_configuration);
    only how the apiserver reaches the server (a Service, not a URL) and the timeout differ."""
    from statetier.operator import webhook_configuration

    docs = render({})
    for kind in ("Mutating", "Validating"):
        ours = webhook_configuration.configuration(kind, {"url": "https://operator:9443"})
        assert find(docs, f"{kind}WebhookConfiguration")["metadata"]["name"] == "statetier"
        rendered = find(docs, f"{kind}WebhookConfiguration")["webhooks"]
        assert [h["name"] for h in rendered] == [h["name"] for h in ours["webhooks"]]
        for chart_hook, operator_hook in zip(rendered, ours["webhooks"], strict=True):
            for key in ("clientConfig", "timeoutSeconds"):
                chart_hook.pop(key)
                operator_hook.pop(key)
            assert chart_hook == operator_hook


def test_dashboards_configmaps_and_prometheus_rule() -> None:
    docs = render(ALL_ON)
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert {m["metadata"]["name"] for m in maps} == {
        f"statetier-dashboard-{p.stem}" for p in (CHART / "dashboards").glob("*.json")
    }
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((CHART / "dashboards" / name).read_text())
    rule = find(docs, "PrometheusRule")
    plain = yaml.safe_load((CHART / "rules" / "statetier-alerts.yaml").read_text())
    assert rule["spec"] == plain  # default thresholds: the promtool-tested file verbatim
    tuned = find(
        render(
            {
                "prometheusRule": {
                    "enabled": True,
                    "checkpointStaleSeconds": 7200,
                    "spillVolumeFullRatio": 0.8,
                    "queueGrowingMinutes": 30,
                }
            }
        ),
        "PrometheusRule",
    )
    exprs = {r["alert"]: r["expr"] for g in tuned["spec"]["groups"] for r in g["rules"]}
    assert "> 7200" in exprs["StatetierCheckpointsStale"]
    assert "> 0.8" in exprs["StatetierSpillVolumeNearlyFull"]
    assert "[30m]" in exprs["StatetierCompactionQueueGrowing"]
    assert "[30m]" in exprs["StatetierCheckpointsFailing"]  # its own window, unchanged
    moved = find(
        render({"prometheusRule": {"enabled": True, "runbookBaseUrl": "https://wiki.example/rb"}}),
        "PrometheusRule",
    )
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in moved["spec"]["groups"]
            for r in g["rules"]}  # fmt: skip
    assert urls["StatetierOperatorDown"] == "https://wiki.example/rb#statetieroperatordown"
    assert all(u.startswith("https://wiki.example/rb#") for u in urls.values()), urls


def anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub and most doc sites make them."""
    import re

    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in markdown.splitlines()
        if line.startswith("#")
    }


def test_every_alert_has_a_runbook_section() -> None:
    """Each alert's runbook_url is a section of docs/runbooks.md, named after the alert, and
    every section there belongs to an alert (none is left over after a rename)."""
    rules = yaml.safe_load((CHART / "rules" / "statetier-alerts.yaml").read_text())
    base = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookBaseUrl"]
    page = (REPO / "docs" / "runbooks.md").read_text()
    sections = anchors(page) - {"runbooks"}
    alerts = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            url, _, anchor = rule["annotations"]["runbook_url"].partition("#")
            assert url == base, rule["alert"]
            assert anchor == rule["alert"].lower(), rule["alert"]
            alerts[rule["alert"]] = anchor
    assert set(alerts.values()) == sections
    for alert in alerts:
        assert f"## {alert}\n" in page


def test_namespaced_install_has_peering_and_roles_per_namespace() -> None:
    docs = render({"watchNamespaces": ["a", "b"]})
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] == "KopfPeering"} == {"a", "b"}
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] == "Role"} == {"a", "b"}
    assert not [d for d in docs if d["kind"] == "ClusterKopfPeering"]
    args = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--namespace") + 1] == "a"


def test_compaction_pod_monitor_selects_the_operators_gateway_pods() -> None:
    """The PodMonitor's selector and port match the gateway pods the operator creates."""
    from statetier.operator import compaction_service

    monitor = find(render(ALL_ON), "PodMonitor", "statetier-compaction")
    service = {
        "apiVersion": "statetier.io/v1alpha1",
        "kind": "CompactionService",
        "metadata": {"name": "c", "namespace": "spark", "uid": "u", "generation": 1},
        "spec": {"image": "statetier/compaction:0.1.0"},
    }
    gateway = next(
        d
        for d in compaction_service.desired_objects(service)
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "c-gateway"
    )
    pod = gateway["spec"]["template"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
    workers = next(
        d
        for d in compaction_service.desired_objects(service)
        if d["metadata"]["name"] == "c-workers"
    )
    assert not selector.items() <= workers["spec"]["template"]["metadata"]["labels"].items()


def test_webhooks_off() -> None:
    docs = render({"webhooks": {"enabled": False}})
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"Secret", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    container = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--no-webhooks" in container["args"] and "--certfile" not in container["args"]
    assert "webhooks" not in {p["name"] for p in container["ports"]}
    assert "Webhooks:   off" in notes({"webhooks": {"enabled": False}})


def test_notes() -> None:
    text = notes({})
    assert "kubectl wait --for=condition=Ready compactionservice/" in text
    assert "all namespaces" in text


def test_plain_manifests_script(tmp_path: Path) -> None:
    """charts/render.py (make manifests): the same objects as the chart, bad values refused."""
    script = REPO / "charts" / "render.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    assert proc.stderr == ""  # no log line of Helm's Go code (the CRD link it follows)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in render({})
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("webhooks: {failurePolicy: Sometimes}\n")
    proc = subprocess.run(
        [sys.executable, str(script), "-f", str(bad)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert "/webhooks/failurePolicy" in proc.stderr
    assert " INFO " not in proc.stderr


def test_packaged_chart_carries_the_linked_crds(tmp_path: Path) -> None:
    """helm package resolves the files/crds link: the archive installs the same CRDs, and the
    promtool test cases stay out of it (.helmignore)."""
    import tarfile

    archive = helm_python.package(str(CHART), destination=str(tmp_path))
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "statetier/files/crds/compactionservice.yaml" in names
    assert not [n for n in names if "/rules/tests/" in n]
    with helm_python.Chart.load(archive) as chart:
        rendered = chart.render({}, name="statetier", namespace="statetier")
    crds = [d for d in yaml.safe_load_all(rendered["statetier/templates/crds.yaml"]) if d]
    assert {d["metadata"]["name"] for d in crds} == {
        d["metadata"]["name"] for d in render({}) if d["kind"] == "CustomResourceDefinition"
    }


def test_chart_works_as_a_subchart() -> None:
    """A parent chart passes ``global``; the values schema must not refuse it."""
    docs = render({"global": {"imageRegistry": "registry.example.com"}})
    assert find(docs, "Deployment")


def _hooks(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        hook["name"]: hook
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for hook in find(docs, kind)["webhooks"]
    }


def test_webhooks_select_the_watched_namespaces_and_the_opt_in_label() -> None:
    watched = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}
        ]
    }
    hooks = _hooks(render({"watchNamespaces": ["a", "b"]}))
    assert {h["namespaceSelector"] == watched for h in hooks.values()} == {True}
    assert not [h for h in hooks.values() if "objectSelector" in h]
    assert not [h for h in _hooks(render({})).values() if "namespaceSelector" in h]
    opt_in = {"matchLabels": {"statetier.io/enabled": "true"}}
    hooks = _hooks(render({"watchNamespaces": ["a", "b"], "webhooks": {"objectSelector": opt_in}}))
    assert hooks["mutate-sparkapplication.statetier.io"]["objectSelector"] == opt_in
    assert hooks["validate-sparkapplication.statetier.io"]["objectSelector"] == opt_in
    assert "objectSelector" not in hooks["validate-compactionservice.statetier.io"]
    # An explicit namespaceSelector wins for the SparkApplication webhooks.
    hooks = _hooks(render(ALL_ON))
    assert hooks["mutate-sparkapplication.statetier.io"]["namespaceSelector"] == {
        "matchLabels": {"statetier.io/webhooks": "enabled"}
    }
    assert hooks["validate-compactionservice.statetier.io"]["namespaceSelector"]["matchExpressions"]


def test_webhook_replicas_are_kept_up_ready_and_spread() -> None:
    docs = render({})
    pod = find(docs, "Deployment")["spec"]["template"]
    labels = pod["metadata"]["labels"]
    budget = find(docs, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["tcpSocket"]["port"] == "webhooks"
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"].items() <= labels.items()
    single = render({"replicaCount": 1})
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget"]
    no_hooks = find(render({"webhooks": {"enabled": False}}), "Deployment")
    probe = no_hooks["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"


def test_aggregated_roles_let_namespace_users_view_and_edit_compaction_services() -> None:
    roles = {
        d["metadata"]["name"]: d
        for d in render({})
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith(("-view", "-edit"))
    }
    view, edit = roles["statetier-view"], roles["statetier-edit"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert {v for r in view["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    assert "create" in {v for r in edit["rules"] for v in r["verbs"]}
    assert not [
        d
        for d in render({"rbac": {"aggregateToViewEdit": False}})
        if d["metadata"]["name"] in roles
    ]


def test_readme_values_table_is_generated_and_current() -> None:
    """The README's values table is what charts/values_table.py generates from the schema and
    values.yaml: every value has a row, with its default and description."""
    script = REPO / "charts" / "values_table.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    readme = (CHART / "README.md").read_text()
    for key in ("webhooks.objectSelector", "podDisruptionBudget.minAvailable", "global"):
        assert f"| `{key}` |" in readme
    assert "| `replicaCount` | integer | `2` |" in readme
    # The generator itself: a stale table is replaced by the current one.
    import importlib.util

    spec = importlib.util.spec_from_file_location("values_table", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stale = readme.replace(
        "| `replicaCount` | integer | `2` |", "| `replicaCount` | integer | `3` |"
    )
    assert module.rendered(stale) == readme


def test_backend_pod_monitor_selects_opted_in_drivers_and_executors() -> None:
    """The webhook labels the driver and executor pods of an opted-in application; the
    PodMonitor selects exactly those (the driver exports the checkpoint metrics)."""
    from statetier.operator import annotations as ann
    from statetier.operator import sparkapp

    monitor = next(
        d
        for d in render(ALL_ON)
        if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("-executors")
    )
    selector = monitor["spec"]["selector"]
    app = {"metadata": {"annotations": {"statetier.io/enabled": "true"}}, "spec": {}}
    result = sparkapp.mutate(app, ann.parse(app["metadata"]["annotations"]), None)
    for role in ("driver", "executor"):
        labels = {**result.spec_changes[role]["labels"], "spark-role": role}
        assert selector["matchLabels"].items() <= labels.items(), role
        (expression,) = selector["matchExpressions"]
        assert expression["key"] == "spark-role" and role in expression["values"]
    relabeled = {r["targetLabel"] for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert {"application", "spark_role"} <= relabeled


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted: dict[str, str] = selector.get("matchLabels", {})
    return wanted.items() <= labels.items()


def test_network_policies_let_exactly_the_right_pods_in() -> None:
    """The peers and targets of the NetworkPolicies are the labels the pods really carry: the
    operator's, the gateway and worker pods the operator creates, the opted-in Spark pods."""
    from statetier.operator import annotations as ann
    from statetier.operator import compaction_service, sparkapp

    docs = render(ALL_ON)
    policies = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]
        for d in docs
        if d["kind"] == "NetworkPolicy"
    }
    operator_pod = find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    operator = policies[("statetier", "statetier")]
    assert _selects(operator["podSelector"], operator_pod)
    assert {p["port"] for rule in operator["ingress"] for p in rule["ports"]} == {
        "webhooks",
        "metrics",
    }
    body = {
        "metadata": {"name": "c", "namespace": "spark-jobs", "uid": "u"},
        "spec": compaction_service.with_defaults(
            {"image": "i", "objectStorage": {"allowedPrefixes": ["s3://b/"]}}
        ),
    }
    gateway, _, workers = compaction_service.desired_objects(
        body
    )  # Deployment, Service, Deployment
    gateway_pod = gateway["spec"]["template"]["metadata"]["labels"]
    worker_pod = workers["spec"]["template"]["metadata"]["labels"]
    app = {"metadata": {"annotations": {"statetier.io/enabled": "true"}}, "spec": {}}
    mutation = sparkapp.mutate(app, ann.parse(app["metadata"]["annotations"]), None)
    spark_pod = mutation.spec_changes["executor"]["labels"]
    for namespace in ALL_ON["watchNamespaces"]:
        to_gateway = policies[(namespace, "statetier-compaction-gateway")]
        to_workers = policies[(namespace, "statetier-compaction-workers")]
        assert _selects(to_gateway["podSelector"], gateway_pod)
        assert not _selects(to_gateway["podSelector"], worker_pod)
        assert _selects(to_workers["podSelector"], worker_pod) and to_workers["ingress"] == []
        (rule,) = to_gateway["ingress"]
        peers = rule["from"]
        assert any(_selects(p.get("podSelector", {}), spark_pod) for p in peers)
        assert any(_selects(p.get("podSelector", {}), worker_pod) for p in peers)
        assert any(
            "namespaceSelector" in p and _selects(p.get("podSelector", {}), operator_pod)
            for p in peers
        )
        assert not any(p == {"podSelector": {}} for p in peers)  # not everybody
    assert not [d for d in render({}) if d["kind"] == "NetworkPolicy"]

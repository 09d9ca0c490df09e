"""Least-privilege RBAC: the chart grants exactly what the operator uses.

The operator runs with the arguments of the chart's Deployment against the API emulator, and the
integration flow drives every API path it has (see ``conftest.run_flow``). The emulator's request
log, filtered to the operator's token, is the set of (verb, group, resource, namespace) it used.
Every request must be allowed by the rendered ClusterRole/Roles (as RBAC would evaluate them),
and every granted verb must have been used: a grant nothing needs fails the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.packaging.packaging_support import FlowResult, render, run_flow

Request = tuple[str, str, str, str]


def _grants(docs: list[dict[str, Any]]) -> list[tuple[str | None, str, str, str]]:
    """(namespace or None for cluster-wide, group, resource, verb) of every bound rule."""
    bound = {
        (d["kind"], d["roleRef"]["name"], d["metadata"].get("namespace"))
        for d in docs
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
    }
    out = []
    for doc in docs:
        if doc["kind"] == "ClusterRole" and (
            "ClusterRoleBinding",
            doc["metadata"]["name"],
            None,
        ) in {(k, n, None) for k, n, _ in bound if k == "ClusterRoleBinding"}:
            scope = None
        elif (
            doc["kind"] == "Role"
            and (
                "RoleBinding",
                doc["metadata"]["name"],
                doc["metadata"]["namespace"],
            )
            in bound
        ):
            scope = doc["metadata"]["namespace"]
        else:
            continue
        for rule in doc["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.append((scope, group, resource, verb))
    return out


def _allowed(request: Request, grants: list[tuple[str | None, str, str, str]]) -> bool:
    verb, group, resource, namespace = request
    return any(
        (scope is None or (namespace and scope == namespace))
        and (g, r, v) == (group, resource, verb)
        for scope, g, r, v in grants
    )


def _check(flow: FlowResult) -> None:
    used = set(flow.requests)
    assert used, "the operator sent no request with its own token"
    grants = _grants(flow.docs)
    denied = sorted(r for r in used if not _allowed(r, grants))
    assert not denied, f"the chart's RBAC would deny these operator requests: {denied}"
    unused = sorted(
        {g for g in grants if not any(_allowed(r, [g]) for r in used)},
        key=str,
    )
    assert not unused, f"granted but never used by the operator (not least privilege): {unused}"


def test_clusterwide_rbac_is_exactly_what_the_operator_uses(clusterwide_flow: FlowResult) -> None:
    _check(clusterwide_flow)
    kinds = {d["kind"] for d in clusterwide_flow.docs}
    assert "Role" not in kinds


@pytest.mark.parametrize("namespaces", [["default"]])
def test_namespaced_rbac_is_exactly_what_the_operator_uses(
    namespaces: list[str], tmp_path: Path
) -> None:
    flow = run_flow({"watchNamespaces": namespaces}, tmp_path)
    _check(flow)
    # Nothing namespaced is granted cluster-wide in this mode.
    cluster_role = next(
        d for d in flow.docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "statetier"
    )
    resources = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    assert resources == {"customresourcedefinitions", "namespaces"}


def test_a_missing_grant_is_caught() -> None:
    """The check itself: drop one verb from the rendered role and the request is denied."""
    docs = render({})
    grants = _grants(docs)
    request: Request = ("create", "apps", "deployments", "spark")
    assert _allowed(request, grants)
    pruned = [g for g in grants if g[1:] != ("apps", "deployments", "create")]
    assert not _allowed(request, pruned)


def test_no_webhook_configuration_access_and_secrets_create_only() -> None:
    """The chart owns the webhook configurations and the certificate: the operator gets no
    access to admissionregistration objects. Of Secrets it may only create (a CompactionService's
    generated token, if absent): it never reads, lists or changes one."""
    for values in ({}, {"watchNamespaces": ["a", "b"]}):
        grants = _grants(render(values))
        assert not [g for g in grants if g[1] == "admissionregistration.k8s.io"]
        assert {g[3] for g in grants if g[2] == "secrets"} == {"create"}

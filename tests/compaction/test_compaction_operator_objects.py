"""What the operator runs is what the compaction CLI accepts: flags, token, prefixes."""

from __future__ import annotations

from typing import Any

import pytest
from statetier.compaction import cli
from statetier.operator import compaction_service


def _objects(**spec: Any) -> dict[str, Any]:
    body = {
        "metadata": {"name": "svc", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "image": "statetier/compaction:1",
            "objectStorage": {"allowedPrefixes": ["s3://bucket/ckpt"]},
            **spec,
        },
    }
    return {
        o["metadata"]["name"] + "/" + o["kind"]: o for o in compaction_service.desired_objects(body)
    }


def _container(objects: dict[str, Any], name: str) -> dict[str, Any]:
    container: dict[str, Any] = objects[name]["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize("deployment", ["svc-gateway/Deployment", "svc-workers/Deployment"])
def test_the_cli_parses_what_the_operator_passes(deployment: str) -> None:
    args = _container(_objects(), deployment)["args"]
    parsed = cli.build_parser().parse_args(args)
    assert parsed.command == args[0]
    assert parsed.allowed_prefix == ["s3://bucket/ckpt"]


def test_the_gateway_still_accepts_the_flag_older_operators_pass() -> None:
    """Operators up to 0.1.0 passed --target-queue-per-worker, which the gateway no longer
    uses (the autoscaler reads the target from the CompactionService); a gateway image newer
    than its operator must still start."""
    args = _container(_objects(), "svc-gateway/Deployment")["args"]
    assert "--target-queue-per-worker" not in args
    parsed = cli.build_parser().parse_args([*args, "--target-queue-per-worker", "4"])
    assert parsed.command == "gateway" and parsed.allowed_prefix == ["s3://bucket/ckpt"]


def test_the_token_secret_reaches_gateway_and_workers() -> None:
    objects = _objects(tokenSecretRef={"name": "compaction-token"})
    for name in ("svc-gateway/Deployment", "svc-workers/Deployment"):
        env = {e["name"]: e for e in _container(objects, name)["env"]}
        ref = env["STATETIER_COMPACTION_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "compaction-token", "key": "token"}
    plain = _objects()  # no tokenSecretRef: the Secret the operator generates
    for name in ("svc-gateway/Deployment", "svc-workers/Deployment"):
        env = {e["name"]: e for e in _container(plain, name)["env"]}
        ref = env["STATETIER_COMPACTION_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "svc-compaction-token", "key": "token"}

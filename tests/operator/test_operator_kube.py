"""The operator's API client takes its credentials the way the official client does.

In a pod it reads the service account's token file and keeps re-reading it as the kubelet
rotates it (bound tokens expire after an hour); the old hand-written client copied the token
once. Outside a cluster it uses the kubeconfig (every integration test does).
"""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest
from kubernetes_asyncio.config import incluster_config, kube_config
from statetier.operator import kube


def test_in_cluster_credentials_follow_a_rotated_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("first")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    # Where the kubelet mounts them in a pod, and how soon the library re-reads the file.
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setattr(incluster_config, "TOKEN_REFRESH_PERIOD", datetime.timedelta(0))

    configuration = asyncio.run(kube._configuration())
    assert configuration.host == "https://10.0.0.1:443"
    assert configuration.ssl_ca_cert == str(ca)
    assert configuration.api_key["BearerToken"] == "Bearer first"
    token.write_text("second")  # the kubelet rotates the projected token
    # What the client asks its configuration before every request:
    assert asyncio.run(configuration.get_api_key_with_prefix("BearerToken")) == "Bearer second"


def test_outside_a_cluster_the_kubeconfig_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = tmp_path / "kubeconfig"
    config.write_text(
        '{"apiVersion": "v1", "kind": "Config", "current-context": "c",'
        ' "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],'
        ' "users": [{"name": "u", "user": {"token": "t0k"}}],'
        ' "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}'
    )
    # The library reads $KUBECONFIG once, at import; a process started with it set (the
    # operator's) sees it there.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))
    configuration = asyncio.run(kube._configuration())
    assert configuration.host == "http://127.0.0.1:1"
    assert configuration.api_key["BearerToken"] == "Bearer t0k"

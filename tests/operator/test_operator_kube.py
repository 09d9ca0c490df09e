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
from aiohttp import web
from kubernetes_asyncio import client as k8s
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


def test_reads_answer_none_for_an_absent_object_and_name_what_failed() -> None:
    """A read of something absent (404) is None; any other error is an ApiError that says
    what was read. The answers come from a small HTTP server, as an apiserver would send them."""

    async def answer(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == "absent":
            return web.json_response({"kind": "Status", "message": "not found"}, status=404)
        if name == "broken":
            return web.json_response({"kind": "Status", "message": "etcd is down"}, status=500)
        body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}}
        return web.json_response(body)

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/{path:.*}/{name}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}")
        api = kube.Kube(k8s.ApiClient(configuration))
        try:
            assert await api.read_service("ns", "absent") is None
            assert await api.read_deployment("ns", "absent") is None
            assert await api.read_compaction_service("ns", "absent") is None
            found = await api.read_compaction_service("ns", "there")
            assert found is not None and found["metadata"]["name"] == "there"
            with pytest.raises(kube.ApiError, match="HTTP 500: GET service ns/broken: etcd"):
                await api.read_service("ns", "broken")
            with pytest.raises(kube.ApiError, match="GET compactionservice ns/broken: etcd"):
                await api.read_compaction_service("ns", "broken")
        finally:
            await api.close()
            await runner.cleanup()

    asyncio.run(scenario())

"""The API emulator fixes the kmock gaps kopf and kubectl depend on (see DESIGN.md)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from statetier.kubetest.processes import Sandbox

CRDS = Path(__file__).resolve().parents[2] / "crds"
CM = "/api/v1/namespaces/default/configmaps"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(tmp_path_factory.mktemp("emu"), operator=False) as box:
        yield box


def _request(
    box: Sandbox, method: str, path: str, body: Any = None, ctype: str = "application/json"
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        box.url + path, method=method, data=data, headers={"Content-Type": ctype}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def _cm(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, **meta},
        "data": {"k": "v"},
    }


def test_create_is_201_with_server_fields_and_namespace(emulator: Sandbox) -> None:
    code, obj = _request(emulator, "POST", CM, _cm("created"))
    assert code == 201
    meta = obj["metadata"]
    assert meta["namespace"] == "default"
    assert int(meta["resourceVersion"]) > 0
    assert meta["uid"] and meta["creationTimestamp"]
    code, again = _request(emulator, "POST", CM, _cm("created"))
    assert code == 409 and again["reason"] == "AlreadyExists"


def test_generate_name(emulator: Sandbox) -> None:
    code, obj = _request(emulator, "POST", CM, {"metadata": {"generateName": "gen-"}})
    assert code == 201
    assert obj["metadata"]["name"].startswith("gen-") and len(obj["metadata"]["name"]) > 4


def test_a_generated_name_already_taken_is_drawn_again() -> None:
    """As kube-apiserver does since 1.31: kopf names every Event kopf-event-<suffix>, and a
    suffix drawn twice in a long suite was a 409 AlreadyExists in the operator's log."""
    from statetier.kubetest.emulator import ApiError, generated_name

    suffixes = iter("bbbbbbbbbbccccc")  # the first draw collides
    taken = {"kopf-event-bbbbb"}
    name = generated_name("kopf-event-", taken.__contains__, lambda _: next(suffixes))
    assert name == "kopf-event-ccccc"
    with pytest.raises(ApiError) as refused:  # every attempt taken: the apiserver's 409
        generated_name("x-", lambda _: True)
    assert refused.value.code == 409


def test_many_generated_names_are_all_created(emulator: Sandbox) -> None:
    names = set()
    for _ in range(200):
        code, obj = _request(emulator, "POST", CM, {"metadata": {"generateName": "many-"}})
        assert code == 201, obj
        names.add(obj["metadata"]["name"])
    assert len(names) == 200


def test_missing_namespace_is_404(emulator: Sandbox) -> None:
    code, obj = _request(emulator, "POST", "/api/v1/namespaces/nowhere/configmaps", _cm("x"))
    assert code == 404 and "nowhere" in obj["message"]


def test_namespaces_and_core_discovery(emulator: Sandbox) -> None:
    code, namespaces = _request(emulator, "GET", "/api/v1/namespaces")
    assert code == 200
    assert namespaces["kind"] == "NamespaceList" and namespaces["apiVersion"] == "v1"
    assert {"default", "kube-system"} <= {n["metadata"]["name"] for n in namespaces["items"]}
    assert _request(emulator, "GET", "/api/v1/namespaces/default")[1]["kind"] == "Namespace"
    _, core = _request(emulator, "GET", "/api/v1")
    assert core["groupVersion"] == "v1"
    pods = next(r for r in core["resources"] if r["name"] == "pods")
    assert pods["namespaced"] is True and pods["kind"] == "Pod"


def test_list_has_kind_and_resource_version(emulator: Sandbox) -> None:
    _request(emulator, "POST", CM, _cm("listed"))
    _, listing = _request(emulator, "GET", CM)
    assert listing["kind"] == "ConfigMapList" and listing["apiVersion"] == "v1"
    assert int(listing["metadata"]["resourceVersion"]) >= max(
        int(i["metadata"]["resourceVersion"]) for i in listing["items"]
    )


def test_failed_json_patch_test_is_422_and_changes_nothing(emulator: Sandbox) -> None:
    _, obj = _request(emulator, "POST", CM, _cm("patched"))
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
        {"op": "replace", "path": "/data/k", "value": "changed"},
    ]
    code, status = _request(emulator, "PATCH", f"{CM}/patched", ops, "application/json-patch+json")
    assert code == 422 and status["kind"] == "Status"
    ops[0]["value"] = obj["metadata"]["resourceVersion"]
    code, new = _request(emulator, "PATCH", f"{CM}/patched", ops, "application/json-patch+json")
    assert code == 200 and new["data"]["k"] == "changed"
    assert int(new["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])


def test_watch_resumes_from_resource_version(emulator: Sandbox) -> None:
    _, before = _request(emulator, "POST", CM, _cm("w-before"))
    since = before["metadata"]["resourceVersion"]
    _request(emulator, "POST", CM, _cm("w-after"))
    _request(emulator, "DELETE", f"{CM}/w-after")
    url = f"{emulator.url}{CM}?watch=true&resourceVersion={since}&timeoutSeconds=1"
    with urllib.request.urlopen(url, timeout=5) as resp:
        events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in events]
    assert seen == [("ADDED", "w-after"), ("DELETED", "w-after")]


def test_finalizers_and_garbage_collection(emulator: Sandbox) -> None:
    _, owner = _request(emulator, "POST", CM, _cm("owner", finalizers=["test/keep"]))
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    _request(emulator, "POST", CM, _cm("dependent", ownerReferences=[ref]))
    code, marked = _request(emulator, "DELETE", f"{CM}/owner")
    assert code == 200 and marked["metadata"]["deletionTimestamp"]
    assert _request(emulator, "GET", f"{CM}/dependent")[0] == 200
    _request(
        emulator,
        "PATCH",
        f"{CM}/owner",
        {"metadata": {"finalizers": None}},
        "application/merge-patch+json",
    )
    assert _request(emulator, "GET", f"{CM}/owner")[0] == 404
    # The garbage collector acts in the background, as on a real cluster: not in the request.
    assert _request(emulator, "GET", f"{CM}/dependent")[0] == 200
    emulator.wait(
        "the dependent collected", lambda: _request(emulator, "GET", f"{CM}/dependent")[0] == 404
    )


def test_crd_serves_its_resource_with_scale_and_defaults(emulator: Sandbox) -> None:
    emulator.kubectl("apply", "-f", str(CRDS / "compactionservice.yaml"))
    path = "/apis/statetier.io/v1alpha1/namespaces/default/compactionservices"
    body = {
        "apiVersion": "statetier.io/v1alpha1",
        "kind": "CompactionService",
        "metadata": {"name": "scaled"},
        "spec": {"image": "i", "objectStorage": {"allowedPrefixes": ["s3://b/"]}},
    }
    code, obj = _request(emulator, "POST", path, body)
    assert code == 201
    assert obj["spec"]["workers"] == {
        "min": 1,
        "max": 4,
        "targetQueuePerWorker": 4,
        "concurrency": 1,
    }
    code, scale = _request(
        emulator,
        "PATCH",
        f"{path}/scaled/scale",
        {"spec": {"replicas": 3}},
        "application/merge-patch+json",
    )
    assert code == 200 and scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    _, obj2 = _request(emulator, "GET", f"{path}/scaled")
    assert obj2["spec"]["workers"]["replicas"] == 3
    assert obj2["metadata"]["generation"] == obj["metadata"]["generation"] + 1
    # Status goes through the status subresource only.
    _request(
        emulator,
        "PATCH",
        f"{path}/scaled",
        {"status": {"endpoint": "nope"}},
        "application/merge-patch+json",
    )
    assert "status" not in _request(emulator, "GET", f"{path}/scaled")[1]
    _request(
        emulator,
        "PATCH",
        f"{path}/scaled/status",
        {"status": {"endpoint": "yes"}},
        "application/merge-patch+json",
    )
    assert _request(emulator, "GET", f"{path}/scaled")[1]["status"]["endpoint"] == "yes"


def test_kubectl_apply_configure_and_delete(emulator: Sandbox, tmp_path: Path) -> None:
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(json.dumps(_cm("applied")))
    assert "created" in emulator.kubectl("apply", "-f", str(manifest))
    manifest.write_text(json.dumps({**_cm("applied"), "data": {"k": "v2"}}))
    assert "configured" in emulator.kubectl("apply", "-f", str(manifest))
    assert emulator.kubectl("get", "configmap", "applied", "-o", "jsonpath={.data.k}") == "v2"
    emulator.kubectl("delete", "-f", str(manifest))
    assert _request(emulator, "GET", f"{CM}/applied")[0] == 404


def test_in_process_emulator_keeps_kmock_reactions_and_request_log() -> None:
    """Used in-process, the emulator is still a kmock handler: reactions answer non-resource
    paths and every request is logged (iterating a kmock handler yields its requests)."""
    import asyncio

    import aiohttp
    from statetier.kubetest.emulator import serve

    async def scenario() -> list[Any]:
        async with serve() as (emulator, url):
            emulator["get /openapi/v2"] << {"swagger": "2.0"}
            seen: list[Any] = []
            async with aiohttp.ClientSession() as session:
                for path in ("/openapi/v2", "/no/such/path", "/api/v1/namespaces"):
                    async with session.get(url + path) as resp:
                        seen.append((resp.status, await resp.json()))
            seen.append([request.url.path for request in emulator])
            return seen

    declared, missing, namespaces, logged = asyncio.run(scenario())
    assert declared == (200, {"swagger": "2.0"})
    assert missing[0] == 404 and missing[1]["kind"] == "Status"
    assert namespaces[0] == 200 and namespaces[1]["kind"] == "NamespaceList"
    assert logged == ["/openapi/v2", "/no/such/path", "/api/v1/namespaces"]


def test_leaving_the_emulator_drops_its_waiting_background_work() -> None:
    """A Deployment written just before the emulator stops leaves its controller's step waiting
    (CONTROLLER_DELAY): leaving ``serve`` cancels it, so no task is left pending on the closed
    loop (asyncio would report each one destroyed at exit)."""
    import asyncio

    import aiohttp
    from statetier.kubetest.emulator import serve

    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "waiting", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "waiting"}},
            "template": {
                "metadata": {"labels": {"app": "waiting"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }

    async def scenario() -> tuple[int, list[bool]]:
        async with serve() as (emulator, url):
            async with aiohttp.ClientSession() as session:
                path = "/apis/apps/v1/namespaces/default/deployments"
                async with session.post(url + path, json=deployment) as resp:
                    status = resp.status
            waiting = list(emulator._tasks)
            assert waiting and not any(task.done() for task in waiting)
        # checked before asyncio.run ends, which would cancel whatever is left itself
        return status, [task.cancelled() for task in waiting]

    status, cancelled = asyncio.run(scenario())
    assert status == 201
    assert cancelled and all(cancelled)

"""The operator's own Kubernetes API client: the official asyncio client, for what kopf does not do.

kopf watches and patches the resources it handles; the operator also applies Deployments,
Services and its two webhook configurations (server-side apply, field manager
``statetier-operator``, forced, as a controller owns what it creates), creates a
CompactionService's token Secret once (create only: it never reads or rewrites Secrets),
patches CompactionServices and their status, posts the Events kopf cannot (from admission
handlers), and reads objects. It does so through
``kubernetes_asyncio``, the generated asyncio twin of the official ``kubernetes`` client, which
runs on kopf's event loop: typed API groups, the same in-cluster and kubeconfig credentials kopf
logs in with, and the service account's token re-read from its file as the kubelet rotates it
(no copy of a token that expires). Objects stay plain dicts here (the operator computes them as
dicts and the apiserver speaks JSON); every write names the field manager, so
``metadata.managedFields`` says ``statetier-operator``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from statetier.operator.compaction_service import GROUP, PLURAL, VERSION

__all__ = ["FIELD_MANAGER", "ApiError", "Kube", "connect", "of"]

Obj = dict[str, Any]

FIELD_MANAGER = "statetier-operator"
_APPLY = "application/apply-patch+yaml"
_MERGE = "application/merge-patch+json"


class ApiError(RuntimeError):
    """The apiserver answered an error; ``code`` is the HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"HTTP {code}: {message}")
        self.code = code


def _error(exc: ApiException, what: str) -> ApiError:
    try:
        message = json.loads(exc.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        message = str(exc.body or exc.reason)[:500]
    return ApiError(int(exc.status or 0), f"{what}: {message or exc.reason}")


async def _configuration() -> k8s.Configuration:
    """In-cluster credentials (the token re-read as it rotates), else the kubeconfig."""
    configuration = k8s.Configuration()
    try:
        # Untyped upstream; it installs a hook that re-reads the rotated token file.
        load: Callable[..., None] = cast(Callable[..., None], k8s_config.load_incluster_config)
        load(client_configuration=configuration)
    except k8s_config.ConfigException:
        await k8s_config.load_kube_config(client_configuration=configuration)
    return configuration


async def connect() -> Kube:
    """A client with its own connection pool; the operator's startup handler makes one and puts
    it in kopf's memo (:func:`of`), its cleanup handler closes it."""
    api = k8s.ApiClient(await _configuration())
    api.user_agent = f"{FIELD_MANAGER}/0.1.0"
    return Kube(api)


def of(memo: Any) -> Kube:
    """The operator's client in kopf's memo (``memo.kube``, set by the startup handler)."""
    found = memo.get("kube")
    if not isinstance(found, Kube):
        raise RuntimeError("no Kubernetes client in kopf's memo: the startup handler did not run")
    return found


class Kube:
    """Reads, server-side applies and patches of the objects the operator deals with."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._api = api
        self._apps = k8s.AppsV1Api(api)
        self._batch = k8s.BatchV1Api(api)
        self._core = k8s.CoreV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self._admission = k8s.AdmissionregistrationV1Api(api)

    def _plain(self, obj: Any) -> Obj:
        result: Obj = self._api.sanitize_for_serialization(obj)
        return result

    async def _get(self, read: Awaitable[Any], what: str) -> Obj | None:
        """The object a read call returns, as a plain dict, or None if there is none (404)."""
        try:
            return self._plain(await read)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _error(exc, f"GET {what}") from None

    async def read_deployment(self, namespace: str, name: str) -> Obj | None:
        read = self._apps.read_namespaced_deployment(name, namespace)
        return await self._get(read, f"deployment {namespace}/{name}")

    async def read_service(self, namespace: str, name: str) -> Obj | None:
        read = self._core.read_namespaced_service(name, namespace)
        return await self._get(read, f"service {namespace}/{name}")

    async def read_compaction_service(self, namespace: str, name: str) -> Obj | None:
        read = self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return await self._get(read, f"compactionservice {namespace}/{name}")

    async def read(self, obj: Obj) -> Obj | None:
        """The stored version of a Deployment or Service like ``obj``, or None."""
        meta = obj["metadata"]
        if obj["kind"] == "Deployment":
            return await self.read_deployment(meta["namespace"], meta["name"])
        return await self.read_service(meta["namespace"], meta["name"])

    def _applier(self, kind: str) -> tuple[Callable[..., Awaitable[tuple[Any, int, Any]]], bool]:
        """The generated client's patch call for ``kind`` (with HTTP info) and whether the
        kind is namespaced."""
        namespaced = {
            "Deployment": self._apps.patch_namespaced_deployment_with_http_info,
            "Service": self._core.patch_namespaced_service_with_http_info,
        }
        cluster = {
            "MutatingWebhookConfiguration": (
                self._admission.patch_mutating_webhook_configuration_with_http_info
            ),
            "ValidatingWebhookConfiguration": (
                self._admission.patch_validating_webhook_configuration_with_http_info
            ),
        }
        if kind in namespaced:
            return namespaced[kind], True
        return cluster[kind], False

    async def apply(self, obj: Obj) -> tuple[bool, Obj]:
        """Server-side apply of a Deployment, a Service or one of the operator's webhook
        configurations, forcing ownership of the fields it sets (the operator owns what it
        creates and the webhooks it serves, whoever wrote them before); (created?, the stored
        object)."""
        meta = obj["metadata"]
        patch, namespaced = self._applier(obj["kind"])
        where = (meta["namespace"],) if namespaced else ()
        # _content_type is a runtime option of the generated client its stubs do not list.
        options: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force": True}
        options["_content_type"] = _APPLY
        try:
            data, status, _ = await patch(meta["name"], *where, obj, **options)
        except ApiException as exc:
            name = "/".join([*where, meta["name"]])
            raise _error(exc, f"apply {obj['kind']} {name}") from None
        return status == 201, self._plain(data)

    async def post_event(self, involved: Obj, kind: str, reason: str, message: str) -> None:
        """A core/v1 Event of type ``kind`` (Normal, Warning) about the stored object
        ``involved``, as kopf posts them, for where kopf's own poster is not set up (admission)."""
        meta = involved["metadata"]
        now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._core.create_namespaced_event(meta["namespace"], cast(k8s.CoreV1Event, body))
        except ApiException as exc:
            raise _error(exc, f"create event for {meta['namespace']}/{meta['name']}") from None

    async def create_if_absent(self, obj: Obj) -> bool:
        """Create a Secret unless one of that name exists (HTTP 409): whether it was created.
        An existing Secret is kept as it is, so a generated token is never replaced."""
        meta = obj["metadata"]
        try:
            # A plain dict body: the generated client serialises it as it is.
            body = cast(k8s.V1Secret, obj)
            await self._core.create_namespaced_secret(
                meta["namespace"], body, field_manager=FIELD_MANAGER
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise _error(exc, f"create secret {meta['namespace']}/{meta['name']}") from None
        return True

    async def patch_compaction_service(
        self, namespace: str, name: str, patch: Obj, *, status: bool = False
    ) -> Obj:
        """Merge-patch a CompactionService (or its status subresource)."""
        method: Callable[..., Awaitable[Obj]] = (
            self._custom.patch_namespaced_custom_object_status
            if status
            else self._custom.patch_namespaced_custom_object
        )
        options: dict[str, Any] = {"field_manager": FIELD_MANAGER, "_content_type": _MERGE}
        try:
            result = await method(GROUP, VERSION, namespace, PLURAL, name, patch, **options)
        except ApiException as exc:
            raise _error(exc, f"PATCH compactionservice {namespace}/{name}") from None
        return result

    # -------------------------------------------------- StateSnapshots, their Jobs and Pods

    async def read_custom(
        self, resource: tuple[str, str, str], namespace: str, name: str
    ) -> Obj | None:
        """A custom object (``resource`` is (group, version, plural)), or None."""
        read = self._custom.get_namespaced_custom_object(
            *resource[:2], namespace, resource[2], name
        )
        return await self._get(read, f"{resource[2]} {namespace}/{name}")

    async def list_custom(
        self, resource: tuple[str, str, str], namespace: str, selector: str = ""
    ) -> list[Obj]:
        """The custom objects of a namespace matching a label selector."""
        group, version, plural = resource
        try:
            found = await self._custom.list_namespaced_custom_object(
                group, version, namespace, plural, label_selector=selector
            )
        except ApiException as exc:
            raise _error(exc, f"LIST {plural} in {namespace}") from None
        return list(found.get("items") or [])

    async def create(self, resource: tuple[str, str, str], obj: Obj) -> bool:
        """Create a custom object, or a Job (``("batch", "v1", "jobs")``), unless one of that
        name exists (HTTP 409): whether it was created. Creating the same name twice is how a
        retried handler stays idempotent."""
        meta = obj["metadata"]
        group, version, plural = resource
        try:
            if resource == ("batch", "v1", "jobs"):
                await self._batch.create_namespaced_job(
                    meta["namespace"], cast(k8s.V1Job, obj), field_manager=FIELD_MANAGER
                )
            else:
                await self._custom.create_namespaced_custom_object(
                    group, version, meta["namespace"], plural, obj, field_manager=FIELD_MANAGER
                )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise _error(exc, f"create {plural} {meta['namespace']}/{meta['name']}") from None
        return True

    async def patch_custom(
        self,
        resource: tuple[str, str, str],
        namespace: str,
        name: str,
        patch: Obj,
        *,
        status: bool = False,
    ) -> Obj | None:
        """Merge-patch a custom object or its status; None if it is gone."""
        group, version, plural = resource
        method: Callable[..., Awaitable[Obj]] = (
            self._custom.patch_namespaced_custom_object_status
            if status
            else self._custom.patch_namespaced_custom_object
        )
        options: dict[str, Any] = {"field_manager": FIELD_MANAGER, "_content_type": _MERGE}
        try:
            return await method(group, version, namespace, plural, name, patch, **options)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _error(exc, f"PATCH {plural} {namespace}/{name}") from None

    async def delete_custom(
        self, resource: tuple[str, str, str], namespace: str, name: str
    ) -> None:
        """Delete a custom object (gone already is fine)."""
        group, version, plural = resource
        try:
            await self._custom.delete_namespaced_custom_object(
                group, version, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise _error(exc, f"DELETE {plural} {namespace}/{name}") from None

    async def read_job(self, namespace: str, name: str) -> Obj | None:
        read = self._batch.read_namespaced_job(name, namespace)
        return await self._get(read, f"job {namespace}/{name}")

    async def job_pods(self, namespace: str, job: str) -> list[Obj]:
        """The Pods of a Job (by the job-name label the Job controller puts on them)."""
        try:
            found = await self._core.list_namespaced_pod(
                namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
            )
        except ApiException as exc:
            raise _error(exc, f"LIST pods of job {namespace}/{job}") from None
        return list(self._plain(found).get("items") or [])

    async def close(self) -> None:
        await self._api.close()

"""A Kubernetes API emulator good enough for a real ``kopf run`` and a real ``kubectl``.

It subclasses kmock's :class:`kmock.KubernetesEmulator` (pinned to 0.8) and keeps kmock's HTTP
server (bound to 127.0.0.1), request log (``emulator.requests``), error format, and its reaction
DSL for non-resource paths. kmock's own object store merges dicts and misses what kopf and
kubectl rely on, and its path parser fails on ``/api/v1/namespaces``, so this subclass parses
paths and answers every resource request itself, fixing these gaps:

* ``metadata.resourceVersion`` (one global counter), ``uid``, ``creationTimestamp``,
  ``generation`` (bumped on spec changes only) and ``namespace`` filled in on every object;
* ``201 Created`` on create, ``409`` on a duplicate, ``generateName``, a missing namespace is 404;
* discovery with the core group version spelled ``v1`` (not ``/v1``), real ``kind``,
  ``namespaced`` and ``verbs``, ``GET /api/v1/namespaces`` and friends routed correctly;
* lists with ``kind: <Kind>List``, ``apiVersion`` and the current ``resourceVersion``;
* watches that resume from ``?resourceVersion`` (the event log is kept), honour
  ``timeoutSeconds`` and ``sendInitialEvents`` (with the closing bookmark);
* merge, JSON (``test`` failing -> 422, as kopf's optimistic concurrency expects) and strategic
  merge patches; ``PUT`` with a stale ``resourceVersion`` -> 409;
* ``status`` and ``scale`` subresources as the CRD (or built-in kind) declares them;
* CRDs applied through the API become served resources; a CRD of a ``*.k8s.io`` group needs
  the ``api-approved.kubernetes.io`` annotation, and every CEL rule must compile and hold on its
  node's ``default`` (:mod:`.cel_rules`), else the CRD is refused as kube-apiserver refuses it;
* custom resources: unknown fields pruned (refused under ``?fieldValidation=Strict``, which
  kubectl sends after reading ``/openapi/v3``, see :mod:`.openapi`), schema defaults applied,
  the OpenAPI schema enforced (:mod:`.schema_check`), CEL rules evaluated, all after mutating
  and before validating admission, as the apiserver orders it;
* built-in objects get the apiserver's defaults (:mod:`.defaults`: strategy, probe timings,
  cluster IP, ...) and come back from the typed round trip (:mod:`.typed`): quantities
  canonical, empty lists gone;
* server-side apply and ``metadata.managedFields`` (:mod:`.apply`), the field manager named by
  ``?fieldManager`` or the User-Agent;
* finalizers, ``deletionTimestamp``, and garbage collection of dependents by
  ``ownerReferences``, in the background a moment after the owner goes (``GC_DELAY``), and of
  an object written with owners that are already all gone;
* the Deployment controller's status (:mod:`.controllers`), written ``CONTROLLER_DELAY`` after
  every change of a Deployment, long before any Pod is ready;
* the Job controller of Kubernetes 1.31 and a kubelet for Jobs only (:mod:`.jobs`): a Job's
  container runs as a real local process with its environment, and the Pod and Job statuses
  follow from its exit;
* ``kubectl get`` tables with the CRD's printer columns (Name and Age for built-ins);
* mutating and validating admission webhooks registered through ``*WebhookConfiguration``
  objects are called over HTTPS with the configured ``caBundle`` (DELETE included, and updates
  of an object being deleted), as the apiserver would, when their rules, selectors and CEL
  ``matchConditions`` (:mod:`.match_conditions`) send the request; a configuration whose
  condition does not compile is refused.

What it does not do: Pods and the kubelet beyond Jobs (a Deployment's Pods are never ready
unless a test reports them ready through the status subresource), authentication, RBAC, OpenAPI
``format`` checks, protobuf.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import datetime
import functools
import json
import re
import secrets
import signal
import ssl
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import rendering  # noqa: PLC2701 (Request type of RawHandler._handle)
from statetier.kubetest import apply as ssa
from statetier.kubetest import (
    cel_rules,
    controllers,
    defaults,
    jobs,
    match_conditions,
    openapi,
    pruning,
    schema_check,
    typed,
)
from statetier.kubetest.patching import (
    PatchError,
    PatchTestFailedError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)

__all__ = ["ApiEmulator", "ResourceDef", "ScaleSpec", "serve"]

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ScaleSpec:
    """Where the scale subresource reads and writes replicas (JSON paths as in a CRD)."""

    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    label_selector_path: str | None = None


@dataclasses.dataclass(frozen=True)
class ResourceDef:
    """One served resource, as discovery describes it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    status: bool = False
    scale: ScaleSpec | None = None
    schema: Obj | None = None  # openAPIV3Schema, for defaults
    columns: tuple[Obj, ...] = ()  # additionalPrinterColumns, for kubectl get

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()


_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]

BUILTINS: tuple[ResourceDef, ...] = (
    ResourceDef("", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",)),
    ResourceDef("", "v1", "pods", "Pod", short_names=("po",), status=True),
    ResourceDef("", "v1", "services", "Service", short_names=("svc",), status=True),
    ResourceDef("", "v1", "events", "Event", short_names=("ev",)),
    ResourceDef("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    ResourceDef("", "v1", "secrets", "Secret"),
    ResourceDef("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    ResourceDef(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        short_names=("deploy",),
        status=True,
        scale=ScaleSpec(label_selector_path=".spec.selector"),
    ),
    ResourceDef(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        status=True,
    ),
    ResourceDef("batch", "v1", "jobs", "Job", status=True),
    ResourceDef("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceDef("events.k8s.io", "v1", "events", "Event", short_names=("ev",)),
    ResourceDef(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
    ),
    ResourceDef(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        namespaced=False,
    ),
)


class ApiError(Exception):
    """An error answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def response(self) -> aiohttp.web.Response:
        return aiohttp.web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": self.message,
                "reason": self.reason,
                "code": self.code,
            },
            status=self.code,
        )


# How long the control plane takes to act on a change: the Deployment controller's status
# and the garbage collector's deletion of dependents arrive after the write, never with it.
CONTROLLER_DELAY = 0.05
GC_DELAY = 0.3
_APPLY = "application/apply-patch+yaml"
_PROTECTED_GROUP = re.compile(r"(^|\.)(k8s\.io|kubernetes\.io)$")


@dataclasses.dataclass(frozen=True)
class _Write:
    """Who writes and how: the field manager, strict field validation, a forced apply."""

    manager: str
    strict: bool = False
    force: bool = False


# kube-apiserver's generated names: 5 characters of an alphabet without vowels or look-alikes
# (14.3M suffixes), a suffix already taken drawn again (RetryGenerateName, on since 1.31).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_NAME_ATTEMPTS = 8


def generated_name(
    prefix: str, taken: Callable[[str], bool], draw: Callable[[str], str] = secrets.choice
) -> str:
    """A name for ``generateName: prefix`` that ``taken`` says is free. A suffix drawn once and
    never again could collide (kopf names every Event it posts ``kopf-event-...``), and the
    loser's 409 AlreadyExists would land in the operator's log, which a real apiserver spares."""
    for _ in range(_NAME_ATTEMPTS):
        name = prefix[:58] + "".join(draw(_NAME_ALPHABET) for _ in range(5))
        if not taken(name):
            return name
    raise ApiError(409, "AlreadyExists", f"no free name for generateName {prefix!r}")


def _check_crd(crd: Obj) -> None:
    """What the apiserver checks of a CRD that the emulator can: the approval annotation of
    protected groups, and CEL rules that do not compile or fail on their node's default."""
    meta, spec = crd.get("metadata") or {}, crd.get("spec") or {}
    problems = []
    if _PROTECTED_GROUP.search(spec.get("group", "")) and not (
        (meta.get("annotations") or {}).get("api-approved.kubernetes.io")
    ):
        problems.append(
            "metadata.annotations[api-approved.kubernetes.io]: Required value: protected "
            'groups must have approval annotation "api-approved.kubernetes.io", see '
            "https://github.com/kubernetes/enhancements/pull/1111"
        )
    for version in spec.get("versions") or []:
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        problems += [str(v) for v in cel_rules.check_defaults(schema)]
    if problems:
        raise ApiError(
            422,
            "Invalid",
            f'CustomResourceDefinition.apiextensions.k8s.io "{meta.get("name", "")}" is '
            f"invalid: {', '.join(problems)}",
        )


def _check_webhook_configuration(rdef: ResourceDef, config: Obj) -> None:
    """Every matchCondition compiles (and has a unique name), as the apiserver checks on
    write; the refusal names the webhook and the condition."""
    problems = match_conditions.problems(config)
    if problems:
        name = (config.get("metadata") or {}).get("name", "")
        raise ApiError(
            422,
            "Invalid",
            f'{rdef.kind}.admissionregistration.k8s.io "{name}" is invalid: {", ".join(problems)}',
        )


@dataclasses.dataclass
class _Path:
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None


def _parse_path(path: str) -> _Path | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace: str | None = None
    if (
        rest[0] == "namespaces"
        and len(rest) >= 3
        and not (group == "" and len(rest) == 3 and rest[2] in ("status", "finalize"))
    ):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = "/".join(rest[2:]) or None
    return _Path(group, version, plural, namespace, name, sub)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _get_path(obj: Any, dotted: str) -> Any:
    node = obj
    for part in dotted.strip(".").split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _set_path(obj: Obj, dotted: str, value: Any) -> None:
    parts = dotted.strip(".").split(".")
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _apply_defaults(value: Any, schema: Obj | None) -> Any:
    """Structural-schema defaulting, as the apiserver does for custom resources."""
    if not schema or not isinstance(value, dict):
        if isinstance(value, list) and schema and isinstance(schema.get("items"), dict):
            return [_apply_defaults(item, schema["items"]) for item in value]
        return value
    for name, sub in (schema.get("properties") or {}).items():
        if name not in value and "default" in sub:
            value[name] = copy.deepcopy(sub["default"])
        if name in value:
            value[name] = _apply_defaults(value[name], sub)
    return value


def _json_path(obj: Any, path: str) -> Any:
    """The JSONPath subset printer columns use: ``.a.b`` and ``.a[?(@.k=="v")].b``."""
    node = obj
    for step in re.findall(r'\.([^.\[]+)|\[\?\(@\.(\w+)=="([^"]*)"\)\]', path):
        field, key, value = step
        if field:
            node = node.get(field) if isinstance(node, dict) else None
        else:
            node = next(
                (i for i in node or [] if isinstance(i, dict) and str(i.get(key)) == value), None
            )
        if node is None:
            return None
    return node


def _age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = int((datetime.datetime.now(datetime.UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _table(rdef: ResourceDef, items: list[Obj], resource_version: str) -> Obj:
    """A meta.k8s.io/v1 Table, as ``kubectl get`` asks for: printer columns or Name/Age."""
    columns = rdef.columns or (
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    )
    definitions = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "priority": 0,
            "description": "Name of the object",
        }
    ]
    definitions += [
        {
            "name": c["name"],
            "type": c.get("type", "string"),
            "format": "",
            "priority": c.get("priority", 0),
            "description": c.get("description", ""),
        }
        for c in columns
    ]
    rows = []
    for item in items:
        cells: list[Any] = [item["metadata"]["name"]]
        for column in columns:
            value = _json_path(item, column["jsonPath"])
            cells.append(_age(value) if column.get("type") == "date" else value)
        rows.append(
            {
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": item["metadata"],
                },
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }


def _selector_matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, val = term.split("!=", 1)
            if labels.get(key.strip()) == val.strip():
                return False
        elif "=" in term:
            key, val = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != val.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _label_selector_matches(labels: dict[str, str], selector: Obj | None) -> bool:
    """A metav1.LabelSelector (matchLabels and matchExpressions); empty selects everything."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and key in labels and labels[key] in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def _field_matches(obj: Obj, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        key, val = term.replace("!=", "=").replace("==", "=").split("=", 1)
        actual = _get_path(obj, key.strip())
        if (str(actual) == val.strip()) == negate:
            return False
    return True


@attrs.define(kw_only=True)
class ApiEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with a resource-versioned store; see the module docstring."""

    _defs: dict[tuple[str, str, str], ResourceDef] = attrs.field(factory=dict, init=False)
    _store: dict[tuple[str, str], dict[tuple[str, str], Obj]] = attrs.field(
        factory=dict, init=False
    )
    _log: list[tuple[int, tuple[str, str], str, Obj]] = attrs.field(factory=list, init=False)
    _rv: int = attrs.field(default=1, init=False)
    _changed: asyncio.Condition | None = attrs.field(default=None, init=False)
    _tasks: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)
    _job_pending: set[tuple[str, str]] = attrs.field(factory=set, init=False)
    job_workdir: Path | None = None
    """Where the Job double (:mod:`.jobs`) keeps each Pod's output and termination message."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rdef in BUILTINS:
            self.register(rdef)
        for ns in ("default", "kube-system"):
            self._insert(
                ("", "namespaces"),
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns},
                },
            )

    # ------------------------------------------------------------------ public helpers

    def register(self, rdef: ResourceDef) -> None:
        """Serve a resource (built-ins at start; CRDs when they are created)."""
        self._defs[(rdef.group, rdef.version, rdef.plural)] = rdef
        self._store.setdefault((rdef.group, rdef.plural), {})

    def read_object(self, group: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        """The stored object, for tests (a deep copy), or None."""
        obj = self._store.get((group, plural), {}).get((namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, group: str, plural: str, namespace: str | None = None) -> list[Obj]:
        """Stored objects of a resource, for tests (deep copies)."""
        return [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(self._store.get((group, plural), {}).items())
            if namespace is None or ns == namespace
        ]

    @property
    def resource_version(self) -> int:
        return self._rv

    # ------------------------------------------------------------------ dispatch

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Entry point: kmock's own path parser fails on ``/api/v1/namespaces``, so skip it."""
        body = await raw_request.read()
        request = rendering.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            body=body,
            text=body.decode("utf-8", "replace"),
        )
        self._requests.append(request)
        return await self._handle(request)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if self._changed is None:
            self._changed = asyncio.Condition()
        raw = request._raw_request
        assert raw is not None  # always set when served over HTTP
        try:
            return await self._dispatch(request, raw)
        except ApiError as exc:
            return exc.response()

    async def _dispatch(
        self, request: rendering.Request, raw: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        path = raw.path.rstrip("/") or "/"
        method = raw.method.upper()
        if method == "GET":
            discovery = self._discovery(path)
            if discovery is not None:
                return aiohttp.web.json_response(discovery)
        if method == "GET" and path.startswith("/openapi/v3"):
            return self._openapi(path)
        parsed = _parse_path(path)
        if parsed is None:
            # Not a resource path: kmock's own reactions answer it (a test may declare e.g.
            # ``emulator["get /openapi/v2"] << {...}``); kmock's fallback is a 404 Status.
            try:
                return await super()._handle(request)
            except Exception as exc:
                return await self._render_error(exc)
        rdef = self._defs.get((parsed.group, parsed.version, parsed.plural))
        if rdef is None:
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource "
                f"({parsed.group or 'core'}/{parsed.version} {parsed.plural})",
            )
        query = dict(raw.query)
        if method == "GET" and query.get("watch") in ("true", "1"):
            return await self._watch(raw, rdef, parsed, query)
        as_table = "as=Table" in raw.headers.get("Accept", "")
        if method == "GET" and parsed.name is None:
            listing = self._list(rdef, parsed, query)
            if as_table:
                return aiohttp.web.json_response(_table(rdef, listing["items"], str(self._rv)))
            return aiohttp.web.json_response(listing)
        if method == "GET":
            obj = self._read(rdef, parsed)
            if as_table and parsed.subresource is None:
                return aiohttp.web.json_response(_table(rdef, [obj], str(self._rv)))
            return aiohttp.web.json_response(obj)
        body = self._body(request)
        write = _Write(
            manager=ssa.manager_name(query, raw.headers.get("User-Agent", "")),
            strict=query.get("fieldValidation") == "Strict",
            force=query.get("force", "").lower() in ("true", "1"),
        )
        async with self._lock:
            if method == "POST" and parsed.name is None:
                obj = await self._create(rdef, parsed, body, write)
                return aiohttp.web.json_response(obj, status=201)
            ctype = raw.headers.get("Content-Type", "application/json").split(";")[0]
            if method == "PATCH" and ctype == _APPLY and parsed.subresource is None:
                return await self._apply(rdef, parsed, body, write, query)
            if method in ("PUT", "PATCH") and parsed.name is not None:
                obj = await self._update(rdef, parsed, body, method, ctype, write)
                return aiohttp.web.json_response(obj)
            if method == "DELETE" and parsed.name is not None:
                current = self._find(rdef, parsed)
                # Webhooks registered for DELETE are asked too (the object is the old one).
                await self._admit(rdef, current, current, "DELETE", mutating=True)
                await self._admit(rdef, current, current, "DELETE", mutating=False)
                obj = self._delete(rdef, parsed)
                return aiohttp.web.json_response(obj)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    @staticmethod
    def _body(request: rendering.Request) -> Any:
        if not request.body:
            return None
        if "protobuf" in request.headers.get("Content-Type", ""):
            raise ApiError(
                415, "UnsupportedMediaType", "the emulator speaks JSON only, not protobuf"
            )
        try:
            if request.headers.get("Content-Type", "").startswith(_APPLY):
                return yaml.safe_load(request.body)
            return json.loads(request.body)
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from None

    # ------------------------------------------------------------------ discovery

    def _discovery(self, path: str) -> Obj | None:
        groups: dict[str, list[str]] = {}
        for group, version, _ in self._defs:
            if group and version not in groups.setdefault(group, []):
                groups[group].append(version)
        if path == "/version":
            return {
                "major": "1",
                "minor": "33",
                "gitVersion": "v1.33.0-statetier-emulator",
                "platform": "linux/amd64",
            }
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}
                ],
            }
        if path == "/apis":
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [self._group_doc(g, vs) for g, vs in sorted(groups.items())],
            }
        parts = [p for p in path.split("/") if p]
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                **self._group_doc(parts[1], groups[parts[1]]),
            }
        if len(parts) == 2 and parts[0] == "api" and parts[1] == "v1":
            return self._resource_list("", "v1")
        if len(parts) == 3 and parts[0] == "apis" and parts[2] in groups.get(parts[1], []):
            return self._resource_list(parts[1], parts[2])
        if path == "/":
            return {"paths": ["/api", "/api/v1", "/apis", "/version"]}
        return None

    def _openapi(self, path: str) -> aiohttp.web.Response:
        """``/openapi/v3`` and its group-version documents (see :mod:`.openapi`)."""
        rest = path.removeprefix("/openapi/v3").strip("/")
        if not rest:
            return aiohttp.web.json_response(openapi.root_doc(self._defs.values()))
        parts = rest.split("/")
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        doc = openapi.group_version_doc(self._defs.values(), group, version)
        if doc is None:
            raise ApiError(404, "NotFound", f"no OpenAPI document for {rest}")
        return aiohttp.web.json_response(doc)

    @staticmethod
    def _group_doc(group: str, versions: list[str]) -> Obj:
        docs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": docs, "preferredVersion": docs[0]}

    def _resource_list(self, group: str, version: str) -> Obj:
        resources: list[Obj] = []
        for (g, v, _), rdef in sorted(self._defs.items()):
            if (g, v) != (group, version):
                continue
            resources.append(
                {
                    "name": rdef.plural,
                    "singularName": rdef.singular,
                    "kind": rdef.kind,
                    "namespaced": rdef.namespaced,
                    "verbs": _VERBS,
                    "shortNames": list(rdef.short_names),
                }
            )
            if rdef.status:
                resources.append(
                    {
                        "name": f"{rdef.plural}/status",
                        "singularName": "",
                        "kind": rdef.kind,
                        "namespaced": rdef.namespaced,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if rdef.scale:
                resources.append(
                    {
                        "name": f"{rdef.plural}/scale",
                        "singularName": "",
                        "kind": "Scale",
                        "group": "autoscaling",
                        "version": "v1",
                        "namespaced": rdef.namespaced,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    # ------------------------------------------------------------------ reads

    def _bucket(self, rdef: ResourceDef) -> dict[tuple[str, str], Obj]:
        return self._store.setdefault((rdef.group, rdef.plural), {})

    def _find(self, rdef: ResourceDef, parsed: _Path) -> Obj:
        assert parsed.name is not None
        ns = (parsed.namespace or "") if rdef.namespaced else ""
        obj = self._bucket(rdef).get((ns, parsed.name))
        if obj is None:
            raise ApiError(
                404, "NotFound", f'{rdef.plural}.{rdef.group or "core"} "{parsed.name}" not found'
            )
        return obj

    def _read(self, rdef: ResourceDef, parsed: _Path) -> Obj:
        obj = self._find(rdef, parsed)
        if parsed.subresource == "scale" and rdef.scale:
            return self._scale_doc(rdef, obj)
        if parsed.subresource not in (None, "status"):
            raise ApiError(404, "NotFound", f"no subresource {parsed.subresource!r}")
        return obj

    def _matches(self, rdef: ResourceDef, obj: Obj, parsed: _Path, query: dict[str, str]) -> bool:
        meta = obj["metadata"]
        if rdef.namespaced and parsed.namespace and meta.get("namespace") != parsed.namespace:
            return False
        if parsed.name and meta.get("name") != parsed.name:
            return False
        if query.get("labelSelector") and not _selector_matches(
            meta.get("labels") or {}, query["labelSelector"]
        ):
            return False
        return not (query.get("fieldSelector") and not _field_matches(obj, query["fieldSelector"]))

    def _list(self, rdef: ResourceDef, parsed: _Path, query: dict[str, str]) -> Obj:
        items = [
            obj
            for _, obj in sorted(self._bucket(rdef).items())
            if self._matches(rdef, obj, parsed, query)
        ]
        return {
            "kind": f"{rdef.kind}List",
            "apiVersion": rdef.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    async def _watch(
        self,
        raw: aiohttp.web.BaseRequest,
        rdef: ResourceDef,
        parsed: _Path,
        query: dict[str, str],
    ) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        key = (rdef.group, rdef.plural)
        since = query.get("resourceVersion", "")
        timeout = float(query.get("timeoutSeconds") or 0) or None
        assert self._changed is not None
        with contextlib.suppress(
            asyncio.TimeoutError, ConnectionResetError, asyncio.CancelledError
        ):
            async with asyncio.timeout(timeout):
                async with self._lock:
                    if since in ("", "0") or query.get("sendInitialEvents") == "true":
                        position = len(self._log)
                        pending = [
                            {"type": "ADDED", "object": obj}
                            for _, obj in sorted(self._bucket(rdef).items())
                            if self._matches(rdef, obj, parsed, query)
                        ]
                        if query.get("sendInitialEvents") == "true":
                            pending.append(self._bookmark(rdef))
                    else:
                        position = next(
                            (i for i, entry in enumerate(self._log) if entry[0] > int(since)),
                            len(self._log),
                        )
                        pending = []
                for event in pending:
                    await response.write(json.dumps(event).encode() + b"\n")
                while True:
                    async with self._changed:
                        await self._changed.wait_for(functools.partial(self._newer, position))
                        entries = self._log[position:]
                        position = len(self._log)
                    for _, entry_key, kind, obj in entries:
                        if entry_key == key and self._matches(rdef, obj, parsed, query):
                            event = {"type": kind, "object": obj}
                            await response.write(json.dumps(event).encode() + b"\n")
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response

    def _newer(self, position: int) -> bool:
        return len(self._log) > position

    def _bookmark(self, rdef: ResourceDef) -> Obj:
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": rdef.kind,
                "apiVersion": rdef.api_version,
                "metadata": {
                    "resourceVersion": str(self._rv),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            },
        }

    # ------------------------------------------------------------------ writes

    def _record(self, key: tuple[str, str], kind: str, obj: Obj) -> None:
        self._log.append((self._rv, key, kind, copy.deepcopy(obj)))
        if self._changed is not None:
            changed = self._changed

            async def notify() -> None:
                async with changed:
                    changed.notify_all()

            asyncio.get_event_loop().create_task(notify())

    def _bump(self, obj: Obj) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def _insert(self, key: tuple[str, str], obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        if key == ("", "namespaces"):  # the apiserver labels every namespace with its name
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta.setdefault("generation", 1)
        self._bump(obj)
        self._store[key][(meta.get("namespace", ""), meta["name"])] = obj
        self._record(key, "ADDED", obj)
        return obj

    async def _create(
        self, rdef: ResourceDef, parsed: _Path, body: Any, write: _Write, applied: bool = False
    ) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        obj["apiVersion"], obj["kind"] = rdef.api_version, rdef.kind
        for server_field in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
            meta.pop(server_field, None)
        meta.pop("managedFields", None)
        if not meta.get("name") and meta.get("generateName"):
            ns = parsed.namespace or meta.get("namespace") or "default"
            where = ns if rdef.namespaced else ""
            meta["name"] = generated_name(
                meta["generateName"], lambda name: (where, name) in self._bucket(rdef)
            )
        if not meta.get("name"):
            raise ApiError(
                422, "Invalid", "metadata.name: Required value: name or generateName is required"
            )
        if rdef.kind == "Job":  # the Job strategy's selector and labels name the uid
            meta["uid"] = str(uuid.uuid4())
        if rdef.namespaced:
            ns = parsed.namespace or meta.get("namespace") or "default"
            if meta.get("namespace") and meta["namespace"] != ns:
                raise ApiError(
                    400, "BadRequest", "the namespace of the object does not match the URL"
                )
            if ("", ns) not in self._store[("", "namespaces")]:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        key = (meta.get("namespace", ""), meta["name"])
        if key in self._bucket(rdef):
            raise ApiError(
                409,
                "AlreadyExists",
                f'{rdef.plural}.{rdef.group or "core"} "{meta["name"]}" already exists',
            )
        if rdef.status and rdef.group not in ("", "apps", "apiextensions.k8s.io"):
            obj.pop("status", None)
        if rdef.plural == "customresourcedefinitions":
            _check_crd(obj)
        if rdef.group == "admissionregistration.k8s.io":
            _check_webhook_configuration(rdef, obj)
        config = copy.deepcopy(obj)
        obj = await self._admitted(rdef, obj, None, "CREATE", write)
        if applied:  # the applier owns what it applied, not what defaulting added
            owned = ssa.apply(None, config, write.manager, force=True)
            obj.setdefault("metadata", {})["managedFields"] = owned["metadata"]["managedFields"]
        else:
            obj = ssa.record_update(None, obj, write.manager, None)
        if rdef.plural == "customresourcedefinitions":
            self._establish(obj)
        created = self._insert((rdef.group, rdef.plural), obj)
        self._after_write(rdef, created)
        return created

    async def _apply(
        self, rdef: ResourceDef, parsed: _Path, body: Any, write: _Write, query: dict[str, str]
    ) -> aiohttp.web.Response:
        """Server-side apply: create the object if absent, else merge it (see :mod:`.apply`)."""
        if not query.get("fieldManager"):
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                "is required for apply patch",
            )
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the applied configuration must be an object")
        assert parsed.name is not None
        ns = (parsed.namespace or "") if rdef.namespaced else ""
        if (ns, parsed.name) not in self._bucket(rdef):
            config = copy.deepcopy(body)
            config.setdefault("metadata", {})["name"] = parsed.name
            obj = await self._create(rdef, parsed, config, write, applied=True)
            return aiohttp.web.json_response(obj, status=201)
        obj = await self._update(rdef, parsed, body, "PATCH", _APPLY, write)
        return aiohttp.web.json_response(obj)

    async def _update(
        self, rdef: ResourceDef, parsed: _Path, body: Any, method: str, ctype: str, write: _Write
    ) -> Obj:
        current = self._find(rdef, parsed)
        sub = parsed.subresource
        if sub not in (None, "status", "scale") or (sub == "scale" and not rdef.scale):
            raise ApiError(404, "NotFound", f"no subresource {sub!r}")
        new = self._patched(rdef, current, sub, body, method, ctype, write)
        # Identity and server-owned fields are not the client's to change.
        meta = new.setdefault("metadata", {})
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
            if fixed in current["metadata"]:
                meta[fixed] = current["metadata"][fixed]
            else:
                meta.pop(fixed, None)
        meta["generation"] = current["metadata"].get("generation", 1)
        new["apiVersion"], new["kind"] = rdef.api_version, rdef.kind
        if rdef.plural == "customresourcedefinitions":
            _check_crd(new)
        if rdef.group == "admissionregistration.k8s.io":
            _check_webhook_configuration(rdef, new)
        if sub is None:  # an object being deleted too: the apiserver admits its updates
            new = await self._admitted(rdef, new, current, "UPDATE", write)
        else:
            new = self._structural(rdef, new, write, current)
            self._check_rules(rdef, new, current)
        spec_fields = {k: v for k, v in new.items() if k not in ("metadata", "status")}
        old_fields = {k: v for k, v in current.items() if k not in ("metadata", "status")}
        if spec_fields != old_fields:
            new["metadata"]["generation"] = meta["generation"] + 1
        if ctype != _APPLY or sub is not None:
            sub_name = "status" if sub == "status" else ("scale" if sub == "scale" else None)
            new = ssa.record_update(current, new, write.manager, sub_name)
        if rdef.plural == "customresourcedefinitions":
            self._establish(new)
        comparable = copy.deepcopy(new)
        comparable["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if comparable == current:
            return self._scale_doc(rdef, current) if sub == "scale" else current  # a no-op
        self._bump(new)
        key = (rdef.group, rdef.plural)
        meta = new["metadata"]
        self._store[key][(meta.get("namespace", ""), meta["name"])] = new
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(rdef, new)
        else:
            self._record(key, "MODIFIED", new)
            self._after_write(rdef, new)
        return self._scale_doc(rdef, new) if sub == "scale" else new

    # ------------------------------------------------------------------ what a write passes

    async def _admitted(
        self, rdef: ResourceDef, obj: Obj, old: Obj | None, operation: str, write: _Write
    ) -> Obj:
        """The apiserver's order: mutating webhooks, schema (pruning, defaults, typed round
        trip, CEL rules), then validating webhooks."""
        obj = await self._admit(rdef, obj, old, operation, mutating=True)
        obj = self._structural(rdef, obj, write, old)
        self._check_rules(rdef, obj, old)
        return await self._admit(rdef, obj, old, operation, mutating=False)

    def _structural(self, rdef: ResourceDef, obj: Obj, write: _Write, old: Obj | None) -> Obj:
        """Unknown fields pruned (refused if Strict), defaults applied, the OpenAPI schema
        checked, built-ins round-tripped."""
        if rdef.schema is not None:
            dropped = pruning.prune(obj, rdef.schema)
            if dropped and write.strict:
                fields = ", ".join(f'unknown field "{d.lstrip(".")}"' for d in dropped)
                raise ApiError(
                    400,
                    "BadRequest",
                    f'{rdef.kind} in version "{rdef.version}" cannot be handled as a '
                    f"{rdef.kind}: strict decoding error: {fields}",
                )
            _apply_defaults(obj, rdef.schema)
            broken = schema_check.problems(rdef.schema, obj)
            if broken:
                raise ApiError(422, "Invalid", self._invalid(rdef, obj, ", ".join(broken)))
        if rdef.kind == "Job":
            policy = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
                "restartPolicy"
            )
            if policy not in ("OnFailure", "Never"):
                detail = (
                    f'spec.template.spec.restartPolicy: Unsupported value: "{policy or ""}": '
                    'supported values: "OnFailure", "Never"'
                )
                raise ApiError(422, "Invalid", self._invalid(rdef, obj, detail))
        if rdef.group in ("", "apps", "batch"):
            defaults.apply_builtin_defaults(obj)
            try:
                obj = typed.round_trip(obj)
            except typed.QuantityError as exc:
                raise ApiError(422, "Invalid", self._invalid(rdef, obj, str(exc))) from None
        return obj

    def _check_rules(self, rdef: ResourceDef, obj: Obj, old: Obj | None) -> None:
        """The CRD's x-kubernetes-validations (CEL) against the defaulted object."""
        if rdef.schema is None:
            return
        violations = cel_rules.check_object(rdef.schema, obj, old)
        if violations:
            raise ApiError(
                422, "Invalid", self._invalid(rdef, obj, ", ".join(map(str, violations)))
            )

    @staticmethod
    def _invalid(rdef: ResourceDef, obj: Obj, detail: str) -> str:
        name = (obj.get("metadata") or {}).get("name", "")
        return f'{rdef.kind}.{rdef.group or "core"} "{name}" is invalid: {detail}'

    # ------------------------------------------------------------------ background work

    async def __aexit__(self, *exc_info: Any) -> None:
        """Leaving the outermost ``async with`` (kmock's ``active`` turns false) drops the
        background work still waiting (a controller's or the garbage collector's next step), as
        a control plane that shuts down does: left pending on a loop that closes, asyncio
        reports each task destroyed."""
        try:
            await super().__aexit__(*exc_info)
        finally:
            if not self.active:
                pending = [task for task in self._tasks if not task.done()]
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    def _later(self, delay: float, work: Any) -> None:
        """Run ``work()`` after ``delay`` seconds, under the lock, as a background task."""

        async def run() -> None:
            await asyncio.sleep(delay)
            async with self._lock:
                work()

        task = asyncio.get_event_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _after_write(self, rdef: ResourceDef, obj: Obj) -> None:
        """Wake the Deployment controller, as a real control plane would within a second, and
        the garbage collector for an object whose owners are all gone already (a controller
        that acted on a stale copy of a deleted owner: the collector removes what it made)."""
        meta = obj["metadata"]
        if (rdef.group, rdef.plural) == ("apps", "deployments"):
            key = (meta.get("namespace", ""), meta["name"])
            self._later(CONTROLLER_DELAY, functools.partial(self._sync_deployment, rdef, key))
        if (rdef.group, rdef.plural) == ("batch", "jobs"):
            key = (meta.get("namespace", ""), meta["name"])
            self._later(CONTROLLER_DELAY, functools.partial(self._sync_job, key))
        owners = [ref.get("uid") for ref in meta.get("ownerReferences") or []]
        if owners and not any(self._uid_exists(uid) for uid in owners):
            for uid in owners:
                self._later(GC_DELAY, functools.partial(self._collect_garbage, uid))

    def _uid_exists(self, uid: str | None) -> bool:
        return any(
            obj["metadata"].get("uid") == uid
            for objects in self._store.values()
            for obj in objects.values()
        )

    def _sync_deployment(self, rdef: ResourceDef, key: tuple[str, str]) -> None:
        current = self._bucket(rdef).get(key)
        if current is None or current["metadata"].get("deletionTimestamp"):
            return
        status = controllers.deployment_status(current)
        if status == current.get("status"):
            return
        new = copy.deepcopy(current)
        new["status"] = status
        new = ssa.record_update(current, new, "kube-controller-manager", "status")
        self._bump(new)
        self._bucket(rdef)[key] = new
        self._record((rdef.group, rdef.plural), "MODIFIED", new)
        progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
        if progressing["reason"] in ("NewReplicaSetCreated", "ReplicaSetUpdated"):
            deadline = controllers.progress_deadline(new) + CONTROLLER_DELAY
            self._later(deadline, functools.partial(self._sync_deployment, rdef, key))

    # ------------------------------------------------------------------ the Job double

    def _job_pods(self, job: Obj) -> list[Obj]:
        pods = self._bucket(self._defs[("", "v1", "pods")]).values()
        return jobs.owned_pods(job, list(pods))

    def _sync_job(self, key: tuple[str, str]) -> None:
        """The Job controller's sync (:mod:`.jobs`): write the status, start the next Pod."""
        rdef = self._defs[("batch", "v1", "jobs")]
        current = self._bucket(rdef).get(key)
        if current is None or current["metadata"].get("deletionTimestamp"):
            return
        status = jobs.job_status(current, self._job_pods(current))
        finished = {c["type"] for c in status.get("conditions") or []} & {"Complete", "Failed"}
        if not finished and not status["active"] and key not in self._job_pending:
            self._job_pending.add(key)
            delay = jobs.backoff(int(status.get("failed", 0)))
            self._later(CONTROLLER_DELAY + delay, functools.partial(self._start_job_pod, key))
        if status == current.get("status"):
            return
        new = copy.deepcopy(current)
        new["status"] = status
        new = ssa.record_update(current, new, "kube-controller-manager", "status")
        self._bump(new)
        self._bucket(rdef)[key] = new
        self._record((rdef.group, rdef.plural), "MODIFIED", new)

    def _start_job_pod(self, key: tuple[str, str]) -> None:
        """Create the Job's next Pod and run it in the background (the kubelet's part)."""
        self._job_pending.discard(key)
        job = self._bucket(self._defs[("batch", "v1", "jobs")]).get(key)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        pod = defaults.apply_builtin_defaults(jobs.new_pod(job))
        pod["status"] = {"phase": "Running", "startTime": _now()}
        pod = self._insert(("", "pods"), pod)
        workdir = self.job_workdir or Path(tempfile.gettempdir())
        pod_key = (pod["metadata"]["namespace"], pod["metadata"]["name"])

        async def run() -> None:
            status = await jobs.run_pod(copy.deepcopy(pod), self._lookup, workdir)
            async with self._lock:
                stored = self._store[("", "pods")].get(pod_key)
                if stored is not None:
                    new = copy.deepcopy(stored)
                    new["status"] = {**stored.get("status", {}), **status}
                    self._bump(new)
                    self._store[("", "pods")][pod_key] = new
                    self._record(("", "pods"), "MODIFIED", new)
                self._sync_job(key)

        task = asyncio.get_event_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._sync_job(key)

    def _lookup(self, plural: str, namespace: str, name: str) -> Obj | None:
        return self._store[("", plural)].get((namespace, name))

    def _patched(
        self,
        rdef: ResourceDef,
        current: Obj,
        sub: str | None,
        body: Any,
        method: str,
        ctype: str,
        write: _Write,
    ) -> Obj:
        """The object after a PUT or PATCH, with the subresource rules applied."""
        base = self._scale_doc(rdef, current) if sub == "scale" else current
        try:
            if method == "PUT":
                new = copy.deepcopy(body)
                sent_rv = (new.get("metadata") or {}).get("resourceVersion")
                if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
                    raise ApiError(
                        409,
                        "Conflict",
                        "the object has been modified; please apply your changes to the "
                        "latest version and try again",
                    )
            elif ctype == _APPLY:
                new = ssa.apply(base, body, write.manager, force=write.force)
            elif ctype == "application/json-patch+json":
                new = json_patch(base, body)
            elif ctype == "application/merge-patch+json":
                new = merge_patch(base, body)
            elif ctype == "application/strategic-merge-patch+json":
                new = strategic_merge_patch(base, body)
            else:
                raise ApiError(
                    415, "UnsupportedMediaType", f"the patch type {ctype} is not supported"
                )
        except PatchTestFailedError as exc:
            raise ApiError(422, "Invalid", str(exc)) from None
        except ssa.ApplyConflictError as exc:
            raise ApiError(409, "Conflict", str(exc)) from None
        except PatchError as exc:
            raise ApiError(422, "Invalid", str(exc)) from None
        if not isinstance(new, dict):
            raise ApiError(400, "BadRequest", "the result is not an object")
        if sub == "scale":
            assert rdef.scale is not None
            replicas = (new.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "Invalid", "spec.replicas: must be a non-negative integer")
            new = copy.deepcopy(current)
            _set_path(new, rdef.scale.spec_replicas_path, replicas)
        elif sub == "status":
            status = new.get("status")
            new = copy.deepcopy(current)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif rdef.status:
            if "status" in current:
                new["status"] = current["status"]
            else:
                new.pop("status", None)
        result: Obj = new
        return result

    def _delete(self, rdef: ResourceDef, parsed: _Path) -> Obj:
        current = self._find(rdef, parsed)
        if current["metadata"].get("finalizers"):
            if not current["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(current)
                new["metadata"]["deletionTimestamp"] = _now()
                self._bump(new)
                self._bucket(rdef)[
                    (new["metadata"].get("namespace", ""), new["metadata"]["name"])
                ] = new
                self._record((rdef.group, rdef.plural), "MODIFIED", new)
                return new
            return current
        self._remove(rdef, current)
        return current

    def _remove(self, rdef: ResourceDef, obj: Obj) -> None:
        meta = obj["metadata"]
        self._bucket(rdef).pop((meta.get("namespace", ""), meta["name"]), None)
        self._bump(obj)
        self._record((rdef.group, rdef.plural), "DELETED", obj)
        self._later(GC_DELAY, functools.partial(self._collect_garbage, meta["uid"]))

    def _collect_garbage(self, owner_uid: str) -> None:
        """Background cascading deletion: dependents whose owner is gone go too, a moment
        later (the garbage collector works from its own informers, never in the request)."""
        for (group, plural), objects in list(self._store.items()):
            rdef = next(d for (g, _, p), d in self._defs.items() if (g, p) == (group, plural))
            for obj in list(objects.values()):
                owners = obj["metadata"].get("ownerReferences") or []
                if any(ref.get("uid") == owner_uid for ref in owners):
                    parsed = _Path(
                        group,
                        rdef.version,
                        plural,
                        obj["metadata"].get("namespace"),
                        obj["metadata"]["name"],
                        None,
                    )
                    self._delete(rdef, parsed)

    def _scale_doc(self, rdef: ResourceDef, obj: Obj) -> Obj:
        assert rdef.scale is not None
        selector = (
            _get_path(obj, rdef.scale.label_selector_path)
            if rdef.scale.label_selector_path
            else None
        )
        if isinstance(selector, dict):  # a Deployment's LabelSelector, rendered as text
            selector = ",".join(f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items())
        meta = obj["metadata"]
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": {"replicas": _get_path(obj, rdef.scale.spec_replicas_path) or 0},
            "status": {
                "replicas": _get_path(obj, rdef.scale.status_replicas_path) or 0,
                **({"selector": selector} if selector else {}),
            },
        }

    # ------------------------------------------------------------------ CRDs

    def _establish(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        for version in spec.get("versions") or []:
            if not version.get("served", True):
                continue
            subs = version.get("subresources") or {}
            scale = subs.get("scale")
            self.register(
                ResourceDef(
                    group=spec["group"],
                    version=version["name"],
                    plural=names["plural"],
                    kind=names["kind"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    short_names=tuple(names.get("shortNames") or ()),
                    status="status" in subs,
                    scale=ScaleSpec(
                        scale["specReplicasPath"],
                        scale["statusReplicasPath"],
                        scale.get("labelSelectorPath"),
                    )
                    if scale
                    else None,
                    schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                    columns=tuple(version.get("additionalPrinterColumns") or ()),
                )
            )
        crd["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "lastTransitionTime": _now(),
                    "message": "no conflicts found",
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "lastTransitionTime": _now(),
                    "message": "the initial names have been accepted",
                },
            ],
        }

    # ------------------------------------------------------------------ admission

    async def _admit(
        self, rdef: ResourceDef, obj: Obj, old: Obj | None, operation: str, *, mutating: bool
    ) -> Obj:
        """Call the matching mutating or validating webhooks, as the apiserver does: rules,
        selectors, then matchConditions (:mod:`.match_conditions`)."""
        plural = f"{'mutating' if mutating else 'validating'}webhookconfigurations"
        for config in self.list_objects("admissionregistration.k8s.io", plural):
            for hook in config.get("webhooks") or []:
                matched = self._hook_matches(hook, rdef, operation)
                if not (matched and self._hook_selects(hook, obj)):
                    continue
                request = _admission_request(rdef, obj, old, operation)
                if self._conditions_call(hook, request):
                    obj = await self._call_webhook(hook, obj, request, mutating)
        return obj

    @staticmethod
    def _conditions_call(hook: Obj, request: Obj) -> bool:
        """Whether the webhook's matchConditions send it this request; a condition that errors
        refuses the request under ``failurePolicy: Fail`` and skips the webhook under Ignore."""
        decision = match_conditions.decide(hook, request)
        if decision.outcome != "error":
            return decision.outcome == "call"
        if hook.get("failurePolicy") == "Ignore":
            return False
        raise ApiError(
            500,
            "InternalError",
            f'Internal error occurred: failed calling webhook "{hook.get("name")}": '
            f"failed evaluating match conditions, failing closed: {decision.detail}",
        )

    @staticmethod
    def _hook_matches(hook: Obj, rdef: ResourceDef, operation: str) -> bool:
        for rule in hook.get("rules") or []:
            ops = rule.get("operations") or []
            if (
                ("*" in ops or operation in ops)
                and (rdef.group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
                and (
                    rdef.version in rule.get("apiVersions", [])
                    or "*" in rule.get("apiVersions", [])
                )
                and (rdef.plural in rule.get("resources", []) or "*" in rule.get("resources", []))
            ):
                return True
        return False

    def _hook_selects(self, hook: Obj, obj: Obj) -> bool:
        """The webhook's namespaceSelector (on the namespace's labels) and objectSelector."""
        meta = obj.get("metadata") or {}
        if not _label_selector_matches(meta.get("labels") or {}, hook.get("objectSelector")):
            return False
        namespace = meta.get("namespace")
        if not namespace or not hook.get("namespaceSelector"):
            return True
        ns = self._store[("", "namespaces")].get(("", namespace)) or {}
        labels = (ns.get("metadata") or {}).get("labels") or {}
        return _label_selector_matches(labels, hook.get("namespaceSelector"))

    async def _call_webhook(
        self,
        hook: Obj,
        obj: Obj,
        request: Obj,
        mutating: bool,
    ) -> Obj:
        client = hook.get("clientConfig") or {}
        url = client.get("url")
        if not url:
            return obj  # service references cannot be reached from here
        ssl_ctx: ssl.SSLContext | bool = False
        if url.startswith("https://"):
            ssl_ctx = ssl.create_default_context()
            if client.get("caBundle"):
                ssl_ctx.load_verify_locations(cadata=base64.b64decode(client["caBundle"]).decode())
        review: Obj = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
        review["request"] = request
        fail_open = hook.get("failurePolicy") == "Ignore"
        try:
            timeout = aiohttp.ClientTimeout(total=float(hook.get("timeoutSeconds") or 10))
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(url, json=review, ssl=ssl_ctx) as resp,
            ):
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            if fail_open:
                return obj
            raise ApiError(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{hook.get("name")}": {exc}',
            ) from None
        response = answer.get("response") or {}
        if not response.get("allowed", False):
            status = response.get("status") or {}
            raise ApiError(
                int(status.get("code") or 400),
                "Forbidden" if mutating else "Invalid",
                f'admission webhook "{hook.get("name")}" denied the request: '
                f"{status.get('message', '')}",
            )
        if mutating and response.get("patch"):
            ops = json.loads(base64.b64decode(response["patch"]))
            try:
                obj = json_patch(obj, ops)
            except PatchError as exc:
                raise ApiError(
                    500, "InternalError", f"webhook patch did not apply: {exc}"
                ) from None
        return obj


def _admission_request(rdef: ResourceDef, obj: Obj, old: Obj | None, operation: str) -> Obj:
    """The AdmissionRequest of a write: what a webhook receives and what its matchConditions
    see as ``request`` (``object`` is null for DELETE, ``oldObject`` for CREATE)."""
    meta = obj["metadata"]
    gvk = {"group": rdef.group, "version": rdef.version, "kind": rdef.kind}
    gvr = {"group": rdef.group, "version": rdef.version, "resource": rdef.plural}
    return {
        "uid": str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "operation": operation,
        "userInfo": {"username": "system:admin", "groups": ["system:masters"]},
        "object": None if operation == "DELETE" else obj,
        "oldObject": old if operation != "CREATE" else None,
        "dryRun": False,
        "options": None,
    }


@contextlib.asynccontextmanager
async def serve(port: int | None = None) -> AsyncIterator[tuple[ApiEmulator, str]]:
    """Run the emulator on 127.0.0.1 (a free port unless given); yield it and its URL."""
    emulator = ApiEmulator()
    async with emulator, kmock.Server(emulator, host="127.0.0.1", port=port) as server:
        yield emulator, str(server.url).rstrip("/")


def _kubeconfig_text(url: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": url}}],
            "users": [{"name": "emulator", "user": {"token": "emulator"}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {
                        "cluster": "emulator",
                        "user": "emulator",
                        "namespace": "default",
                    },
                }
            ],
        }
    )


async def _main(port: int, kubeconfig: str | None, job_workdir: str | None) -> None:
    stop = asyncio.Event()
    # SIGTERM ends the serve block, which stops the Job double's processes (no orphans).
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with serve(port or None) as (emulator, url):
        emulator.job_workdir = Path(job_workdir) if job_workdir else None
        if kubeconfig:
            with open(kubeconfig, "w", encoding="utf-8") as handle:
                handle.write(_kubeconfig_text(url))
        print(url, flush=True)  # the parent reads the URL from the first line
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """``python -m statetier.kubetest.emulator [--port N] [--kubeconfig PATH]``."""
    import argparse

    parser = argparse.ArgumentParser(description="Kubernetes API emulator on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--kubeconfig", help="write a kubeconfig pointing here to this path")
    parser.add_argument("--job-workdir", help="folder of the Job double's output files")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.port, args.kubeconfig, args.job_workdir))


if __name__ == "__main__":
    main()

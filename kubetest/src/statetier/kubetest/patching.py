"""The three patch formats of the Kubernetes API, applied to plain JSON documents.

The emulator needs them because kopf patches with JSON merge patches (RFC 7386) and JSON
patches (RFC 6902, with a ``test`` of ``resourceVersion`` for optimistic concurrency), and
``kubectl apply`` sends strategic merge patches for built-in kinds. The strategic form here is an
approximation: lists of objects that Kubernetes merges by key (containers, volumes, env, ...)
are merged by ``name``, the ``$patch`` directives are honoured and the bookkeeping keys
(``$setElementOrder/...``, ``$retainKeys``) are dropped. That is enough for ``kubectl apply``
of CRDs, Deployments and Services; it is not the full algorithm.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = [
    "PatchError",
    "PatchTestFailedError",
    "json_patch",
    "merge_patch",
    "strategic_merge_patch",
]


class PatchError(ValueError):
    """The patch is malformed or does not apply (HTTP 422 / 400)."""


class PatchTestFailedError(PatchError):
    """A JSON-patch ``test`` operation did not match (HTTP 422, as the apiserver answers)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Lists Kubernetes merges element by element (patchMergeKey) rather than replacing them.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "conditions": "type",
}


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    """Approximate strategic merge: see the module docstring for what is covered."""
    if isinstance(patch, list):
        key = _MERGE_KEYS.get(field)
        if key and isinstance(target, list) and all(isinstance(p, dict) for p in patch):
            return _merge_keyed_list(target, patch, key)
        return [p for p in copy.deepcopy(patch) if not (isinstance(p, dict) and "$patch" in p)]
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if name.startswith("$"):
            continue
        if name.startswith("$setElementOrder/") or name.startswith("$deleteFromPrimitiveList/"):
            continue
        if value is None:
            result.pop(name, None)
        else:
            result[name] = strategic_merge_patch(result.get(name), value, name)
    return result


def _merge_keyed_list(target: list[Any], patch: list[dict[str, Any]], key: str) -> list[Any]:
    result = [copy.deepcopy(item) for item in target]
    for item in patch:
        ident = item.get(key)
        index = next(
            (i for i, old in enumerate(result) if isinstance(old, dict) and old.get(key) == ident),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(strategic_merge_patch(None, item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _split_pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _split_pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _split_pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"index in {path!r} is out of range")
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _split_pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 on a copy of ``target``; a failed ``test`` raises PatchTestFailedError."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed JSON-patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "test":
            try:
                actual = _get(doc, path)
            except PatchError:
                actual = None
            if actual != op.get("value"):
                raise PatchTestFailedError(
                    f"the test of {path!r} failed: expected {op.get('value')!r}, found {actual!r}"
                )
        elif kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        else:
            raise PatchError(f"unknown JSON-patch operation {kind!r}")
    return doc

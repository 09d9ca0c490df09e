"""Server-side apply and ``metadata.managedFields``, as the emulator keeps them.

Every write records which manager set which fields (``operation: Update`` for POST, PUT and
PATCH, named by ``?fieldManager`` or else by the User-Agent up to its first ``/``: an aiohttp
client shows up as ``Python``, as on a real apiserver). An apply patch
(``application/apply-patch+yaml``) merges the applied configuration into the object, removes
the fields this manager applied before and applies no more, and answers 409 when it would
change a field another manager owns, unless ``force=true`` (then the field changes hands).

The model is the apiserver's, kept small: field sets are sets of paths whose steps are
``f:<field>``, ``k:<json key>`` for lists merged by key (containers, env, ports, ...) and ``.``
for a keyed item itself; every other list is atomic. It is exact for what the operator and
the tests apply (Deployments, Services, custom resources without keyed lists).
"""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

__all__ = ["ApplyConflictError", "apply", "manager_name", "record_update"]

Obj = dict[str, Any]
Path = tuple[str, ...]

# Lists merged by key (their patchMergeKey / x-kubernetes-list-map-keys); all others are atomic.
_LIST_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "ownerReferences": ("uid",),
    "conditions": ("type",),
    "ports": ("containerPort", "port", "protocol"),
}
_TRACKED_METADATA = ("labels", "annotations", "ownerReferences", "finalizers")


class ApplyConflictError(Exception):
    """The apply would change fields other managers own (HTTP 409)."""


def manager_name(query: dict[str, str], user_agent: str) -> str:
    """The field manager of a request: ``?fieldManager`` or the User-Agent's first word."""
    return query.get("fieldManager") or (user_agent.split("/", 1)[0] or "unknown")


def _key(item: Obj, field: str) -> str:
    key = {k: item[k] for k in _LIST_KEYS[field] if k in item}
    if field == "ports":  # the protocol is part of a port's key, TCP when not given
        key.setdefault("protocol", "TCP")
    return "k:" + json.dumps(key, sort_keys=True, separators=(",", ":"))


def _keyed(field: str, value: Any) -> bool:
    return (
        field in _LIST_KEYS and isinstance(value, list) and all(isinstance(i, dict) for i in value)
    )


def _fields(node: Any, prefix: Path = (), field: str = "") -> set[Path]:
    if isinstance(node, dict) and node:
        paths: set[Path] = set()
        for name, value in node.items():
            paths |= _fields(value, (*prefix, f"f:{name}"), name)
        return paths
    if _keyed(field, node) and node:
        paths = set()
        for item in node:
            step = (*prefix, _key(item, field))
            paths.add((*step, "."))
            paths |= _fields(item, step)
        return paths
    return {prefix}


def _owned_fields(obj: Obj, subresource: str | None) -> set[Path]:
    """The field set an object's content stands for (identity and server fields excluded)."""
    meta = obj.get("metadata") or {}
    tracked: Obj = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    if subresource != "status":
        tracked.pop("status", None)
    else:
        tracked = {"status": obj.get("status")} if "status" in obj else {}
    metadata = {k: meta[k] for k in _TRACKED_METADATA if meta.get(k)}
    if metadata and subresource is None:
        tracked["metadata"] = metadata
    return _fields(tracked) if tracked else set()


def _get(node: Any, path: Path) -> tuple[bool, Any]:
    field = ""
    for step in path:
        if step == ".":
            return True, node
        if step.startswith("f:") and isinstance(node, dict) and step[2:] in node:
            field, node = step[2:], node[step[2:]]
        elif step.startswith("k:") and isinstance(node, list):
            found = [i for i in node if isinstance(i, dict) and _key(i, field) == step]
            if not found:
                return False, None
            node = found[0]
        else:
            return False, None
    return True, node


def _remove(obj: Obj, path: Path) -> None:
    parent: Any = obj
    for i, step in enumerate(path[:-1]):
        last = i == len(path) - 2
        if step.startswith("f:") and isinstance(parent, dict):
            child = parent.get(step[2:])
            if last and path[-1] == "." and isinstance(child, list):
                return
            parent = child
        elif step.startswith("k:") and isinstance(parent, list):
            field = path[i - 1][2:] if i else ""
            matches = [it for it in parent if isinstance(it, dict) and _key(it, field) == step]
            if not matches:
                return
            if last and path[-1] == ".":
                parent.remove(matches[0])
                return
            parent = matches[0]
        else:
            return
    leaf = path[-1]
    if leaf.startswith("f:") and isinstance(parent, dict):
        parent.pop(leaf[2:], None)


def _merge(current: Any, config: Any, field: str = "") -> Any:
    if isinstance(current, dict) and isinstance(config, dict):
        result = dict(current)
        for name, value in config.items():
            result[name] = _merge(current.get(name), value, name)
        return result
    if _keyed(field, config) and isinstance(current, list):
        result_list = list(current)
        for item in config:
            index = next(
                (
                    n
                    for n, old in enumerate(result_list)
                    if isinstance(old, dict) and _key(old, field) == _key(item, field)
                ),
                None,
            )
            if index is None:
                result_list.append(copy.deepcopy(item))
            else:
                result_list[index] = _merge(result_list[index], item)
        return result_list
    return copy.deepcopy(config)


def _encode(paths: set[Path]) -> Obj:
    tree: Obj = {}
    for path in sorted(paths):
        node = tree
        for step in path:
            node = node.setdefault(step, {})
    return tree


def _decode(tree: Any, prefix: Path = ()) -> set[Path]:
    paths: set[Path] = set()
    for step, sub in (tree or {}).items():
        if step == "." or not sub:
            paths.add((*prefix, step))
        else:
            paths |= _decode(sub, (*prefix, step))
    return paths


def _entries(obj: Obj) -> list[Obj]:
    return list((obj.get("metadata") or {}).get("managedFields") or [])


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _with_entries(obj: Obj, owners: dict[tuple[str, str, str | None], set[Path]]) -> Obj:
    """``obj`` with managedFields rebuilt from ``owners``; unchanged entries keep their time."""
    old = {(e["manager"], e["operation"], e.get("subresource")): e for e in _entries(obj)}
    entries = []
    for (manager, operation, sub), paths in owners.items():
        if not paths:
            continue
        fields = _encode(paths)
        before = old.get((manager, operation, sub))
        if before is not None and before.get("fieldsV1") == fields:
            entries.append(before)
            continue
        entry: Obj = {
            "manager": manager,
            "operation": operation,
            "apiVersion": obj.get("apiVersion", ""),
            "time": _now(),
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        }
        if sub:
            entry["subresource"] = sub
        entries.append(entry)
    obj.setdefault("metadata", {})["managedFields"] = entries
    return obj


def _owners(obj: Obj) -> dict[tuple[str, str, str | None], set[Path]]:
    return {
        (e["manager"], e["operation"], e.get("subresource")): _decode(e.get("fieldsV1"))
        for e in _entries(obj)
    }


def record_update(old: Obj | None, new: Obj, manager: str, subresource: str | None) -> Obj:
    """``new`` with the fields this write changed owned by ``manager`` (operation Update)."""
    before = _owned_fields(old, subresource) if old else set()
    after = _owned_fields(new, subresource)
    changed = {p for p in before | after if old is None or _get(old, p) != _get(new, p)}
    owners = _owners(old) if old else {}
    if not changed:
        new.setdefault("metadata", {})["managedFields"] = _entries(old) if old else []
        return new
    for key in owners:
        owners[key] -= changed
    mine = owners.setdefault((manager, "Update", subresource), set())
    mine |= changed & after
    return _with_entries(new, owners)


def apply(current: Obj | None, config: Obj, manager: str, *, force: bool) -> Obj:
    """The object after ``manager`` applies ``config`` to ``current`` (None: absent)."""
    applied = _owned_fields(config, None)
    owners = _owners(current) if current else {}
    mine_key = (manager, "Apply", None)
    previously = owners.get(mine_key, set())
    base = copy.deepcopy(current) if current else {}
    conflicts = sorted(
        (other[0], path)
        for other, paths in owners.items()
        if other[0] != manager
        for path in applied & paths
        if _get(base, path) != _get(config, path)
    )
    if conflicts and not force:
        listed = "; ".join(
            f'conflict with "{who}": .{".".join(s[2:] for s in path if s.startswith("f:"))}'
            for who, path in conflicts
        )
        raise ApplyConflictError(f"Apply failed with {len(conflicts)} conflict(s): {listed}")
    others = set().union(*(p for k, p in owners.items() if k != mine_key)) if owners else set()
    # Whole keyed items first (their key fields go with them), then fields, deepest first.
    for path in sorted(previously - applied - others, key=lambda p: (p[-1] != ".", -len(p))):
        _remove(base, path)
    body = {k: v for k, v in config.items() if k != "status"}
    meta_config = {k: v for k, v in (config.get("metadata") or {}).items() if k != "managedFields"}
    result: Obj = _merge(base, {**body, "metadata": meta_config})
    for who, path in conflicts:
        for key in owners:
            if key[0] == who:
                owners[key].discard(path)
    owners[mine_key] = applied
    if (
        current is not None
        and {k: v for k, v in result.items() if k != "metadata"}
        == {k: v for k, v in current.items() if k != "metadata"}
        and _owners(current) == {k: v for k, v in owners.items() if v}
    ):
        return result
    return _with_entries(result, owners)

"""A failing wrapper filesystem registered in fsspec as ``faulty://``, for fault injection.

It wraps a real filesystem (local or s3fs against SeaweedFS) and follows a fault plan: rules
matched on the operation and a substring of the path that raise a transient error
(``ConnectionResetError``, retried by the store) a number of times, a persistent one
(``PermissionError``) every time, or block forever after touching a marker file (so a test can
SIGKILL the process at that exact point). The plan can come from the ``CKPT_FAULTS`` environment
variable (JSON), which is how crash-test subprocesses get theirs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem
from statetier.backend.snapshot.fencing import ConditionalOps, conditional_ops_for


@dataclasses.dataclass
class Rule:
    op: str  # "write", "read", "commit" (manifest/lease), "list", "delete" or "*"
    match: str  # substring of the path
    mode: str  # "transient", "persistent" or "block"
    times: int = 1  # transient: how many failures; block: on the n-th match
    marker: str = ""  # block: file touched when blocking
    seen: int = 0


@dataclasses.dataclass
class FaultPlan:
    rules: list[Rule] = dataclasses.field(default_factory=list)
    injected: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def add(self, op: str, match: str, mode: str, times: int = 1, marker: str = "") -> None:
        self.rules.append(Rule(op, match, mode, times, marker))

    def check(self, op: str, path: str) -> None:
        for rule in self.rules:
            if rule.op not in ("*", op) or rule.match not in path:
                continue
            with self.lock:
                rule.seen += 1
                seen = rule.seen
            if rule.mode == "transient" and seen <= rule.times:
                self.injected += 1
                raise ConnectionResetError(f"injected transient fault on {op} {path}")
            if rule.mode == "persistent":
                self.injected += 1
                raise PermissionError(f"injected persistent fault on {op} {path}")
            if rule.mode == "block" and seen == rule.times:
                with open(rule.marker, "w") as f:
                    f.write(f"{op} {path}")
                while True:
                    time.sleep(1)

    @classmethod
    def from_env(cls) -> FaultPlan:
        plan = cls()
        for raw in json.loads(os.environ.get("CKPT_FAULTS", "[]")):
            plan.add(**raw)
        return plan


class _FaultyConditional:
    def __init__(self, inner: ConditionalOps, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan

    def get(self, path: str) -> tuple[bytes, str] | None:
        self.plan.check("read", path)
        return self.inner.get(path)

    def create(self, path: str, data: bytes) -> str | None:
        self.plan.check("commit", path)
        return self.inner.create(path, data)

    def replace(self, path: str, data: bytes, version: str) -> str | None:
        self.plan.check("commit", path)
        return self.inner.replace(path, data, version)


class FaultyFileSystem(AbstractFileSystem):  # type: ignore[misc]
    protocol = "faulty"
    cachable = False

    def __init__(
        self,
        target_protocol: str = "file",
        target_options: dict[str, Any] | None = None,
        plan: FaultPlan | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fs = fsspec.filesystem(target_protocol, **(target_options or {}))
        self.plan = plan if plan is not None else FaultPlan.from_env()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("faulty://"):
            path = path[len("faulty://") :]
        return path.rstrip("/") or "/"

    def statetier_conditional_ops(self) -> ConditionalOps:
        return _FaultyConditional(conditional_ops_for(self.fs), self.plan)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self.plan.check("write", path)
        if isinstance(self.fs, LocalFileSystem):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            temp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
            with open(temp, "wb") as f:
                f.write(value)
            os.replace(temp, path)
            return
        self.fs.pipe_file(path, value, **kwargs)

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> Any:
        self.plan.check("read", path)
        return self.fs.cat_file(path, start=start, end=end, **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        self.plan.check("list", path)
        return self.fs.ls(path, detail=detail, **kwargs)

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self.plan.check("list", path)
        return self.fs.find(path, *args, **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        return self.fs.info(path, **kwargs)

    def exists(self, path: str, **kwargs: Any) -> bool:
        return bool(self.fs.exists(path, **kwargs))

    def rm_file(self, path: str) -> None:
        self.plan.check("delete", path)
        self.fs.rm_file(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.fs.makedirs(path, exist_ok=exist_ok)

    def mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        self.fs.mv(path1, path2, **kwargs)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.fs.invalidate_cache(path)


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)

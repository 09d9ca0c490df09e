"""The workload of the checkpoint tests, and reading a checkpoint's whole content back.

``Accumulate`` uses value, map, list and TTL'd value state, removes keys (so deltas carry
tombstones) and keeps operator state (even-split and union lists). ``records(epoch)`` is
deterministic, so a test, or the parent of a crash-test subprocess, knows what every epoch
committed by replaying it in memory.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import uuid
from collections.abc import Iterable
from typing import Any

from statetier.backend import (
    FunctionInitializationContext,
    FunctionSnapshotContext,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.ttl import ManualClock
from statetier.tools.seaweed import BUCKET, KEY, SECRET

from tests.checkpoint.ckpt_faults import FaultPlan


@dataclasses.dataclass(frozen=True)
class S3Server:
    endpoint: str

    @property
    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "key": KEY, "secret": SECRET}


@dataclasses.dataclass(frozen=True)
class Location:
    """One checkpoint location under test, reachable plainly or through ``faulty://``."""

    kind: str
    uri: str
    root: str
    options: dict[str, Any]

    @classmethod
    def on_s3(cls, server: S3Server) -> Location:
        """A fresh location of its own in ``server``'s bucket."""
        root = f"{BUCKET}/{uuid.uuid4().hex}"
        return cls("s3", f"s3://{root}", root, server.options)

    def store(self, **kwargs: Any) -> SnapshotStore:
        return SnapshotStore(self.uri, **self.options, **kwargs)

    def runner(self, parallelism: int, **kwargs: Any) -> LocalRunner:
        """An :class:`Accumulate` runner at max parallelism MAX_P checkpointing here."""
        return LocalRunner(
            Accumulate,
            parallelism,
            max_parallelism=MAX_P,
            checkpoint_uri=self.uri,
            storage_options=self.options,
            **kwargs,
        )

    @property
    def target_protocol(self) -> str:
        return "s3" if self.kind == "s3" else "file"

    @property
    def faulty_uri(self) -> str:
        return f"faulty://{self.root}"

    def faulty_options(self, plan: FaultPlan | None = None) -> dict[str, Any]:
        options: dict[str, Any] = {
            "target_protocol": self.target_protocol,
            "target_options": self.options,
        }
        if plan is not None:
            options["plan"] = plan
        return options

    def faulty(self, plan: FaultPlan, **kwargs: Any) -> SnapshotStore:
        return SnapshotStore(self.faulty_uri, **self.faulty_options(plan), **kwargs)

    def cli_options(self) -> list[str]:
        return [arg for k, v in self.options.items() for arg in ("-o", f"{k}={v}")]


CLOCK_MS = 1_000_000  # a fixed clock: TTL timestamps are then the same in every process
KEYS = 400
MAX_P = 32


class Accumulate(KeyedProcessFunction[str, int, Any]):
    """Per key: a running sum, a map of residues, the last three values; value 0 clears."""

    def open(self, context: RuntimeContext) -> None:
        self.total = context.get_state(ValueStateDescriptor[int]("total"))
        self.residues = context.get_state(MapStateDescriptor("residues"))
        self.last = context.get_state(ListStateDescriptor[int]("last"))
        self.seen = context.get_state(ValueStateDescriptor[int]("seen", ttl=StateTtlConfig(10**12)))

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        store = context.operator_state_store
        self.offsets = store.get_list_state(ListStateDescriptor[int]("offsets"))
        self.epochs = store.get_union_list_state(ListStateDescriptor[str]("epochs"))
        self.processed = 0

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        if self.processed:
            self.offsets.add(self.processed)
        self.processed = 0
        self.epochs.add(f"e{context.checkpoint_id}")

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[Any]:
        self.processed += 1
        if value == 0:
            self.total.clear()
            self.residues.clear()
            self.last.clear()
            return ()
        self.total.update((self.total.value() or 0) + value)
        self.residues.put(value % 5, value)
        self.last.update([*self.last.get(), value][-3:])
        self.seen.update(value)
        return ()


def records(epoch: int, n: int = 600, keys: int = KEYS) -> list[tuple[str, int]]:
    rnd = random.Random(epoch * 7919)
    return [(f"k{rnd.randrange(keys)}", rnd.randrange(0, 50)) for _ in range(n)]


def dump_keyed(runner: LocalRunner) -> dict[str, dict[Any, Any]]:
    """Every state's stored values over all instances (the heap form: what handles read)."""
    out: dict[str, dict[Any, Any]] = {}
    for instance in runner.instances:
        for name, table in instance.keyed.tables.items():
            target = out.setdefault(name, {})
            for key_group in instance.keyed.key_groups:
                for key, stored in table.map_for(key_group).items():
                    target[key] = stored
    return copy.deepcopy({name: values for name, values in out.items() if values})


def dump_operator(runner: LocalRunner) -> tuple[list[Any], list[list[Any]]]:
    """(even-split elements concatenated in instance order, each instance's union list)."""
    split: list[Any] = []
    unions: list[list[Any]] = []
    for instance in runner.instances:
        state = instance.operator_state.states.get("offsets")
        split.extend(state.state.elements if state else [])
        union = instance.operator_state.states.get("epochs")
        unions.append(sorted(union.state.elements if union else []))
    return split, unions


def restored_operator(before: tuple[list[Any], list[list[Any]]], parallelism: int) -> Any:
    """What instances at ``parallelism`` get back: the same split list, and every instance the
    union of all instances' union lists."""
    split, unions = before
    everything = sorted(e for union in unions for e in union)
    return split, [everything] * parallelism


def expected_keyed(epochs: int) -> dict[str, Any]:
    """The keyed state a checkpoint of epoch ``epochs`` holds: replay the workload in memory."""
    runner = LocalRunner(Accumulate, 4, max_parallelism=MAX_P, clock=ManualClock(CLOCK_MS))
    for epoch in range(1, epochs + 1):
        runner.process(records(epoch))
    return dump_keyed(runner)

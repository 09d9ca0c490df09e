"""A small keyed workload whose checkpoints pile up deltas, and helpers to compare state."""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

from statetier.backend import MapStateDescriptor, ValueStateDescriptor
from statetier.backend.config import load_config
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot.compaction import CompactionRequest, make_request

MAX_P = 16


class SumAndLast(KeyedProcessFunction[str, int, Any]):
    """Per key a running sum and a map of residues; value 0 clears the key (a tombstone)."""

    def open(self, context: RuntimeContext) -> None:
        self.total = context.get_state(ValueStateDescriptor[int]("total"))
        self.residues = context.get_state(MapStateDescriptor("residues"))

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[Any]:
        if value == 0:
            self.total.clear()
            self.residues.clear()
            return ()
        self.total.update((self.total.value() or 0) + value)
        self.residues.put(value % 7, value)
        return ()


def records(seed: int, epoch: int, n: int = 300, keys: int = 200) -> list[tuple[str, int]]:
    rnd = random.Random(seed * 1_000_003 + epoch)
    return [(f"k{rnd.randrange(keys)}", rnd.randrange(0, 40)) for _ in range(n)]


def runner(uri: str | None, options: dict[str, Any], parallelism: int = 2) -> LocalRunner:
    config = load_config({"compaction.delta-trigger": 2, "compaction.size-ratio": 100.0})
    return LocalRunner(
        SumAndLast,
        parallelism,
        max_parallelism=MAX_P,
        checkpoint_uri=uri,
        storage_options=options if uri else None,
        config=config,
    )


def dump(r: LocalRunner) -> dict[str, dict[Any, Any]]:
    out: dict[str, dict[Any, Any]] = {}
    for instance in r.instances:
        for name, table in instance.keyed.tables.items():
            target = out.setdefault(name, {})
            for key_group in instance.keyed.key_groups:
                target.update(table.map_for(key_group).items())
    return {name: values for name, values in out.items() if values}


def expected(seed: int, epochs: int) -> dict[str, dict[Any, Any]]:
    """The state after ``epochs`` epochs, replayed in memory without any checkpoint."""
    r = runner(None, {})
    for epoch in range(1, epochs + 1):
        r.process(records(seed, epoch))
    state = dump(r)
    r.close()
    return state


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def chain_requests(
    uri: str, options: dict[str, Any], *, epochs: int = 3, keys: int = 200, n: int = 300
) -> list[CompactionRequest]:
    """Write ``epochs`` checkpoints without compaction; the requests to merge each chain."""
    config = load_config({"compaction.delta-trigger": 1000, "compaction.size-ratio": 1000.0})
    r = LocalRunner(
        SumAndLast,
        1,
        max_parallelism=MAX_P,
        checkpoint_uri=uri,
        storage_options=options,
        config=config,
    )
    for epoch in range(1, epochs + 1):
        r.process(records(7, epoch, n=n, keys=keys))
        r.checkpoint()
    assert r.store is not None
    manifest = r.store.manifest()
    requests = [
        make_request(
            r.store.url, c.state, c.files, f"data/compacted/{c.state}", manifest.max_parallelism
        )
        for c in manifest.chains()
        if c.deltas
    ]
    r.close()
    return requests


def odd_block(pairs: list[tuple[bytes, bytes | None]]) -> bytes:
    """A valid columns block (format version 4, no codec) with 4-byte lengths where the
    encoder would pick 1-byte ones: copied as-is it keeps these bytes, decoded and re-encoded
    it would not."""
    assert all(value is not None for _, value in pairs)
    head = struct.pack("<IBBB", len(pairs), 4, 4, 0)
    key_lengths = b"".join(struct.pack("<I", len(k)) for k, _ in pairs)
    value_lengths = b"".join(struct.pack("<I", len(v or b"")) for _, v in pairs)
    keys, values = b"".join(k for k, _ in pairs), b"".join(v or b"" for _, v in pairs)
    return head + key_lengths + value_lengths + keys + values

"""TTL-aware compaction (Flink's compaction-filter cleanup), on an injected clock.

A job writes value, list and map states with TTL, twice over: once with
``cleanup_in_compaction`` and once without. Compaction runs after the third epoch, at whose
clock the first epoch's entries have expired: they disappear from the compacted base of the
states that ask for it (list elements and map entries one by one) and stay in the others. The
clock is the epoch's, carried by the request: moving the clock far ahead before the merge runs
drops nothing more. The same through a real gateway and worker. The request's new fields are
optional both ways: an older client's JSON is accepted, and a request without TTL writes JSON an
older service accepts.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from statetier.backend import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    StateVisibility,
    ValueStateDescriptor,
)
from statetier.backend.compaction_client import RemoteCompactor
from statetier.backend.config import load_config
from statetier.backend.descriptors import StateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.local_runner import LocalRunner
from statetier.backend.serializers import DEFAULT_SERIALIZER
from statetier.backend.snapshot.compaction import (
    CompactionInput,
    CompactionRequest,
    CompactionResult,
    Compactor,
    LocalCompactor,
)
from statetier.backend.snapshot.format import DataFileBuilder, DataFileReader, encode_data_file
from statetier.backend.snapshot.ttl_filter import ttl_filter
from statetier.backend.state.codec import StateCodec
from statetier.backend.ttl import ManualClock
from statetier.compaction.validation import InvalidRequestError, Limits, parse_job
from statetier.tools.compaction_launch import Processes, SeaweedFS

from tests.compaction.compaction_support import odd_block

T0 = 1_000_000
TTL_MS = 1000
MAX_P = 8


def _ttl(cleanup: bool) -> StateTtlConfig:
    return StateTtlConfig(
        TTL_MS,
        visibility=StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP,  # expired stays readable
        incremental_cleanup_size=0,  # nothing but compaction removes anything
        cleanup_in_compaction=cleanup,
    )


def _descriptors() -> list[StateDescriptor]:
    out: list[StateDescriptor] = []
    for suffix, cleanup in (("", True), ("_keep", False)):
        ttl = _ttl(cleanup)
        out += [
            ValueStateDescriptor[str](f"v{suffix}", ttl=ttl),
            ListStateDescriptor[str](f"l{suffix}", ttl=ttl),
            MapStateDescriptor(f"m{suffix}", ttl=ttl),
        ]
    return out


class Stamp(KeyedProcessFunction[str, str, Any]):
    """Every record writes its tag into each state: value, list element, map key."""

    def open(self, context: RuntimeContext) -> None:
        self.states = [context.get_state(d) for d in _descriptors()]

    def process(self, key: str, tag: str, context: RuntimeContext) -> Iterable[Any]:
        for state in self.states:
            if hasattr(state, "put"):
                state.put(tag, 1)
            elif hasattr(state, "add"):
                state.add(tag)
            else:
                state.update(tag)
        return ()


class Gated:
    """A compactor that records each request and waits for ``go`` before merging."""

    def __init__(self, inner: Compactor) -> None:
        self.inner = inner
        self.go = threading.Event()
        self.requests: list[CompactionRequest] = []

    def compact(self, request: CompactionRequest) -> CompactionResult:
        self.requests.append(request)
        assert self.go.wait(30)
        return self.inner.compact(request)


def _runner(uri: str, clock: ManualClock, options: dict[str, Any] | None = None) -> LocalRunner:
    return LocalRunner(
        Stamp,
        1,
        max_parallelism=MAX_P,
        checkpoint_uri=uri,
        clock=clock,
        storage_options=options,
        config=load_config({"compaction.delta-trigger": 2, "compaction.size-ratio": 1e6}),
    )


def _run(runner: LocalRunner, clock: ManualClock, gate: Gated) -> None:
    """Epoch 1 at T0 writes old*, epoch 2 (T0+600) new* and renews old0, epoch 3 (T0+1200:
    old* expired, new* alive) touches one key; its commit plans the compaction, which waits
    until the clock has moved far past every entry."""
    assert runner.checkpointer is not None
    runner.checkpointer.compactor = gate
    runner.process([(f"old{i}", "old") for i in range(10)])
    runner.checkpoint()
    clock.advance(600)
    runner.process([(f"new{i}", "new") for i in range(5)] + [("old0", "new")])
    runner.checkpoint()
    clock.advance(600)
    runner.process([("other", "x")])
    runner.checkpoint()
    clock.advance(100 * TTL_MS)  # compaction must judge at the epoch's clock, not this one
    gate.go.set()
    runner.checkpointer.drain()
    runner.checkpoint()  # names the compacted bases


def _compacted(runner: LocalRunner) -> dict[str, dict[Any, Any]]:
    """State name -> key -> stored value, read from the compacted bases of the last epoch."""
    store = runner.store
    assert store is not None
    manifest = store.manifest()
    codecs = {d.name: StateCodec(d) for d in _descriptors()}
    out: dict[str, dict[Any, Any]] = {}
    for chain in manifest.chains():
        assert "/compacted/" in chain.base.path and chain.base.epoch == 3, chain
        reader = DataFileReader(store.read(chain.base), chain.base.path)
        out[chain.state] = {
            DEFAULT_SERIALIZER.loads(k): codecs[chain.state].decode(v)
            for kg in reader.index
            for k, v in reader.read_block(kg)
            if v is not None  # a base holds no tombstones (the reader checks)
        }
    return out


def _check(compacted: dict[str, dict[Any, Any]], requests: list[CompactionRequest]) -> None:
    alive = {f"new{i}" for i in range(5)} | {"old0", "other"}
    everything = alive | {f"old{i}" for i in range(10)}
    assert {r.state for r in requests} == set(compacted) == {d.name for d in _descriptors()}
    for request in requests:  # only states asking for the cleanup send TTL and clock
        asks = not request.state.endswith("_keep")
        assert request.now_ms == (T0 + 1200 if asks else None)  # the third epoch's clock
        assert (request.ttl is not None, request.state_kind is not None) == (asks, asks)
    for name in ("v", "l", "m"):
        cleaned, kept = compacted[name], compacted[f"{name}_keep"]
        assert set(cleaned) == alive and set(kept) == everything, name
    assert compacted["v"]["old0"] == ("new", T0 + 600)
    assert [tag for tag, _ in compacted["l"]["old0"]] == ["new"]  # one element of two left
    assert [tag for tag, _ in compacted["l_keep"]["old0"]] == ["old", "new"]
    assert list(compacted["m"]["old0"]) == ["new"]
    assert sorted(compacted["m_keep"]["old0"]) == ["new", "old"]


def test_compaction_drops_expired_entries_only_where_the_cleanup_asks(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    runner = _runner(f"file://{tmp_path}/ckpt", clock)
    assert runner.store is not None
    gate = Gated(LocalCompactor(filesystem=runner.store.fs))
    _run(runner, clock, gate)
    meta = runner.store.manifest().states
    assert meta["l"]["ttl"]["cleanup_in_compaction"] is True
    assert meta["l_keep"]["ttl"]["cleanup_in_compaction"] is False
    _check(_compacted(runner), gate.requests)
    runner.close()

    # restored at the compaction's time: what compaction dropped is gone, the rest readable
    restored = _runner(f"file://{tmp_path}/ckpt", ManualClock(T0 + 1200))
    backend = restored.instances[0].keyed
    backend.set_current_key("old3")
    handles: dict[str, Any] = {d.name: backend.get_state(d) for d in _descriptors()}
    assert handles["v"].value() is None and handles["v_keep"].value() == "old"
    assert list(handles["l"].get() or []) == [] and list(handles["l_keep"].get()) == ["old"]
    restored.close()


def test_the_compaction_service_drops_expired_entries(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix])
    procs.worker(gateway, [prefix])
    remote = RemoteCompactor([gateway], timeout=60, poll_interval=0.05, failure_strategy="fail")
    clock = ManualClock(T0)
    runner = _runner(f"{prefix}/ttl", clock, seaweed.options)
    gate = Gated(remote)
    _run(runner, clock, gate)
    assert remote.remote_jobs == len(gate.requests) == 6 and remote.fallbacks == 0
    _check(_compacted(runner), gate.requests)
    runner.close()


# ---------------------------------------------------------------------- the request's JSON

_OLD_FIELDS = {  # what a request had, and a service accepted, before TTL-aware compaction
    "job_id",
    "state",
    "key_groups",
    "inputs",
    "output_prefix",
    "format_version",
    "max_parallelism",
}


def _request(**extra: Any) -> CompactionRequest:
    inputs = [CompactionInput("s3://b/p/0.kgd", 10, 1, "base", 1)]
    return CompactionRequest("j1", "s", "0-7", inputs, "s3://b/p/out", 2, 8, **extra)


def test_a_request_without_ttl_is_what_older_services_accept() -> None:
    body = json.loads(_request().to_json())
    assert set(body) == _OLD_FIELDS
    older = json.loads(_request().to_json())  # an older client's JSON, parsed by this one
    assert parse_job(older, Limits()) == _request()
    assert CompactionRequest.from_json(json.dumps(older)) == _request()


def test_a_request_with_ttl_round_trips_and_is_checked() -> None:
    ttl = _ttl(True).to_json()
    request = _request(state_kind="map", ttl=ttl, now_ms=T0)
    assert CompactionRequest.from_json(request.to_json()) == request
    assert parse_job(json.loads(request.to_json()), Limits()) == request
    good = json.loads(request.to_json())
    bad: list[tuple[str, Any]] = [
        ("ttl.ttl_ms", {**ttl, "ttl_ms": 0}),
        ("ttl.cleanup_in_compaction", {**ttl, "cleanup_in_compaction": "yes"}),
        ("ttl.visibility", {**ttl, "visibility": "Sometimes"}),
        ("ttl.shelf_life", {**ttl, "shelf_life": 3}),
        ("ttl", [1]),
    ]
    for field, value in bad:
        with pytest.raises(InvalidRequestError, match=f"^{field}: "):
            parse_job({**good, "ttl": value}, Limits())
    with pytest.raises(InvalidRequestError, match=r"^state_kind: "):
        parse_job({**good, "state_kind": "tree"}, Limits())
    with pytest.raises(InvalidRequestError, match=r"^now_ms: must be an integer"):
        parse_job({**good, "now_ms": "soon"}, Limits())
    for missing in ("now_ms", "state_kind"):
        without = {k: v for k, v in good.items() if k != missing}
        with pytest.raises(InvalidRequestError, match=f"^{missing}: is required when"):
            parse_job(without, Limits())


def test_without_a_clock_or_the_cleanup_setting_nothing_is_filtered() -> None:
    recorded_by_older_versions = {"ttl_ms": 5, "update_type": "OnCreateAndWrite"}
    assert ttl_filter("value", recorded_by_older_versions, T0) is None
    assert ttl_filter("value", _ttl(False).to_json(), T0) is None
    assert ttl_filter("value", _ttl(True).to_json(), None) is None
    assert ttl_filter("value", None, T0) is None
    live = ttl_filter("value", _ttl(True).to_json(), T0)
    assert live is not None
    flat = [b"k", StateCodec(ValueStateDescriptor("x", ttl=_ttl(True))).encode(("v", T0 - 1))]
    assert live(flat) is flat  # nothing expired: the same list, so a block is copied as-is


def _raw_block(reader: DataFileReader, data: bytes, key_group: int) -> bytes:
    entry = reader.index[key_group]
    return data[entry.offset : entry.offset + entry.length]


def test_untouched_blocks_without_expired_entries_are_still_copied_as_they_are(
    tmp_path: Path,
) -> None:
    codec = StateCodec(ValueStateDescriptor("v", ttl=_ttl(True)))
    now = T0 + 2 * TTL_MS

    def entries(kg: int, stamp: int) -> list[tuple[bytes, bytes | None]]:
        return [(b"k%d-%03d" % (kg, i), codec.encode((f"v{i}", stamp))) for i in range(40)]

    builder = DataFileBuilder({"state": "v", "key_groups": "0-3", "epoch": 1, "kind": "base"})
    alive = odd_block(entries(0, now))  # re-encoded, these bytes would change
    parts = [builder.head, builder.add_raw(0, alive, zlib.crc32(alive), 40)]
    half = entries(1, now)[:20] + entries(1, T0)[20:]  # half of key group 1 expired at ``now``
    for kg, pairs in ((1, half), (2, entries(2, now))):
        flat = [x for pair in pairs for x in pair]
        parts.append(builder.add_block(kg, builder.encode_flat(flat), len(pairs)))
    base = b"".join(parts) + builder.tail()
    delta = encode_data_file(
        {"state": "v", "key_groups": "0-3", "epoch": 2, "kind": "delta"},
        [(2, [(b"k2-000", None), (b"k2-new", codec.encode(("x", T0)))])],  # expired at once
    )
    inputs = []
    for i, (kind, data) in enumerate((("base", base), ("delta", delta))):
        path = tmp_path / f"{i}.kgd"
        path.write_bytes(data)
        inputs.append(CompactionInput(f"file://{path}", len(data), zlib.crc32(data), kind, i + 1))
    request = CompactionRequest(
        "j", "v", "0-3", inputs, f"file://{tmp_path}/out", 2, 8, "value", _ttl(True).to_json(), now
    )
    (output,) = LocalCompactor().compact(request).outputs
    data = Path(output.url[len("file://") :]).read_bytes()
    out, old = DataFileReader(data, "out"), DataFileReader(base, "base")
    assert _raw_block(out, data, 0) == alive  # all alive: copied, not re-encoded
    assert out.index[0].crc32 == old.index[0].crc32
    assert [k for k, _ in out.read_block(1)] == [k for k, _ in entries(1, now)[:20]]
    assert [k for k, _ in out.read_block(2)] == [k for k, _ in entries(2, now)[1:]]
    assert output.crc32 == zlib.crc32(data)

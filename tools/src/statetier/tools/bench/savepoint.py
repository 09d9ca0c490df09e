"""``statetier bench savepoint``: a savepoint against a raw s3fs copy of the same objects, and a
restore from a savepoint against a restore from the running checkpoint.

Starts SeaweedFS (or uses ``--endpoint``) and writes a checkpoint at parallelism 4 of random
base64 values (at least 500 MB stored by default), then two incremental epochs that change 2%
of the keys' counts, so the counts' chains have deltas and the payloads' are bases alone. In
one run against the same server, ``--repeats`` times, which side goes first alternating:

- savepoint: ``take_savepoint`` of the latest epoch (the payload bases copied by the store, the
  counts' chains merged into bases) vs ``s3fs.copy`` of every file the epoch's manifest names
  to a fresh prefix (one bulk call): time and bytes;
- restore: a new location started from the savepoint (``checkpoint.restore-from``) and every
  range restored, side by side, from the savepoint while its copy into the location runs in the
  background, vs every range restored from the running checkpoint's epoch. Both restores are
  checked to answer lookups of sampled keys with the right values. Reported beside: the
  seconds until the copy into the new location is done (its first checkpoint waits for it and
  commits the savepoint's epoch there first; the location is then independent of it).

Targets: the savepoint takes at most 3 times the raw copy (it merges chains, which the copy
does not) and holds no more bytes; the restore from a savepoint takes at most 2 times the
restore from the checkpoint (its reads share the store with the copy). Medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

from statetier.backend.helptext import plain
from statetier.backend.keygroups import key_group_range_for_instance
from statetier.backend.snapshot import (
    Checkpointer,
    CheckpointSettings,
    SnapshotStore,
    SubtaskWriter,
)
from statetier.backend.snapshot.restore_from import start_from_savepoint
from statetier.backend.snapshot.savepoint import take_savepoint
from statetier.tools.bench import print_table
from statetier.tools.bench.checkpoint import (
    MAX_P,
    PARALLELISM,
    build_backends,
    check_lookups,
    restore_ranges,
    seaweedfs,
    touch,
)
from statetier.tools.seaweed import BUCKET, KEY, SECRET

TARGET_SAVEPOINT_RATIO = 3.0
TARGET_RESTORE_RATIO = 2.0
MIN_STATE_MB = 500


def write_checkpoint(options: dict[str, Any], keys: int, value_bytes: int) -> SnapshotStore:
    """Three epochs: a full one, then two that change 2% of the keys' counts."""
    backends = build_backends(keys, value_bytes)
    store = SnapshotStore(f"s3://{BUCKET}/source-{uuid.uuid4().hex[:8]}", **options)
    writers = [SubtaskWriter(b, None, incremental=True) for b in backends]
    settings = CheckpointSettings(upload_concurrency=8, retained=100, compaction=False)
    checkpointer = Checkpointer(store, writers, settings)
    checkpointer.begin(1).result()
    for epoch in (2, 3):
        touch(backends, keys, 0.02, epoch)
        checkpointer.begin(epoch).result()
    checkpointer.close()
    return store


def measure_savepoint(
    source: SnapshotStore, options: dict[str, Any], raw_fs: Any, ours_first: bool
) -> tuple[str, dict[str, float]]:
    """A savepoint of ``source``'s latest epoch and a raw copy of its files: its URI, and the
    seconds and bytes of each."""
    names = [f.path for f in source.manifest().files()]
    raw_root = f"{BUCKET}/raw-{uuid.uuid4().hex[:8]}"
    dest = SnapshotStore(f"s3://{BUCKET}/savepoint-{uuid.uuid4().hex[:8]}", **options)

    def raw() -> float:
        t0 = time.perf_counter()
        raw_fs.copy([source.full_path(n) for n in names], [f"{raw_root}/{n}" for n in names])
        return time.perf_counter() - t0

    raw_s = 0.0 if ours_first else raw()
    t0 = time.perf_counter()
    take_savepoint(source, dest)
    savepoint_s = time.perf_counter() - t0
    raw_s = raw() if ours_first else raw_s
    raw_fs.invalidate_cache()
    return dest.uri, {
        "savepoint_s": savepoint_s,
        "raw_copy_s": raw_s,
        "savepoint_bytes": sum(f.size for f in dest.manifest().files()),
        "raw_bytes": sum(raw_fs.du(raw_root, total=False).values()),
    }


def measure_restore(
    source: SnapshotStore,
    savepoint_uri: str,
    options: dict[str, Any],
    sizes: tuple[int, int],
    ours_first: bool,
) -> dict[str, float]:
    """Every range restored from the running checkpoint, and from a savepoint as a new
    location starts from it (the restore reads the savepoint while it is copied into the
    location); both checked by lookups. Also the seconds until the copy into the location is
    done (what its first checkpoint may wait for)."""
    ranges = [key_group_range_for_instance(MAX_P, PARALLELISM, i) for i in range(PARALLELISM)]

    def from_checkpoint() -> float:
        restore_s, _, payloads = restore_ranges(source, source.manifest(), ranges)
        check_lookups(payloads, *sizes, seed=1)
        return restore_s

    checkpoint_s = 0.0 if ours_first else from_checkpoint()
    target = SnapshotStore(f"s3://{BUCKET}/restored-{uuid.uuid4().hex[:8]}", **options)
    lease = target.acquire_writer()
    t0 = time.perf_counter()
    seeding = start_from_savepoint(target, savepoint_uri, lease, **options)
    assert seeding is not None
    start_s = time.perf_counter() - t0
    copied_at: list[float] = []  # when the copy ended (the callback runs in its thread)
    seeding.copied.add_done_callback(lambda _: copied_at.append(time.perf_counter()))
    restore_s, _, payloads = restore_ranges(seeding.savepoint, seeding.manifest, ranges)
    seeded = seeding.commit()
    while not copied_at:  # the copy's result may be seen just before the callback ran
        time.sleep(0.001)
    assert target.manifest().epoch == seeded.epoch and not target.missing(seeded.files())
    check_lookups(payloads, *sizes, seed=2)
    checkpoint_s = from_checkpoint() if ours_first else checkpoint_s
    return {
        "restore_checkpoint_s": checkpoint_s,
        "restore_savepoint_s": start_s + restore_s,
        "restore_savepoint_owned_s": copied_at[0] - t0,
    }


def run(endpoint: str, keys: int, value_bytes: int, repeats: int) -> dict[str, Any]:
    import s3fs  # type: ignore[import-untyped]

    options: dict[str, Any] = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET}
    raw_fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    source = write_checkpoint(options, keys, value_bytes)
    state_mb = sum(f.size for f in source.manifest().files()) / 2**20
    results: dict[str, list[float]] = {}
    for repeat in range(repeats):
        ours_first = repeat % 2 == 0
        uri, figures = measure_savepoint(source, options, raw_fs, ours_first)
        figures |= measure_restore(source, uri, options, (keys, value_bytes), ours_first)
        for name, value in figures.items():
            results.setdefault(name, []).append(float(value))
    med = {name: statistics.median(values) for name, values in results.items()}
    savepoint_ratio = med["savepoint_s"] / med["raw_copy_s"]
    restore_ratio = med["restore_savepoint_s"] / med["restore_checkpoint_s"]
    return {
        "keys": keys,
        "value_bytes": value_bytes,
        "repeats": repeats,
        "state_mb": round(state_mb, 1),
        "median_seconds": {k: round(v, 3) for k, v in med.items() if k.endswith("_s")},
        "savepoint_mb": round(med["savepoint_bytes"] / 2**20, 1),
        "raw_copy_mb": round(med["raw_bytes"] / 2**20, 1),
        "savepoint_time_ratio": round(savepoint_ratio, 2),
        "restore_time_ratio": round(restore_ratio, 2),
        "each_repeat": {k: [round(v, 3) for v in values] for k, values in results.items()},
        "meets_target": state_mb >= MIN_STATE_MB
        and savepoint_ratio <= TARGET_SAVEPOINT_RATIO
        and med["savepoint_bytes"] <= med["raw_bytes"]
        and restore_ratio <= TARGET_RESTORE_RATIO,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="statetier bench savepoint", description=plain(__doc__))
    parser.add_argument("--keys", type=int, default=24_000)
    parser.add_argument("--value-bytes", type=int, default=32_768)
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
        report(result)
    return 0 if result["meets_target"] else 1


def report(result: dict[str, Any]) -> None:
    seconds = result["median_seconds"]
    print_table(
        f"savepoint on SeaweedFS, {result['state_mb']} MiB of state, median of {result['repeats']}",
        ["operation", "statetier s", "peer s", "ratio", "peer"],
        [
            [
                "savepoint",
                f"{seconds['savepoint_s']:.2f}",
                f"{seconds['raw_copy_s']:.2f}",
                f"{result['savepoint_time_ratio']:.2f}",
                "raw s3fs copy",
            ],
            [
                "restore from savepoint",
                f"{seconds['restore_savepoint_s']:.2f}",
                f"{seconds['restore_checkpoint_s']:.2f}",
                f"{result['restore_time_ratio']:.2f}",
                "restore from checkpoint",
            ],
        ],
    )
    print(f"  bytes: savepoint {result['savepoint_mb']} MiB, raw copy {result['raw_copy_mb']} MiB")
    print(
        "  from the start until the savepoint is copied into the new location (its first "
        f"checkpoint waits for it): {seconds['restore_savepoint_owned_s']} s"
    )
    print(f"  each repeat: {result['each_repeat']}")
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(
        f"  {verdict} targets: state >= {MIN_STATE_MB} MiB, savepoint <= "
        f"{TARGET_SAVEPOINT_RATIO}x the raw copy and no more bytes, restore from savepoint <= "
        f"{TARGET_RESTORE_RATIO}x from checkpoint"
    )

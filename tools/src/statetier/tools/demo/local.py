"""statetier demo --local: a keyed word count through the backend, without Spark.

It runs the backend's local runtime: Zipf-distributed words in batches, a ValueState count per
word, a checkpoint per batch in a local directory, then a restore at another parallelism that
must give exactly the counts a plain Counter computes. --restart resumes from the last
checkpoint. The demo only ever deletes a directory it made itself.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot import SnapshotStore
from statetier.tools.demo.workdir import prepare
from statetier.tools.wordcount import WordCount
from statetier.tools.workloads import batches, zipf_words


def read_counts(uri: str, parallelism: int) -> dict[str, int]:
    """All counts of the latest checkpoint, read back at ``parallelism``."""
    runner = LocalRunner(WordCount, parallelism, checkpoint_uri=uri)
    counts: dict[str, int] = {}
    try:
        for instance in runner.instances:
            state = instance.keyed.get_state(ValueStateDescriptor[int]("count"))
            for key in instance.keyed.keys("count"):
                instance.keyed.set_current_key(key)
                counts[key] = state.value() or 0
    finally:
        runner.close()
    return counts


def checkpoint_bytes(uri: str) -> int:
    store = SnapshotStore(uri)
    manifest = store.manifest()
    return sum(f.size for f in manifest.keyed_files + manifest.operator_files)


def run(args: argparse.Namespace) -> int:
    directory = prepare(Path(args.dir), "local", restart=args.restart)
    uri = f"file://{directory / 'checkpoints'}"
    words = zipf_words(args.words, args.vocabulary, seed=args.seed)
    runner = LocalRunner(WordCount, args.parallelism, checkpoint_uri=uri)
    resumed = runner.restored_epoch
    started = time.perf_counter()
    try:
        for batch in batches(words, args.batches):
            runner.run_epoch((word, 1) for word in batch)
    finally:
        runner.close()  # waits for the background retention of the last checkpoint
    elapsed = time.perf_counter() - started

    runs = resumed // args.batches + 1
    expected = collections.Counter(words)
    restored = read_counts(uri, args.restore_parallelism)
    exact = all(restored.get(w, 0) == n * runs for w, n in expected.items()) and len(
        restored
    ) == len(expected)
    _print_summary(args, uri, resumed, elapsed, restored, exact)
    return 0 if exact else 1


def _print_summary(
    args: argparse.Namespace,
    uri: str,
    resumed: int,
    elapsed: float,
    counts: dict[str, Any],
    exact: bool,
) -> None:
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    rows = [
        ("records", f"{args.words:,} in {args.batches} epochs (parallelism {args.parallelism})"),
        ("resumed from epoch", str(resumed) if resumed else "none (fresh start)"),
        ("records/s", f"{args.words / elapsed:,.0f} (incl. a checkpoint per epoch)"),
        ("distinct words", f"{len(counts):,}"),
        ("checkpoint", f"{uri} ({checkpoint_bytes(uri) / 1e6:.1f} MB, latest epoch)"),
        ("restored at", f"parallelism {args.restore_parallelism}: counts exact = {exact}"),
        ("top words", ", ".join(f"{w}={n}" for w, n in top)),
    ]
    print_summary("statetier demo: keyed word count through the backend", rows)
    if not exact:
        print("  ERROR: restored counts differ from the input")


def print_summary(title: str, rows: Sequence[tuple[str, str]]) -> None:
    """A demo's summary: the title, then one aligned ``name  value`` line per row."""
    width = max(len(name) for name, _ in rows)
    print(title)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--words", type=int, default=300_000, help="records to count")
    parser.add_argument("--vocabulary", type=int, default=50_000, help="distinct words")
    parser.add_argument("--batches", type=int, default=10, help="epochs (one checkpoint each)")
    parser.add_argument("--parallelism", type=int, default=2, help="function instances")
    parser.add_argument(
        "--restore-parallelism", type=int, default=3, help="instances that read the result back"
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the generated words")
    parser.add_argument(
        "--dir",
        default="statetier-demo-local",
        help="where the checkpoints go: a new or empty directory, or one this demo made",
    )
    parser.add_argument(
        "--restart", action="store_true", help="resume from the last checkpoint in --dir"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``statetier demo --local`` (the CLI takes ``--local`` off before calling this)."""
    parser = argparse.ArgumentParser(prog="statetier demo --local", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(list(argv or [])))

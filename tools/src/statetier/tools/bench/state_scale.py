"""``statetier bench state-scale``: keyed state from half to ten times a fixed memory budget.

A keyed word count at growing state sizes, one point per multiple of ``--budget`` (256 MiB by
default; steps 0.5x, 1x, 2x, 5x, 10x). At each point three peers do the same work, each in a
fresh child process:

- ``spilled``: statetier with spilling on and ``memory.budget`` = the budget (the process's
  governor keeps the state's heap estimate near ``spill.threshold`` of it);
- ``heap``: statetier with every key group on heap (spilling off);
- ``rocksdict``: the RocksDB peer, ``db[w] = db.get(w, 0) + 1`` per record.

Each child first *fills* the state: every word ``w0 .. w<keys-1>`` counted once, in slices of
100k records. State size is memory: the number of keys is the multiple of the budget over the
memory one key's state takes on heap, measured first in a fresh process (the growth of
anonymous RSS per key counted all on heap; the governor's heap estimate per key, somewhat
larger, is reported beside it; the heap peer's RSS says what the state really took).

Then the timed part: ``--records`` records drawn from a Zipf law (exponent 1.1 over all the
keys, rank 1 hottest; keys are hashed to key groups, so every key group holds hot and cold
words), each a read and an update of its key's count through ``FunctionInstance.process``.
Records are made in slices outside the timer. records/s is that part's rate; the spilled share
is the share of the 128 key groups on disk at its end; the counts of 2,000 keys (the 1,000
hottest and 1,000 spread over the key space) are checked.

Peak RSS, measured by the child itself: ``VmHWM`` (the kernel's high-water mark of the whole
RSS, which includes resident pages of the mmap'd spill files: page cache the kernel can write
back and drop) and the peak of anonymous RSS (``RssAnon``, the memory the process cannot give
back, which the governor bounds), sampled every 10 ms by a thread.

Rounds rotate the order of the peers at every point; records/s is the median of the rounds,
peak RSS the largest. Targets at the largest multiple: spilled >= 0.3x heap records/s and
>= 2x rocksdict, and the spilled child's peak anonymous RSS <= budget + memory.runtime-allowance.
``--only`` leaves peers out (the report lists the targets it could not judge). ``heap`` is left
out at a point whose state would not fit comfortably in the machine's available memory.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from statetier.backend.config import load_config, parse_size
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.helptext import plain
from statetier.backend.process_memory import read_rss
from statetier.backend.runtime import FunctionInstance
from statetier.tools.bench import print_table, run_child
from statetier.tools.bench.wordcount import state_bytes
from statetier.tools.wordcount import WordCount

PEERS = ("spilled", "heap", "rocksdict")
MULTIPLES = "0.5,1,2,5,10"
MAX_PARALLELISM = 128
SLICE = 100_000
EXPONENT = 1.1
CHECKED_KEYS = 1_000  # hottest, and as many spread over the key space
TARGET_VS_HEAP = 0.3
TARGET_VS_ROCKSDICT = 2.0
CALIBRATION_KEYS = 1_000_000
# heap runs only where twice its state fits in half the available memory
HEAP_ROOM = 4


# ---------------------------------------------------------------------- the workload


def fill_slices(keys: int) -> Iterator[list[str]]:
    """Every key once, in slices."""
    for low in range(0, keys, SLICE):
        yield [f"w{i}" for i in range(low, min(keys, low + SLICE))]


def draw_slices(keys: int, records: int, seed: int) -> Iterator[tuple[list[str], Any]]:
    """``records`` Zipf draws over ``keys`` in slices: (words, ranks as a numpy array).

    A truncated power law sampled by its inverse distribution (``floor`` of a continuous draw
    on [1, keys + 1)): no table of ``keys`` weights, which would sit in the measured RSS.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    span = 1 - (keys + 1) ** (1 - EXPONENT)
    for low in range(0, records, SLICE):
        u = rng.random(min(SLICE, records - low))
        ranks = np.floor((1 - u * span) ** (1 / (1 - EXPONENT))).astype(np.int64) - 1
        ranks = np.minimum(ranks, keys - 1)
        yield [f"w{r}" for r in ranks.tolist()], ranks


class _Expected:
    """The counts the checked keys must end with: 1 from the fill plus their draws."""

    def __init__(self, keys: int) -> None:
        import numpy as np

        self.stride = max(1, keys // CHECKED_KEYS)
        self.hot = np.zeros(min(keys, CHECKED_KEYS), dtype=np.int64)
        self.spread = np.zeros(keys // self.stride + 1, dtype=np.int64)
        self.keys = keys

    def add(self, ranks: Any) -> None:
        import numpy as np

        hot = ranks[ranks < len(self.hot)]
        self.hot += np.bincount(hot, minlength=len(self.hot))
        spread = ranks[ranks % self.stride == 0] // self.stride
        self.spread += np.bincount(spread, minlength=len(self.spread))

    def counts(self) -> dict[str, int]:
        expected = {f"w{r}": 1 + int(n) for r, n in enumerate(self.hot.tolist())}
        for i, n in enumerate(self.spread.tolist()):
            if i * self.stride < self.keys:
                expected[f"w{i * self.stride}"] = 1 + int(n)
        return expected


class _PeakAnon:
    """Samples anonymous RSS every 10 ms: /proc keeps a high-water mark of the whole RSS only."""

    def __init__(self) -> None:
        self.peak = read_rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, read_rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, read_rss())


def vm_hwm() -> int:
    """The kernel's high-water mark of this process's RSS, in bytes."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------------- one child


def _timed(apply: Callable[[list[str]], None], args: argparse.Namespace) -> dict[str, Any]:
    """Fill, then the timed draws; the counts the checked keys must have."""
    started = time.perf_counter()
    for words in fill_slices(args.keys):
        apply(words)
    fill = time.perf_counter() - started
    expected = _Expected(args.keys)
    seconds = 0.0
    for words, ranks in draw_slices(args.keys, args.records, args.seed):
        expected.add(ranks)
        started = time.perf_counter()
        apply(words)
        seconds += time.perf_counter() - started
    return {
        "fill_records_per_s": round(args.keys / fill),
        "records_per_s": round(args.records / seconds),
        "seconds": round(seconds, 3),
        "expected": expected.counts(),
    }


def _statetier(peer: str, args: argparse.Namespace) -> dict[str, Any]:
    config = None
    spill_dir = tempfile.mkdtemp(prefix="statetier-bench-scale-", dir=args.spill_dir)
    if peer == "spilled":
        config = load_config(
            {
                "spill.enabled": True,
                "spill.dirs": spill_dir,
                "memory.budget": args.budget,
                "spill.check-interval": args.check_interval,
            },
            env={},
        )
    instance = FunctionInstance(WordCount, 0, 1, MAX_PARALLELISM, config=config)
    try:

        def apply(words: list[str]) -> None:
            instance.process((word, 1) for word in words)
            instance.keyed.drain_touched_keys()  # the end of a micro-batch, as a checkpoint

        result = _timed(apply, args)
        heap, spilled, spilled_kgs = state_bytes(instance)
        state = instance.keyed.get_state(ValueStateDescriptor[int]("count"))
        got = {}
        for key in result["expected"]:
            instance.keyed.set_current_key(key)
            got[key] = state.value()
        result.update(
            heap_bytes=heap,
            spilled_bytes=spilled,
            spilled_share=round(spilled_kgs / MAX_PARALLELISM, 3),
            # the chunk files (index, log and free space), beside the data's own bytes
            spill_disk_bytes=0 if instance.spill is None else instance.spill.storage.disk_bytes(),
            counts_ok=got == result.pop("expected"),
        )
        return result
    finally:
        instance.close()
        shutil.rmtree(spill_dir, ignore_errors=True)


def _rocksdict(args: argparse.Namespace) -> dict[str, Any]:
    from rocksdict import Rdict

    path = tempfile.mkdtemp(prefix="statetier-bench-scale-rocksdb-", dir=args.spill_dir)
    db = Rdict(path)
    try:
        get = db.get

        def apply(words: list[str]) -> None:
            for word in words:
                db[word] = get(word, 0) + 1  # type: ignore[operator]

        result = _timed(apply, args)
        expected = result.pop("expected")
        result["counts_ok"] = {key: db.get(key) for key in expected} == expected
        return result
    finally:
        db.close()
        Rdict.destroy(path)
        shutil.rmtree(path, ignore_errors=True)


def child(peer: str, args: argparse.Namespace) -> dict[str, Any]:
    """One peer at one size, in this (fresh) process, with its peak RSS."""
    # libraries first: the anonymous RSS at the start is then the runtime, not the state
    importlib.import_module("numpy")
    importlib.import_module("rocksdict" if peer == "rocksdict" else "xxhash")
    sampler = _PeakAnon()
    start = sampler.peak
    result = _rocksdict(args) if peer == "rocksdict" else _statetier(peer, args)
    result["peak_anon_rss_bytes"] = sampler.stop()
    result["peak_rss_bytes"] = vm_hwm()
    result["start_anon_rss_bytes"] = start  # the runtime, before any state
    return result


def _run_child(peer: str, keys: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "statetier.tools.bench.state_scale",
        "--peer",
        peer,
        "--keys",
        str(keys),
        "--budget",
        str(args.budget),
        "--records",
        str(args.records),
        "--seed",
        str(args.seed),
        "--check-interval",
        str(args.check_interval),
        *(["--spill-dir", args.spill_dir] if args.spill_dir else []),
    ]
    return run_child(command, f"state-scale: {peer} with {keys:,} keys")[0]


# ---------------------------------------------------------------------- the parent


def calibrate() -> dict[str, float]:
    """Memory of one key's state on heap, measured in this (fresh) process: the growth of
    anonymous RSS over ``CALIBRATION_KEYS`` words counted all on heap, and the heap estimate
    the governor weighs against the budget (an over-estimate: it counts shared small ints)."""
    instance = FunctionInstance(WordCount, 0, 1, MAX_PARALLELISM)
    try:
        before = read_rss()
        start = 10 * CALIBRATION_KEYS  # keys of the length of most keys at millions of words
        for low in range(start, start + CALIBRATION_KEYS, SLICE):
            instance.process((f"w{i}", 1) for i in range(low, low + SLICE))
            instance.keyed.drain_touched_keys()
        grown = read_rss() - before
        heap, _, _ = state_bytes(instance)
        return {
            "bytes_per_key": grown / CALIBRATION_KEYS,
            "estimate_per_key": heap / CALIBRATION_KEYS,
        }
    finally:
        instance.close()


def available_memory() -> int:
    """MemAvailable of the machine, in bytes (0 if unknown: then heap always runs)."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median rate over the rounds, largest peak RSS, the last round's state figures."""
    last = runs[-1]
    summary = {
        "records_per_s": round(statistics.median(r["records_per_s"] for r in runs)),
        "rounds_records_per_s": [r["records_per_s"] for r in runs],
        "fill_records_per_s": round(statistics.median(r["fill_records_per_s"] for r in runs)),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
        "peak_anon_rss_bytes": max(r["peak_anon_rss_bytes"] for r in runs),
        "start_anon_rss_bytes": max(r["start_anon_rss_bytes"] for r in runs),
        "counts_ok": all(r["counts_ok"] for r in runs),
    }
    for name in ("heap_bytes", "spilled_bytes", "spilled_share", "spill_disk_bytes"):
        if name in last:
            summary[name] = last[name]
    return summary


def _point(
    multiple: float, keys: int, peers: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {peer: [] for peer in peers}
    for r in range(args.rounds):
        for peer in peers[r % len(peers) :] + peers[: r % len(peers)]:
            runs[peer].append(_run_child(peer, keys, args))
    point: dict[str, Any] = {"multiple": multiple, "keys": keys}
    point["peers"] = {peer: _summary(done) for peer, done in runs.items()}
    return point


def _ratios(point: dict[str, Any]) -> dict[str, float]:
    peers = point["peers"]
    ratios = {}
    if "spilled" in peers:
        rate = peers["spilled"]["records_per_s"]
        for other in ("heap", "rocksdict"):
            if other in peers:
                ratios[f"spilled_vs_{other}"] = rate / peers[other]["records_per_s"]
    return ratios


def _checks(top: dict[str, Any], bound: int) -> tuple[dict[str, bool], list[str]]:
    """The targets at the largest multiple (judged before rounding), and those not measured."""
    ratios = _ratios(top)
    peers = top["peers"]
    checks: dict[str, bool] = {}
    unmeasured = []
    for name, target in (
        ("spilled_vs_heap", TARGET_VS_HEAP),
        ("spilled_vs_rocksdict", TARGET_VS_ROCKSDICT),
    ):
        if name in ratios:
            checks[name] = ratios[name] >= target
        else:
            unmeasured.append(name)
    if "spilled" in peers:
        checks["spilled_peak_anon_rss_within_budget_plus_allowance"] = (
            peers["spilled"]["peak_anon_rss_bytes"] <= bound
        )
    else:
        unmeasured.append("spilled_peak_anon_rss_within_budget_plus_allowance")
    return checks, unmeasured


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(args: argparse.Namespace, multiples: list[float], only: list[str]) -> dict[str, Any]:
    load_at_start = _load()  # the machine may be shared: the report says how busy
    calibration = _run_child("calibrate", 0, args)
    per_key = calibration["bytes_per_key"]
    allowance = load_config({}, env={}).memory_runtime_allowance
    available = available_memory()
    points = []
    for multiple in multiples:
        keys = max(1, round(multiple * args.budget / per_key))
        state = keys * per_key
        fits = not available or HEAP_ROOM * state <= available
        peers = [p for p in only if p != "heap" or fits]
        point = _point(multiple, keys, peers, args)
        point["state_bytes"] = round(state)
        if "heap" in only and not fits:
            point["heap_skipped"] = f"{HEAP_ROOM}x its state passes the available memory"
        point["ratios"] = {name: round(value, 3) for name, value in _ratios(point).items()}
        points.append(point)
    checks, unmeasured = _checks(points[-1], args.budget + allowance)
    counts_ok = all(p["counts_ok"] for point in points for p in point["peers"].values())
    checks["counts_ok"] = counts_ok
    return {
        "benchmark": "state-scale",
        "load_average": {"start": load_at_start, "end": _load()},
        "budget_bytes": args.budget,
        "runtime_allowance_bytes": allowance,
        "bytes_per_key": round(per_key, 1),
        "estimate_bytes_per_key": round(calibration["estimate_per_key"], 1),
        "records": args.records,
        "zipf_exponent": EXPONENT,
        "rounds": args.rounds,
        "points": points,
        "targets": {
            "spilled_vs_heap": TARGET_VS_HEAP,
            "spilled_vs_rocksdict": TARGET_VS_ROCKSDICT,
            "spilled_peak_anon_rss_bytes": args.budget + allowance,
        },
        "checks": checks,
        "unmeasured_targets": unmeasured,
        "missed_targets": [name for name, ok in checks.items() if not ok],
        "meets_targets": all(checks.values()),
    }


def _mib(value: int) -> str:
    return f"{value / (1 << 20):,.0f}"


def _real_multiple(heap: dict[str, Any], budget: int) -> float:
    """What the state took on the heap peer (its anonymous RSS growth) over the budget."""
    return float(heap["peak_anon_rss_bytes"] - heap["start_anon_rss_bytes"]) / budget


def _print(report: dict[str, Any]) -> None:
    rows = []
    for point in report["points"]:
        peers = point["peers"]

        def rate(name: str, peers: dict[str, Any] = peers) -> str:
            return f"{peers[name]['records_per_s']:,}" if name in peers else "-"

        spilled = peers.get("spilled", {})
        rows.append(
            [
                f"{point['multiple']:g}x",
                f"{point['keys']:,}",
                rate("spilled"),
                rate("heap"),
                rate("rocksdict"),
                f"{spilled['spilled_share']:.0%}" if spilled else "-",
                _mib(spilled["peak_anon_rss_bytes"]) if spilled else "-",
                _mib(spilled["peak_rss_bytes"]) if spilled else "-",
                _mib(peers["heap"]["peak_rss_bytes"]) if "heap" in peers else "-",
                f"{_real_multiple(peers['heap'], report['budget_bytes']):.1f}x"
                if "heap" in peers
                else "-",
                f"{point['ratios'].get('spilled_vs_heap', float('nan')):.2f}",
                f"{point['ratios'].get('spilled_vs_rocksdict', float('nan')):.2f}",
            ]
        )
    print_table(
        f"state-scale: budget {_mib(report['budget_bytes'])} MiB (+ runtime allowance "
        f"{_mib(report['runtime_allowance_bytes'])} MiB), {report['bytes_per_key']} bytes "
        f"per key, {report['records']:,} Zipf({report['zipf_exponent']}) read-update records "
        f"per point, median of {report['rounds']} rounds",
        [
            "state",
            "keys",
            "spilled rec/s",
            "heap rec/s",
            "rocksdict rec/s",
            "spilled kgs",
            "spilled peak anon MiB",
            "spilled VmHWM MiB",
            "heap VmHWM MiB",
            "heap state",
            "vs heap",
            "vs rocksdict",
        ],
        rows,
    )
    load = report["load_average"]
    print(
        "  load average (1, 5, 15 min): "
        + " at the start, ".join(", ".join(f"{x:.2f}" for x in load[at]) for at in ("start", "end"))
        + " at the end"
    )
    for point in report["points"]:
        if "heap_skipped" in point:
            print(f"  heap at {point['multiple']:g}x not run: {point['heap_skipped']}")
    if report["unmeasured_targets"]:
        print(f"  not measured (left out): {', '.join(report['unmeasured_targets'])}")
    missed = report["missed_targets"]
    print(
        "  targets at the largest size: "
        + ("all met" if not missed else "MISSED " + ", ".join(missed))
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="statetier bench state-scale", description=plain(__doc__))
    parser.add_argument(
        "--budget", type=parse_size, default=256 << 20, help="memory budget (default 256m)"
    )
    parser.add_argument(
        "--multiples", default=MULTIPLES, help=f"state sizes in budgets (default {MULTIPLES})"
    )
    parser.add_argument("--records", type=int, default=2_000_000, help="timed records per point")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--check-interval", type=float, default=0.1)
    parser.add_argument("--spill-dir", help="where spill files and RocksDB go (default: temp dir)")
    parser.add_argument(
        "--only", default=",".join(PEERS), help="comma-separated peers to run (default: all)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--peer", choices=[*PEERS, "calibrate"], help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer == "calibrate":
        print(json.dumps(calibrate()))
        return 0
    if args.peer:
        print(json.dumps(child(args.peer, args)))
        return 0
    only = [peer for peer in PEERS if peer in args.only.split(",")]
    unknown = set(args.only.split(",")) - set(PEERS)
    if unknown or not only:
        parser.error(f"--only: unknown peers {', '.join(sorted(unknown)) or '(none given)'}")
    try:
        multiples = sorted(float(m) for m in args.multiples.split(","))
    except ValueError:
        parser.error(f"--multiples: not a list of numbers: {args.multiples!r}")
    if not multiples or multiples[0] <= 0 or args.records < 1 or args.rounds < 1:
        parser.error("--multiples must be > 0, --records and --rounds >= 1")
    report = run(args, multiples, only)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0 if report["meets_targets"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""``statetier bench state``: per-record keyed-state operations against a plain dict.

The peer is the same word count done on a Python dict (``d[w] = d.get(w, 0) + 1``), the fastest
thing pure Python can do. statetier does it through the public per-record API, the way the
runtime drives it (``FunctionInstance.process``): the runtime sets the current key, user code
reads the ValueState and updates it. Target: at least 25% of the dict.
ListState and MapState, and a whole KeyedProcessFunction run by an FunctionInstance, are
reported beside it for reference.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from statetier.backend.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from statetier.backend.helptext import plain
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.runtime import FunctionInstance
from statetier.tools.bench import median_rate, print_table
from statetier.tools.wordcount import WordCount
from statetier.tools.workloads import zipf_words

TARGET_RATIO = 0.25


def run(records: int, repeats: int) -> dict[str, object]:
    words = zipf_words(records, 200_000, seed=11)
    max_parallelism = 128

    def plain_dict() -> int:
        counts: dict[str, int] = {}
        for word in words:
            counts[word] = counts.get(word, 0) + 1
        return len(words)

    def value_state() -> int:
        backend = KeyedStateBackend(KeyGroupRange.of(max_parallelism), max_parallelism)
        count = backend.get_state(ValueStateDescriptor[int]("count"))
        set_current_key = backend.set_current_key  # hoisted, as FunctionInstance.process does
        for word in words:
            set_current_key(word)
            count.update((count.value() or 0) + 1)
        return len(words)

    def list_state() -> int:
        backend = KeyedStateBackend(KeyGroupRange.of(max_parallelism), max_parallelism)
        seen = backend.get_state(ListStateDescriptor[int]("seen"))
        set_current_key = backend.set_current_key
        for position, word in enumerate(words):
            set_current_key(word)
            seen.add(position)
        return len(words)

    def map_state() -> int:
        backend = KeyedStateBackend(KeyGroupRange.of(max_parallelism), max_parallelism)
        lengths = backend.get_state(MapStateDescriptor("by_length"))
        set_current_key = backend.set_current_key
        for word in words:
            set_current_key(word)
            lengths.put(len(word), (lengths.get(len(word)) or 0) + 1)
        return len(words)

    def keyed_function() -> int:
        instance = FunctionInstance(WordCount, 0, 1, max_parallelism)
        instance.process((word, 1) for word in words)
        return len(words)

    modes = {}
    for name, work in [
        ("dict", plain_dict),
        ("value_state", value_state),
        ("list_state_add", list_state),
        ("map_state_put", map_state),
        ("keyed_function", keyed_function),
    ]:
        median, rates = median_rate(work, repeats)
        modes[name] = {"records_per_s": round(median), "runs": [round(r) for r in rates]}
    ratio = modes["value_state"]["records_per_s"] / modes["dict"]["records_per_s"]  # type: ignore[operator]
    return {
        "records": records,
        "repeats": repeats,
        "modes": modes,
        "value_state_to_dict": round(ratio, 3),
        "target": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="statetier bench state", description=plain(__doc__))
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run(args.records, args.repeats)
    if args.json:
        print(json.dumps(result))
    else:
        modes = result["modes"]
        assert isinstance(modes, dict)
        dict_rate = modes["dict"]["records_per_s"]
        rows = [
            [name, f"{m['records_per_s']:,}", f"{m['records_per_s'] / dict_rate:.2f}"]
            for name, m in modes.items()
        ]
        print_table(
            f"keyed state, per-record API, {args.records:,} Zipf words, median of {args.repeats}",
            ["mode", "records/s", "vs dict"],
            rows,
        )
        verdict = "meets" if result["meets_target"] else "MISSES"
        print(
            f"  ValueState/dict = {result['value_state_to_dict']:.2f} "
            f"({verdict} target {TARGET_RATIO})"
        )
    return 0 if result["meets_target"] else 1

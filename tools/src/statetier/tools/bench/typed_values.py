"""``statetier bench typed-values``: typed state values against msgpack of a tuple.

A typed value (a dataclass of a str, two ints, a float and a list of str) is written by field
name and read back as its dataclass, checked against its declared type on the way in. The peer
is the same fields as a tuple through the default serializer (what a schemaless state stores),
and, for reference, through bare ``msgpack.packb``/``unpackb`` (an array, no tuple type, no
checks). A third typed mode reads bytes written by an older version of the type (one field
fewer, an int later widened to float): the evolved read. Each mode is one write and one read
per value, as a spill and a load of a key group do. Target: the typed round trip at least 40%
of the default serializer's on the tuple.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
from statetier.backend.helptext import plain
from statetier.backend.serializers import MsgpackSerializer
from statetier.backend.typed.serializer import TypedSerializer
from statetier.tools.bench import median_rate, print_table

TARGET_RATIO = 0.4


@dataclasses.dataclass
class Session:
    user: str
    clicks: int
    last_ms: int
    score: float
    pages: list[str]


@dataclasses.dataclass
class SessionBefore:  # the same without score, and last_ms still an int
    user: str
    clicks: int
    last_ms: int
    pages: list[str]


@dataclasses.dataclass
class SessionAfter:  # score added with a default, last_ms widened
    user: str
    clicks: int
    last_ms: float
    score: float = 0.0
    pages: list[str] = dataclasses.field(default_factory=list)


def _round_trip(
    dumps: Callable[[Any], bytes], loads: Callable[[bytes], Any], values: list[Any]
) -> Callable[[], int]:
    def work() -> int:
        for value in values:
            loads(dumps(value))
        return len(values)

    return work


def _evolved(stored: list[bytes], loads: Callable[[bytes], Any]) -> Callable[[], int]:
    def work() -> int:
        for data in stored:
            loads(data)
        return len(stored)

    return work


def run(values: int, repeats: int) -> dict[str, object]:
    sessions = [
        Session(f"user{i}", i, 1_700_000_000_000 + i, i / 7, ["/", f"/p{i % 50}"])
        for i in range(values)
    ]
    tuples = [dataclasses.astuple(s) for s in sessions]
    typed, default = TypedSerializer(Session), MsgpackSerializer()
    before = TypedSerializer(SessionBefore)
    stored = [before.dumps(SessionBefore(s.user, s.clicks, s.last_ms, s.pages)) for s in sessions]
    after = TypedSerializer(SessionAfter)
    assert after.loads(stored[1]) == SessionAfter(
        "user1", 1, float(sessions[1].last_ms), 0.0, ["/", "/p1"]
    )
    raw_dumps = msgpack.Packer(use_bin_type=True).pack

    modes: dict[str, dict[str, Any]] = {}
    for name, work in [
        ("msgpack_tuple", _round_trip(default.dumps, default.loads, tuples)),
        ("raw_msgpack_array", _round_trip(raw_dumps, msgpack.unpackb, tuples)),
        ("typed_dataclass", _round_trip(typed.dumps, typed.loads, sessions)),
        ("typed_read_evolved", _evolved(stored, after.loads)),
    ]:
        median, rates = median_rate(work, repeats)
        modes[name] = {"values_per_s": round(median), "runs": [round(r) for r in rates]}
    ratio = modes["typed_dataclass"]["values_per_s"] / modes["msgpack_tuple"]["values_per_s"]
    return {
        "values": values,
        "repeats": repeats,
        "bytes_per_value": {
            "msgpack_tuple": len(default.dumps(tuples[0])),
            "typed_dataclass": len(typed.dumps(sessions[0])),
        },
        "modes": modes,
        "typed_to_msgpack_tuple": round(ratio, 3),
        "target": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="statetier bench typed-values", description=plain(__doc__)
    )
    parser.add_argument("--values", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run(args.values, args.repeats)
    if args.json:
        print(json.dumps(result))
        return 0 if result["meets_target"] else 1
    modes = result["modes"]
    assert isinstance(modes, dict)
    base = modes["msgpack_tuple"]["values_per_s"]
    rows = [
        [name, f"{m['values_per_s']:,}", f"{m['values_per_s'] / base:.2f}"]
        for name, m in modes.items()
    ]
    print_table(
        f"typed values, write + read, {args.values:,} values, median of {args.repeats}",
        ["mode", "values/s", "vs msgpack tuple"],
        rows,
    )
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(
        f"  typed/msgpack tuple = {result['typed_to_msgpack_tuple']:.2f} ({verdict} the target "
        f"{TARGET_RATIO}); bytes per value {result['bytes_per_value']}"
    )
    return 0 if result["meets_target"] else 1

"""Checkpoint at parallelism 4, restore at 1 and 8: keyed and operator state follow the keys."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterable

from statetier.backend import (
    KeyedProcessFunction,
    ListStateDescriptor,
    RuntimeContext,
    ValueState,
    ValueStateDescriptor,
)
from statetier.backend.testing import FunctionHarness


class Totals(KeyedProcessFunction[str, int, None]):
    total: ValueState[int]

    def open(self, context: RuntimeContext) -> None:
        self.total = context.get_state(ValueStateDescriptor[int]("total"))
        self.offsets = context.get_list_state(ListStateDescriptor[int]("offsets"))
        if not context.is_restored:
            self.offsets.add(context.index)  # one element per instance of the first run
        self.restored_offsets = self.offsets.get()

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[None]:
        self.total.update((self.total.value() or 0) + value)
        return ()


def totals(harness: FunctionHarness) -> dict[str, int]:
    return {key: harness.state("total", key) for key in harness.keys("total")}


def main() -> int:
    uri = "file://" + tempfile.mkdtemp(prefix="statetier-rescale-")
    records = [(f"user{i % 50}", i) for i in range(1000)]
    with FunctionHarness(Totals, parallelism=4, checkpoint_uri=uri) as first:
        first.process_all(records)
        first.checkpoint()
        expected = totals(first)
    for parallelism in (1, 8):
        with FunctionHarness(Totals, parallelism=parallelism, checkpoint_uri=uri) as harness:
            assert totals(harness) == expected
            offsets = [f.restored_offsets for f in harness.functions if isinstance(f, Totals)]
            print(f"parallelism {parallelism}: {len(expected)} keys restored, offsets {offsets}")
            assert sorted(o for part in offsets for o in part) == [0, 1, 2, 3]
    return 0


if __name__ == "__main__":
    sys.exit(main())

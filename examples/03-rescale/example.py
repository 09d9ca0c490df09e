"""Checkpoint at parallelism 4, restore at 1 and 8: keyed and operator state follow the keys."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterable

from statetier.backend import ListStateDescriptor, ValueState, ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.local_runner import LocalRunner


class Totals(KeyedProcessFunction[str, int, None]):
    total: ValueState[int]

    def open(self, context: RuntimeContext) -> None:
        self.total = context.get_state(ValueStateDescriptor[int]("total"))
        self.offsets = context.get_list_state(ListStateDescriptor[int]("offsets"))
        if not context.is_restored:
            self.offsets.add(context.index)  # one element per instance of the first run

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[None]:
        self.total.update((self.total.value() or 0) + value)
        return ()


def totals(runner: LocalRunner) -> dict[str, int]:
    result: dict[str, int] = {}
    for instance in runner.instances:
        state = instance.keyed.get_state(ValueStateDescriptor[int]("total"))
        for key in instance.keyed.keys("total"):
            instance.keyed.set_current_key(key)
            result[key] = state.value() or 0
    return result


def main() -> int:
    uri = "file://" + tempfile.mkdtemp(prefix="statetier-rescale-")
    records = [(f"user{i % 50}", i) for i in range(1000)]
    first = LocalRunner(Totals, parallelism=4, checkpoint_uri=uri)
    first.run_epoch(records)
    expected = totals(first)
    for parallelism in (1, 8):
        runner = LocalRunner(Totals, parallelism=parallelism, checkpoint_uri=uri)
        assert totals(runner) == expected
        offsets = [i.operator.states["offsets"].state.get() for i in runner.instances]
        print(f"parallelism {parallelism}: {len(expected)} keys restored, offsets {offsets}")
        assert sorted(o for part in offsets for o in part) == [0, 1, 2, 3]
    return 0


if __name__ == "__main__":
    sys.exit(main())

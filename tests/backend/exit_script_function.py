"""The function of test_runner_exit's script, importable by the script's process."""

from __future__ import annotations

from collections.abc import Iterable

from statetier.backend import KeyedProcessFunction, RuntimeContext, ValueState, ValueStateDescriptor


class Count(KeyedProcessFunction[str, int, tuple[str, int]]):
    count: ValueState[int]

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[tuple[str, int]]:
        total = (self.count.value() or 0) + value
        self.count.update(total)
        return [(key, total)]

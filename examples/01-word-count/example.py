"""Count words with ValueState, one checkpoint per epoch, on the embedded local store."""

from __future__ import annotations

import collections
import sys
import tempfile
from collections.abc import Iterable

from statetier.backend import (
    KeyedProcessFunction,
    LocalRunner,
    RuntimeContext,
    ValueState,
    ValueStateDescriptor,
)


class WordCount(KeyedProcessFunction[str, int, tuple[str, int]]):
    count: ValueState[int]

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[tuple[str, int]]:
        total = (self.count.value() or 0) + value
        self.count.update(total)
        return [(key, total)]


def main() -> int:
    text = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "the", "end"]
    uri = "file://" + tempfile.mkdtemp(prefix="statetier-example-")
    runner = LocalRunner(WordCount, parallelism=2, checkpoint_uri=uri)
    latest: dict[str, int] = {}
    try:
        for epoch in range(3):
            for word, total in runner.run_epoch((w, 1) for w in text):
                latest[word] = total
            print(f"epoch {epoch + 1}: the={latest['the']}")
    finally:
        runner.close()  # waits for the checkpoint's background work (retention) to finish
    expected = {w: 3 * n for w, n in collections.Counter(text).items()}
    assert latest == expected, (latest, expected)
    print(f"final counts match ({len(latest)} words); checkpoint at {uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

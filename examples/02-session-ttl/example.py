"""Sessions that expire: MapState with TTL, driven by the test harness's manual clock."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from statetier.backend import (
    KeyedProcessFunction,
    MapState,
    MapStateDescriptor,
    RuntimeContext,
    StateTtlConfig,
    UpdateType,
)
from statetier.backend.testing import FunctionHarness


class PageVisits(KeyedProcessFunction[str, str, None]):
    """Counts each user's visits per page; a page not visited for 30 s is forgotten."""

    pages: MapState[str, int]

    def open(self, context: RuntimeContext) -> None:
        ttl = StateTtlConfig(ttl_ms=30_000, update_type=UpdateType.ON_READ_AND_WRITE)
        self.pages = context.get_state(MapStateDescriptor("pages", ttl=ttl))

    def process(self, key: str, value: str, context: RuntimeContext) -> Iterable[None]:
        self.pages.put(value, (self.pages.get(value) or 0) + 1)
        return ()


def main() -> int:
    with FunctionHarness(PageVisits) as harness:
        harness.process("alice", "/home")
        harness.clock.advance(20_000)
        harness.process("alice", "/cart")
        harness.clock.advance(15_000)  # /home is 35 s old: expired; /cart is 15 s old
        visible: dict[str, Any] = harness.state("pages", "alice")
        print(f"after 35 s: {visible}")
        assert visible == {"/cart": 1}
        harness.clock.advance(31_000)
        assert harness.state("pages", "alice") == {}
        print("after 66 s: no pages left")
    return 0


if __name__ == "__main__":
    sys.exit(main())

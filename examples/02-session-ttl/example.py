"""Sessions that expire: MapState with TTL, a manual clock, and incremental cleanup."""

from __future__ import annotations

import sys

from statetier.backend import (
    KeyedStateBackend,
    KeyGroupRange,
    ManualClock,
    MapStateDescriptor,
    StateTtlConfig,
    UpdateType,
)


def main() -> int:
    clock = ManualClock()
    backend = KeyedStateBackend(KeyGroupRange(0, 127), 128, clock=clock)
    pages = backend.get_state(
        MapStateDescriptor(
            "pages",
            ttl=StateTtlConfig(ttl_ms=30_000, update_type=UpdateType.ON_READ_AND_WRITE),
        )
    )
    backend.set_current_key("alice")
    pages.put("/home", 1)
    clock.advance(20_000)
    pages.put("/cart", 1)
    clock.advance(15_000)  # /home is 35 s old: expired; /cart is 15 s old
    visible = dict(pages.items())
    print(f"after 35 s: {visible}")
    assert visible == {"/cart": 1}
    clock.advance(31_000)
    assert pages.is_empty()
    print("after 66 s: no pages left")
    return 0


if __name__ == "__main__":
    sys.exit(main())

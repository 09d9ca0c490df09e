"""What each key group costs and how often it is used: the inputs of the spill/load policy.

- Heap size: approximate, as FLIP-50 does (Lucene's RamUsageEstimator there): the policy only
  compares key groups, so an entry count times a sampled entry size
  (:meth:`StateTable.estimate_size`) is enough, and it is refreshed at each monitor check
  instead of on every write, which keeps the per-record path free of it.
- Spilled size: exact, the serialized bytes the spilled maps hold (they keep the figure as they
  change).
- Request rate: a per-key-group hit counter bumped once per record (one list increment, only
  while spilling is enabled), folded at each check into an exponentially decayed rate
  (half-life ``half_life`` seconds), so that a key group that was hot an hour ago does not keep
  its place on heap forever.
"""

from __future__ import annotations

import math

__all__ = ["KeyGroupAccounting"]


class KeyGroupAccounting:
    """Sizes and decayed request rates of the key groups of one backend, by slot."""

    def __init__(self, slots: int, now: float, *, half_life: float = 30.0) -> None:
        self.slots = slots
        self.half_life = half_life
        # +1: the slot of the "no current key" sentinel, so the per-record increment needs no check
        self.hits: list[int] = [0] * (slots + 1)
        self.rates: list[float] = [0.0] * slots
        self.heap_bytes: list[int] = [0] * slots
        self.spilled_bytes: list[int] = [0] * slots
        # heap estimate taken when a key group was spilled, scaled by its spilled size since:
        # what loading it back would cost the heap
        self._heap_at_spill: list[tuple[int, int]] = [(0, 0)] * slots
        self._folded_at = now

    def fold(self, now: float) -> None:
        """Turn the hits since the last fold into decayed per-second rates."""
        elapsed = max(now - self._folded_at, 1e-6)
        self._folded_at = now
        keep = math.exp(-elapsed * math.log(2) / self.half_life)
        hits, rates = self.hits, self.rates
        for slot in range(self.slots):
            rates[slot] = rates[slot] * keep + (1 - keep) * hits[slot] / elapsed
            hits[slot] = 0

    def record_spill(self, slot: int, heap_bytes: int, spilled_bytes: int) -> None:
        self._heap_at_spill[slot] = (heap_bytes, max(spilled_bytes, 1))
        self.heap_bytes[slot] = 0
        self.spilled_bytes[slot] = spilled_bytes

    def record_load(self, slot: int, heap_bytes: int) -> None:
        self.heap_bytes[slot] = heap_bytes
        self.spilled_bytes[slot] = 0

    def heap_if_loaded(self, slot: int) -> int:
        """Estimated heap bytes of a spilled key group once loaded back."""
        heap, spilled_then = self._heap_at_spill[slot]
        return heap * self.spilled_bytes[slot] // spilled_then

    def total_heap(self) -> int:
        return sum(self.heap_bytes)

    def total_spilled(self) -> int:
        return sum(self.spilled_bytes)

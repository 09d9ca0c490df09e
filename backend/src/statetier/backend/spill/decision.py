"""A move of key groups between heap and the spill tier, as chosen and as logged.

The governor chooses moves (an :class:`Order` per backend) and each backend's spill manager
carries them out and reports a :class:`Decision`. Both sit above this module, so neither needs
the other's module for the types they exchange. Which way and why are enums (:class:`Move`,
:class:`Trigger`); ``reason`` is the same in words, for the log only.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from statetier.backend.spill.monitor import Move, Trigger
from statetier.backend.spill.policy import Candidate

__all__ = ["Choice", "Decision", "Order"]

# The key groups chosen for one backend, each with its policy score.
Choice = list[tuple[Candidate, float]]


@dataclasses.dataclass(frozen=True)
class Order:
    """A move the governor chose for one backend: which key groups, which way and why."""

    action: Move
    trigger: Trigger
    reason: str  # the monitor's words, for the log
    choice: Choice

    @property
    def heap_bytes(self) -> int:
        """Heap the move frees (a spill, positive) or takes (a load, negative), estimated."""
        size = sum(c.size for c, _ in self.choice)
        return size if self.action is Move.SPILL else -size


@dataclasses.dataclass(frozen=True)
class Decision:
    """One move of key groups, as logged: what moved where, why, and what it cost."""

    action: Move
    reason: str
    key_groups: list[int]
    scores: list[float]
    heap_bytes: int  # heap freed (spill) or taken (load), estimated
    seconds: float
    failed: list[int] = dataclasses.field(default_factory=list)
    at: float = dataclasses.field(default_factory=time.monotonic)  # when the move ended
    trigger: Trigger = Trigger.FORCED
    manager: Any = dataclasses.field(default=None, repr=False, compare=False)

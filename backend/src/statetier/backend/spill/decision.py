"""A move of key groups between heap and the spill tier, as chosen and as logged.

The governor chooses moves (a :data:`Choice` per backend) and each backend's spill manager
carries them out and reports a :class:`Decision`. Both sit above this module, so neither needs
the other's module for the types they exchange.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from statetier.backend.spill.monitor import Trigger
from statetier.backend.spill.policy import Candidate

__all__ = ["Choice", "Decision"]

# The key groups chosen for one backend, each with its policy score.
Choice = list[tuple[Candidate, float]]


@dataclasses.dataclass(frozen=True)
class Decision:
    """One move of key groups, as logged: what moved where, why, and what it cost."""

    action: str  # spill or load
    reason: str
    key_groups: list[int]
    scores: list[float]
    heap_bytes: int  # heap freed (spill) or taken (load), estimated
    seconds: float
    failed: list[int] = dataclasses.field(default_factory=list)
    at: float = dataclasses.field(default_factory=time.monotonic)  # when the move ended
    trigger: Trigger = Trigger.FORCED
    manager: Any = dataclasses.field(default=None, repr=False, compare=False)

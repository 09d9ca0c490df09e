"""Which key groups to spill or load: FLIP-50's weighted score of size and request rate.

Both inputs are normalized by their maximum over the candidates, then weighted by
``spill.size-weight`` (``w``):

- spill score = ``w * size + (1 - w) * (1 - rate)``: large, cold key groups first, because they
  free the most heap for the least disk traffic afterwards;
- load score  = ``w * (1 - size) + (1 - w) * rate``: small, hot key groups first, because they
  save the most disk reads for the least heap.

Candidates are taken in score order until the requested bytes are covered (spill) or the next
one would not fit (load). Pure functions over plain numbers, so the policy is tested on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["Candidate", "choose_load", "choose_spill", "load_scores", "spill_scores"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A key group as the policy sees it: heap bytes it holds (or would hold), requests/s."""

    key_group: int
    size: int
    rate: float


def _normalized(candidates: Sequence[Candidate]) -> list[tuple[Candidate, float, float]]:
    max_size = max((c.size for c in candidates), default=0) or 1
    max_rate = max((c.rate for c in candidates), default=0.0) or 1.0
    return [(c, c.size / max_size, c.rate / max_rate) for c in candidates]


def spill_scores(
    candidates: Sequence[Candidate], size_weight: float
) -> list[tuple[Candidate, float]]:
    """Candidates with their spill scores, best first (ties: lower key group first)."""
    scored = [
        (c, size_weight * size + (1 - size_weight) * (1 - rate))
        for c, size, rate in _normalized(candidates)
    ]
    return sorted(scored, key=lambda pair: (-pair[1], pair[0].key_group))


def load_scores(
    candidates: Sequence[Candidate], size_weight: float
) -> list[tuple[Candidate, float]]:
    """Candidates with their load scores, best first (ties: lower key group first)."""
    scored = [
        (c, size_weight * (1 - size) + (1 - size_weight) * rate)
        for c, size, rate in _normalized(candidates)
    ]
    return sorted(scored, key=lambda pair: (-pair[1], pair[0].key_group))


def choose_spill(
    candidates: Sequence[Candidate], amount: int, size_weight: float
) -> list[tuple[Candidate, float]]:
    """The best-scored key groups whose sizes add up to at least ``amount`` bytes.

    Empty key groups are never chosen: spilling them frees nothing.
    """
    chosen: list[tuple[Candidate, float]] = []
    covered = 0
    for candidate, score in spill_scores([c for c in candidates if c.size > 0], size_weight):
        if covered >= amount:
            break
        chosen.append((candidate, score))
        covered += candidate.size
    return chosen


def choose_load(
    candidates: Sequence[Candidate], room: int, size_weight: float
) -> list[tuple[Candidate, float]]:
    """Best-scored key groups that fit, together, in ``room`` bytes of heap."""
    chosen: list[tuple[Candidate, float]] = []
    used = 0
    for candidate, score in load_scores(candidates, size_weight):
        if used + candidate.size <= room:
            chosen.append((candidate, score))
            used += candidate.size
    return chosen

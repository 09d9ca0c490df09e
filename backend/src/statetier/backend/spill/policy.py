"""Which key groups to spill or load: FLIP-50's weighted score of size and request rate.

Both inputs are normalized to 0..1 over the candidates, then weighted by ``spill.size-weight``
(``w``):

- spill score = ``w * size + (1 - w) * (1 - rate)``: large, cold key groups first, because they
  free the most heap for the least disk traffic afterwards;
- load score  = ``w * (1 - size) + (1 - w) * rate``: small, hot key groups first, because they
  save the most disk reads for the least heap.

Sizes are divided by the largest size: a key group's size adds up over many keys, so sizes sit
close together and the ratio to the largest says how much a move frees. Rates are not divided by
the largest rate: request rates are heavy-tailed (Zipf keys put most of the traffic on a few key
groups), so dividing by the hottest maps every other key group to about 0 and the rate term stops
ordering them; the size term's noise then picks which warm key groups go to disk. A rate is
normalized as ``rate / (rate + typical)`` instead, with ``typical`` the median of the non-zero
rates: 0 for an idle key group, 0.5 for a typical one, towards 1 for the hottest, in the same
order as the rates whatever their skew, and close together when the rates are (then size
decides).

Candidates are taken in score order until the requested bytes are covered (spill) or the next
one would not fit (load). Pure functions over plain numbers, so the policy is tested on its own.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

__all__ = ["Candidate", "choose_load", "choose_spill", "load_scores", "spill_scores"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A key group as the policy sees it: heap bytes it holds (or would hold), requests/s, and
    which of the process's backends holds it (``owner``: key groups of different pipelines share
    numbers)."""

    key_group: int
    size: int
    rate: float
    owner: int = 0


def _normalized(candidates: Sequence[Candidate]) -> list[tuple[Candidate, float, float]]:
    """``(candidate, size, rate)`` with both in 0..1 (see the module docstring for why so)."""
    max_size = max((c.size for c in candidates), default=0) or 1
    busy = [c.rate for c in candidates if c.rate > 0]
    typical = statistics.median(busy) if busy else 1.0
    return [(c, c.size / max_size, c.rate / (c.rate + typical)) for c in candidates]


def spill_scores(
    candidates: Sequence[Candidate], size_weight: float
) -> list[tuple[Candidate, float]]:
    """Candidates with their spill scores, best first (ties: lower key group first)."""
    scored = [
        (c, size_weight * size + (1 - size_weight) * (1 - rate))
        for c, size, rate in _normalized(candidates)
    ]
    return sorted(scored, key=lambda pair: (-pair[1], pair[0].owner, pair[0].key_group))


def load_scores(
    candidates: Sequence[Candidate], size_weight: float
) -> list[tuple[Candidate, float]]:
    """Candidates with their load scores, best first (ties: lower key group first)."""
    scored = [
        (c, size_weight * (1 - size) + (1 - size_weight) * rate)
        for c, size, rate in _normalized(candidates)
    ]
    return sorted(scored, key=lambda pair: (-pair[1], pair[0].owner, pair[0].key_group))


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

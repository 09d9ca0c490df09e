"""How many compaction workers a CompactionService needs, from its gateway's queue.

The recommendation is the gateway's load (queued + running jobs) divided by the spec's
``targetQueuePerWorker``, rounded up and clamped to ``min..max``. Scaling up follows the newest
recommendation at once, so a growing queue gets workers within one or two periods. Scaling down
follows the highest recommendation of the last ``scaleDownStabilizationSeconds`` (the rule of the
Kubernetes HorizontalPodAutoscaler), so a queue that empties for a moment between bursts does not
make the pool flap. Everything here is pure and takes the time as an argument; the kopf daemon in
:mod:`statetier.operator.autoscaling_handlers` does the I/O.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

__all__ = ["AutoscalingSettings", "Decision", "Recommender", "recommend", "settings_of"]

PERIOD_DEFAULT = 15
WINDOW_DEFAULT = 300


@dataclasses.dataclass(frozen=True)
class AutoscalingSettings:
    """``spec.workers.autoscaling`` read once per daemon step, so the step's decision and the
    period it sleeps come from the same version of the spec (an edit takes effect at the next
    step)."""

    enabled: bool
    period: float
    window: float
    gateway_url: str | None


def settings_of(spec: dict[str, Any]) -> AutoscalingSettings:
    """``spec.workers.autoscaling`` with its defaults (the CRD's, repeated here)."""
    raw = dict((spec.get("workers") or {}).get("autoscaling") or {})
    return AutoscalingSettings(
        enabled=bool(raw.get("enabled", False)),
        period=float(raw.get("periodSeconds", PERIOD_DEFAULT)),
        window=float(raw.get("scaleDownStabilizationSeconds", WINDOW_DEFAULT)),
        gateway_url=raw.get("gatewayURL") or None,
    )


def recommend(queued: int, running: int, target: int, low: int, high: int) -> int:
    """Workers for ``queued + running`` jobs at ``target`` jobs per worker, within low..high."""
    wanted = math.ceil((queued + running) / max(1, target))
    return max(low, min(high, wanted))


@dataclasses.dataclass(frozen=True)
class Decision:
    replicas: int
    recommendation: int
    reason: str


class Recommender:
    """Recommendations of the last window, and the replica count they lead to."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._history: collections.deque[tuple[float, int]] = collections.deque()

    def decide(self, now: float, current: int, recommendation: int) -> Decision:
        self._history.append((now, recommendation))
        while self._history and self._history[0][0] < now - self.window:
            self._history.popleft()
        if recommendation > current:
            return Decision(recommendation, recommendation, "ScaleUp")
        stable = max(r for _, r in self._history)
        if stable < current:
            return Decision(stable, recommendation, "ScaleDown")
        if recommendation < current:
            return Decision(current, recommendation, "Stabilizing")
        return Decision(current, recommendation, "Steady")

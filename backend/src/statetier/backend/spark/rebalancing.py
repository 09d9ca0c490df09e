"""Which ranges move when hosts join: an even spread over the live hosts, a few moves at a time.

Ownership is sticky (see registry): a host that joins late (a new executor, dynamic allocation)
gets only ranges that become free, so it would idle while the first hosts carry everything. At
each epoch boundary the driver plans moves toward an even spread: every host owning
``floor(n / hosts)`` or ``ceil(n / hosts)`` of a pipeline's ``n`` ranges. A move costs a
hand-off (the range's state travels to its new host), so an epoch makes at most
``host.rebalance-moves`` of them; the rest follow at the next boundaries.

The plan is a pure function of the owners and the live hosts, so the same cluster always moves
the same ranges: the most loaded host (ties: the smaller id) gives its highest range to the
least loaded (ties: the smaller id), until no host owns two more than another or the bound is
reached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

__all__ = ["Move", "plan_moves"]


@dataclasses.dataclass(frozen=True)
class Move:
    """Range ``index`` goes from host ``source`` to host ``target``."""

    index: int
    source: str
    target: str


def plan_moves(owners: Mapping[int, str], live: Iterable[str], limit: int) -> list[Move]:
    """The moves (at most ``limit``) that bring the ranges ``owners`` maps (index -> host id)
    closer to an even spread over the ``live`` hosts; ranges of hosts not live are left alone
    (they get new owners when a task routes them)."""
    held: dict[str, list[int]] = {host: [] for host in sorted(set(live))}
    for index, host in owners.items():
        if host in held:
            held[host].append(index)
    for ranges in held.values():
        ranges.sort()
    moves: list[Move] = []
    while len(moves) < limit and len(held) > 1:
        source = min(held, key=lambda h: (-len(held[h]), h))
        target = min(held, key=lambda h: (len(held[h]), h))
        if len(held[source]) - len(held[target]) <= 1:
            break
        index = held[source].pop()
        held[target].append(index)
        moves.append(Move(index, source, target))
    return moves

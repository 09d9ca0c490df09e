"""The driver's work after each commit: compaction and retention, in the background.

The state hosts only ever write deltas (or a first base); merging a range's chain into a new base
happens here, off the executors and off the micro-batch's path: on the compaction service when
``compaction.endpoints`` is set, else in a child process of this driver (a merge on a driver
thread would hold the GIL the micro-batch loop needs). A compaction's result is a
:class:`~statetier.backend.snapshot.chain_update.ChainUpdate` that travels with the next
epochs' task spec until a committed manifest names its base: the range's host applies it to its
writer before its snapshot, a host that restores the range applies it to the restored chain.
Until then the compacted base is protected from retention (it lives in an epoch directory that
may fall out of the retained epochs before it is named).

``compaction.mode=executor`` keeps the old behaviour for comparison: no compaction here, the
hosts write a full base inside their snapshot once a chain is longer than the trigger.
"""

from __future__ import annotations

import threading

from statetier.backend.compaction_client import compactor_for
from statetier.backend.config import StatetierConfig
from statetier.backend.snapshot.chain_compaction import ChainCompaction
from statetier.backend.snapshot.chain_update import ChainUpdate
from statetier.backend.snapshot.compaction import Compactor
from statetier.backend.snapshot.manifest import Chain, Manifest
from statetier.backend.snapshot.store import SnapshotStore
from statetier.backend.snapshot.upkeep import Upkeep

__all__ = ["EpochUpkeep"]


class EpochUpkeep:
    """Compaction and retention after the commits of one pipeline; the updates in flight."""

    def __init__(self, store: SnapshotStore, config: StatetierConfig) -> None:
        compaction = None
        if config.compaction_mode == "background":
            compaction = ChainCompaction(
                store,
                compactor_for(config, store, own_process=True),
                delta_trigger=int(config.compaction_delta_trigger),
                size_ratio=float(config.compaction_size_ratio),
            )
        self._pending: list[ChainUpdate] = []
        self._lock = threading.Lock()
        self._upkeep = Upkeep(
            store,
            compaction,
            int(config.checkpoint_retained),
            deliver=self._deliver,
            protect=self._protected,
            skip=self._in_hand,
        )

    @property
    def compaction(self) -> ChainCompaction | None:
        return self._upkeep.compaction

    @property
    def compaction_cpu_seconds(self) -> float:
        """The driver thread's CPU in compaction so far (see Upkeep), for benchmarks."""
        return self._upkeep.compaction_cpu_seconds

    @property
    def compactions(self) -> int:
        """Compacted bases made so far."""
        return self._upkeep.compactions

    @property
    def compactor(self) -> Compactor | None:
        """What merges the chains (remote with ``compaction.endpoints``); None when off."""
        compaction = self._upkeep.compaction
        return compaction.compactor if compaction is not None else None

    def updates(self) -> tuple[ChainUpdate, ...]:
        """The chain updates the next epoch's hosts apply."""
        with self._lock:
            return tuple(self._pending)

    def committed(self, manifest: Manifest, owner: str, now_ms: int | None = None) -> None:
        """``manifest`` was just committed: forget the updates it took (or that no longer
        apply), then compact (with the epoch's clock ``now_ms``) and retain in the
        background."""
        chains = {(c.state, c.key_groups): c for c in manifest.chains()}
        with self._lock:
            self._pending = [
                u
                for u in self._pending
                if not u.named_by(manifest)
                and (chain := chains.get((u.state, u.key_groups))) is not None
                and u.applies_to(chain)
            ]
        self._upkeep.committed(manifest, owner, now_ms)

    def _deliver(self, updates: list[ChainUpdate]) -> None:
        with self._lock:
            self._pending.extend(updates)

    def _in_hand(self, chain: Chain) -> bool:
        """Whether an update for ``chain`` waits to be applied already."""
        with self._lock:
            return any(u.applies_to(chain) for u in self._pending)

    def _protected(self) -> set[str]:
        with self._lock:
            return {u.base.path for u in self._pending if u.base is not None}

    def drain(self) -> None:
        """Wait for the queued jobs (tests and tools that list the files)."""
        self._upkeep.drain()

    def close(self) -> None:
        self._upkeep.close()

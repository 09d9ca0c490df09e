"""The driver's work after each commit: compaction and retention, in the background.

The state hosts only ever write deltas (or a first base); merging a range's chain into a new base
happens here, off the executors and off the micro-batch's path: on the compaction service when
``compaction.endpoints`` is set, else in this driver process. A compaction's result is a
:class:`~statetier.backend.snapshot.chain_compaction.ChainUpdate` that travels with the next
epochs' task spec until a committed manifest names its base: the range's host applies it to its
writer before its snapshot, a host that restores the range applies it to the restored chain.
Until then the compacted base is protected from retention (it lives in an epoch directory that
may fall out of the retained epochs before it is named).

``compaction.mode=executor`` keeps the old behaviour for comparison: no compaction here, the
hosts write a full base inside their snapshot once a chain is longer than the trigger.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any

from statetier.backend.compaction_client import compactor_for
from statetier.backend.config import StatetierConfig
from statetier.backend.snapshot.chain_compaction import ChainCompaction, ChainUpdate
from statetier.backend.snapshot.gc import collect_garbage
from statetier.backend.snapshot.manifest import Chain, Manifest
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["EpochUpkeep"]

log = logging.getLogger(__name__)


class EpochUpkeep:
    """Compaction and retention after the commits of one pipeline, one job at a time."""

    def __init__(self, store: SnapshotStore, config: StatetierConfig) -> None:
        self.store = store
        self.retained = int(config.checkpoint_retained)
        self.compaction: ChainCompaction | None = None
        if config.compaction_mode == "background":
            self.compaction = ChainCompaction(
                store,
                compactor_for(config, store),
                delta_trigger=int(config.compaction_delta_trigger),
                size_ratio=float(config.compaction_size_ratio),
            )
        self._pending: list[ChainUpdate] = []
        self._lock = threading.Lock()
        self._latest = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="statetier-upkeep")
        self._job: concurrent.futures.Future[None] | None = None

    @property
    def compactor(self) -> Any:
        return self.compaction.compactor if self.compaction is not None else None

    def updates(self) -> list[dict[str, Any]]:
        """The chain updates the next epoch's hosts apply (JSON-ready)."""
        with self._lock:
            return [u.to_dict() for u in self._pending]

    def committed(self, manifest: Manifest, owner: str) -> None:
        """``manifest`` was just committed: forget the updates it took (or that no longer
        apply), then compact and retain in the background. A failure of the previous job
        (storage trouble in retention) surfaces here, as it would have inline."""
        self._settle(manifest)
        self._latest = max(self._latest, manifest.epoch)
        if self._job is not None:
            self._job.result()
        self._job = self._pool.submit(self._maintain, manifest, owner)

    def _settle(self, manifest: Manifest) -> None:
        chains = {(c.state, c.key_groups): c for c in manifest.chains()}
        with self._lock:
            self._pending = [
                u
                for u in self._pending
                if not u.named_by(manifest)
                and (chain := chains.get((u.state, u.key_groups))) is not None
                and u.applies_to(chain)
            ]

    def _maintain(self, manifest: Manifest, owner: str) -> None:
        """Compaction (only for the newest commit: a queued job of an older one would compact
        chains the newer commit carries on anyway), then retention. A compaction failure never
        stops retention."""
        if self.compaction is not None and manifest.epoch >= self._latest:
            try:
                due = self.compaction.due(manifest, skip=self._in_hand)
                updates = self.compaction.run(manifest, owner, due)
            except Exception:  # planning itself failed (reading the chains): next time
                log.exception("compaction after epoch %d failed", manifest.epoch)
                updates = []
            with self._lock:
                self._pending.extend(updates)
        if self.retained > 0:
            collect_garbage(self.store, self.retained, protect=self._protected())

    def _in_hand(self, chain: Chain) -> bool:
        """Whether an update for ``chain`` waits to be applied already."""
        with self._lock:
            return any(u.applies_to(chain) for u in self._pending)

    def _protected(self) -> set[str]:
        with self._lock:
            return {u.base.path for u in self._pending if u.base is not None}

    def drain(self) -> None:
        """Wait for the running job (tests and tools that list the files)."""
        if self._job is not None:
            job, self._job = self._job, None
            job.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

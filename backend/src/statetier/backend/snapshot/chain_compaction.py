"""The writer side of compaction, shared by every runtime: which chains of a committed epoch to
compact, and what the writers of their ranges must change afterwards.

Compaction runs after a commit, in the background, on whoever holds the writer lease (the local
runner's checkpointer, the Spark driver), never on the epoch's path: the compactor is the
compaction service when ``compaction.endpoints`` is set, else a local one. Its result is a
:class:`~statetier.backend.snapshot.chain_update.ChainUpdate`: "swap these files, a prefix of
the chain, for this base". The writer that owns the range applies it before its next snapshot
(in the same process for the local runner, in the state host on the next epoch for Spark), so
the next manifest names the compacted base; until then the base is named by no manifest and
invisible to readers. A chain whose compaction keeps failing gets a cut instead: its next
snapshot writes a full base, so files stay bounded.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

from statetier.backend import metrics as backend_metrics
from statetier.backend.snapshot.chain_update import ChainUpdate
from statetier.backend.snapshot.compaction import Compactor, make_request, needs_compaction
from statetier.backend.snapshot.layout import compacted_dir
from statetier.backend.snapshot.manifest import Chain, FileEntry, Manifest
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["CUT_FACTOR", "ChainCompaction", "apply_update"]

log = logging.getLogger(__name__)
CUT_FACTOR = 3  # a chain that failed compaction is cut at this many times the delta trigger


class InterpreterExitingError(Exception):
    """The compactor could not start work because the interpreter is exiting (a runner that was
    never closed): the remaining chains are left as they are, for the next run."""


_exit_warned: list[bool] = []  # one line per process, however many jobs were still queued


def _warn_exiting_once(left: int, epoch: int) -> None:
    if not _exit_warned:
        _exit_warned.append(True)
        log.warning(
            "the interpreter is exiting with a runner still open: compactions after epoch %d "
            "(%d here) are left for the next run (close the runner to wait for them)",
            epoch,
            left,
        )


def _exiting(exc: RuntimeError) -> bool:
    """Whether ``exc`` is concurrent.futures refusing work at interpreter exit.

    Any refusal inside a compaction is: its pools are local to the call (a compaction's
    parallel reads) or the runner's own, which ``close`` shuts down only after waiting for the
    compaction. The wording alone decides, since at exit it varies: a pool created after the
    exit hook ran says "after interpreter shutdown", a pool already in use says only "after
    shutdown" (the hook wakes its idle workers, which mark it shut down). Nor is the main
    thread a sign: the hook runs, and joins the upkeep thread, before the main thread is
    marked stopped (a CI run printed a failed compaction that way)."""
    return "cannot schedule new futures" in str(exc)


def apply_update(writer: Any, update: ChainUpdate) -> bool:
    """Apply ``update`` to a :class:`~statetier.backend.snapshot.writer.SubtaskWriter`; whether
    it took (False: the chain moved on, e.g. a full snapshot replaced it)."""
    if update.base is None:
        writer.cut(update.state)
        return True
    result: bool = writer.replace_prefix(update.state, update.inputs, update.base)
    return result


@dataclasses.dataclass(eq=False)
class ChainCompaction:
    """Plans and runs the compactions a committed manifest's chains call for."""

    store: SnapshotStore
    compactor: Compactor
    _: dataclasses.KW_ONLY
    delta_trigger: int
    size_ratio: float

    def due(self, manifest: Manifest, skip: Callable[[Chain], bool] | None = None) -> list[Chain]:
        """The chains of ``manifest`` that hit a trigger (less those ``skip`` says are being
        taken care of already)."""
        return [
            chain
            for chain in manifest.chains()
            if needs_compaction(chain, self.delta_trigger, self.size_ratio)
            and not (skip is not None and skip(chain))
        ]

    def run(
        self, manifest: Manifest, owner: str, chains: Iterable[Chain], now_ms: int | None = None
    ) -> list[ChainUpdate]:
        """Compact ``chains`` of ``manifest``, one at a time; the updates their writers apply.
        ``now_ms`` is the epoch's clock (TTL cleanup in compaction).

        A chain that fails stays as it is (retried after the next commit) and the others go on;
        one that failed past ``CUT_FACTOR`` times the trigger gets a cut."""
        updates = []
        chains = list(chains)
        for done, chain in enumerate(chains):
            try:
                update = self._compact(manifest, owner, chain, now_ms)
            except InterpreterExitingError:
                _warn_exiting_once(len(chains) - done, manifest.epoch)
                break
            if update is not None:
                updates.append(update)
        return updates

    def _compact(
        self, manifest: Manifest, owner: str, chain: Chain, now_ms: int | None
    ) -> ChainUpdate | None:
        output_dir = compacted_dir(manifest.epoch, owner, chain.state)
        request = make_request(
            self.store.url,
            chain.state,
            chain.files,
            output_dir,
            manifest.max_parallelism,
            meta=manifest.states.get(chain.state),
            now_ms=now_ms,
        )
        try:
            result = self.compactor.compact(request)
            base = self._checked_base(chain, result.outputs)
        except RuntimeError as exc:
            if _exiting(exc):
                raise InterpreterExitingError from exc
            return self._failed(chain, manifest.epoch, exc)
        except Exception as exc:
            return self._failed(chain, manifest.epoch, exc)
        backend_metrics.compaction_done(True)
        return ChainUpdate(chain.state, chain.key_groups, tuple(chain.files), base)

    def _failed(self, chain: Chain, epoch: int, exc: Exception) -> ChainUpdate | None:
        """A chain whose compaction failed: kept as it is, or cut once it failed too often."""
        log.warning(
            "compaction of %s %s after epoch %d failed (the chain is kept and retried after "
            "the next commit): %s",
            chain.state,
            chain.key_groups,
            epoch,
            exc,
        )
        backend_metrics.compaction_done(False)
        if len(chain.deltas) >= CUT_FACTOR * self.delta_trigger:
            log.warning(
                "chain of %s %s has %d deltas and could not be compacted: its next snapshot "
                "writes a full base",
                chain.state,
                chain.key_groups,
                len(chain.deltas),
            )
            return ChainUpdate(chain.state, chain.key_groups, tuple(chain.files), None)
        return None

    def _checked_base(self, chain: Chain, outputs: list[Any]) -> FileEntry:
        """The compacted base as a manifest entry, once storage shows it with its size: a
        manifest never names a file that is not there."""
        if len(outputs) != 1:
            raise RuntimeError(f"a compaction returned {len(outputs)} outputs, not one")
        output = outputs[0]
        prefix = self.store.uri.rstrip("/") + "/"
        if not output.url.startswith(prefix):
            raise RuntimeError(f"compaction output {output.url} is outside {self.store.uri}")
        base = FileEntry(
            path=output.url[len(prefix) :],
            size=output.size,
            crc32=output.crc32,
            state=chain.state,
            key_groups=chain.key_groups,
            kind="base",
            epoch=chain.files[-1].epoch,
        )
        if self.store.missing([base]):
            raise RuntimeError(f"compaction output {output.url} is not in storage with its size")
        return base

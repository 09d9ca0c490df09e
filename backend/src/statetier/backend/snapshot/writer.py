"""The snapshot writer of one function instance: full or incremental, chain by chain.

The writer remembers, per state, the chain (base + deltas) of its own key-group range that its
last snapshot produced. The next snapshot of a state with such a chain writes only a delta of the
keys the backend touched since (``drain_touched_keys``: a superset of the changed keys, TTL
removals included) and names the chain plus the delta; a state without one (first snapshot,
new state, a restore from other ranges after a rescale, a failed epoch) gets a full base.

Any failure between prepare and commit makes the writer forget its chains
(:meth:`SubtaskWriter.reset`): the touched keys of the failed epoch are gone from the log, so
only a full base is safe next time. Compaction results replace a chain's prefix here, so the
next manifest names the compacted base.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from statetier.backend.keyed_backend import KeyedStateBackend, state_meta
from statetier.backend.operator_state import OperatorStateBackend
from statetier.backend.snapshot import codec as codecs
from statetier.backend.snapshot.format import BASE, DELTA
from statetier.backend.snapshot.manifest import FileEntry, Manifest
from statetier.backend.snapshot.serialize import (
    PreparedFile,
    encode_operator_state,
    encode_restored_base,
    encode_table,
    keyed_entry,
)
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["PreparedSubtask", "SubtaskSnapshot", "SubtaskWriter", "epoch_clock"]


@dataclasses.dataclass
class SubtaskSnapshot:
    """What one function instance contributes to an epoch's manifest."""

    key_groups: Any  # KeyGroupRange | None
    max_parallelism: int | None
    key_serializer: str | None
    states: dict[str, dict[str, Any]]
    keyed_files: list[FileEntry]
    operator_file: FileEntry | None
    # the keyed backend's clock when the snapshot was prepared: the processing time its TTL
    # checks used for the epoch (see epoch_clock); None without keyed state
    processing_time: int | None = None


def epoch_clock(snapshots: Sequence[SubtaskSnapshot]) -> int | None:
    """The epoch's clock: the processing time the TTL checks of the epoch's instances used,
    the earliest of them (an entry expired then is expired for every instance). On Spark the
    hosts' clocks all stand at the micro-batch's ``EpochTime.processing_time``; in the local
    runner every instance reads the runner's clock. None when no snapshot has keyed state."""
    times = [s.processing_time for s in snapshots if s.processing_time is not None]
    return min(times) if times else None


@dataclasses.dataclass
class PreparedSubtask:
    """A snapshot serialized but not uploaded: the manifest part and the new files' bytes."""

    snapshot: SubtaskSnapshot
    uploads: list[PreparedFile]

    @property
    def upload_bytes(self) -> int:
        return sum(len(f.data) for f in self.uploads)


class SubtaskWriter:
    """Prepares the snapshots of one instance's keyed and operator state."""

    def __init__(
        self,
        keyed: KeyedStateBackend | None,
        operator_state: OperatorStateBackend | None,
        *,
        incremental: bool = True,
        codec: str = codecs.ZSTD,
    ) -> None:
        self.keyed = keyed
        self.operator_state = operator_state
        self.incremental = incremental
        self.codec = codec  # of the keyed data files' blocks (checkpoint.compression)
        self._chains: dict[str, list[FileEntry]] = {}
        # the value schemas each chain's files were written with (typed states; see prepare)
        self._chain_schemas: dict[str, Any] = {}
        # the operator state's last file and its bytes: named again while they do not change
        self._operator_file: tuple[FileEntry, bytes] | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ chain bookkeeping

    def restored_from(self, manifest: Manifest) -> None:
        """The backend was just restored from ``manifest``: chains of its exact range carry on."""
        with self._lock:
            self._chains = {}
            self._chain_schemas = {}
            self._operator_file = None  # redistributed on restore: its next file is new
            if self.keyed is None:
                return
            mine = str(self.keyed.key_groups)
            for chain in manifest.chains():
                if chain.key_groups == mine:
                    self._chains[chain.state] = chain.files
                    meta = manifest.states.get(chain.state, {})
                    self._chain_schemas[chain.state] = meta.get("schemas")
            self.keyed.drain_touched_keys()

    def reset(self) -> None:
        """Forget the chains: the next snapshot writes full bases (and the operator state's
        file anew)."""
        with self._lock:
            self._chains = {}
            self._operator_file = None

    def cut(self, state: str) -> None:
        """Forget one state's chain: its next snapshot writes a full base (a chain compaction
        could not shorten must not grow without bound)."""
        with self._lock:
            self._chains.pop(state, None)

    def chains(self) -> dict[str, list[FileEntry]]:
        with self._lock:
            return {name: list(files) for name, files in self._chains.items()}

    def replace_prefix(self, state: str, inputs: Sequence[FileEntry], base: FileEntry) -> bool:
        """Swap ``inputs`` (a prefix of the state's chain) for the compacted ``base``.

        False when the chain moved on meanwhile in a way that does not start with ``inputs``
        (a full snapshot replaced it); the compacted file is then simply never named.
        """
        with self._lock:
            chain = self._chains.get(state)
            if chain is None or chain[: len(inputs)] != list(inputs):
                return False
            self._chains[state] = [base, *chain[len(inputs) :]]
            return True

    # ------------------------------------------------------------------ prepare

    def prepare(
        self, store: SnapshotStore, epoch: int, owner: str = "w", *, full: bool = False
    ) -> PreparedSubtask:
        """Serialize this instance's state for ``epoch`` (synchronously: a consistent copy)."""
        uploads: list[PreparedFile] = []
        keyed_files: list[FileEntry] = []
        states: dict[str, dict[str, Any]] = {}
        keyed = self.keyed
        now = keyed.clock.now_ms() if keyed is not None else None
        with self._lock:
            incremental = self.incremental and not full
            if keyed is not None:
                touched = keyed.drain_touched()
                new_chains: dict[str, list[FileEntry]] = {}
                for table in keyed.tables.values():
                    name = table.name
                    states[name] = meta = state_meta(table.descriptor)
                    chain = self._chains.get(name) if incremental else None
                    if chain is not None and self._chain_schemas.get(name) != meta.get("schemas"):
                        # restored as a new type: a base rewrites every value in it, so that
                        # the manifest's schema is that of all the state's bytes
                        chain = None
                    self._chain_schemas[name] = meta.get("schemas")
                    if chain is not None and not touched.by_group:
                        new_chains[name] = list(chain)
                        continue
                    kind = DELTA if chain is not None else BASE
                    data = encode_table(keyed, table, epoch, touched if chain else None, self.codec)
                    path = store.keyed_file_name(epoch, name, keyed.key_groups, kind, owner)
                    entry = keyed_entry(path, data, name, keyed.key_groups, kind, epoch)
                    uploads.append(PreparedFile(entry, data))
                    new_chains[name] = [*(chain or []), entry]
                for name, restored in keyed.restored.items():
                    states[name] = restored.meta
                    chain = self._chains.get(name) if incremental else None
                    if chain is not None:  # unchanged since restore: name the same files
                        new_chains[name] = list(chain)
                        continue
                    data = encode_restored_base(
                        keyed.key_groups, name, restored, epoch, keyed.max_parallelism, self.codec
                    )
                    path = store.keyed_file_name(epoch, name, keyed.key_groups, BASE, owner)
                    entry = keyed_entry(path, data, name, keyed.key_groups, BASE, epoch)
                    uploads.append(PreparedFile(entry, data))
                    new_chains[name] = [entry]
                self._chains = new_chains
                keyed_files = [f for files in new_chains.values() for f in files]
            operator_file = self._prepare_operator_file(store, epoch, owner, uploads, incremental)
        snapshot = SubtaskSnapshot(
            key_groups=keyed.key_groups if keyed else None,
            max_parallelism=keyed.max_parallelism if keyed else None,
            key_serializer=keyed.key_serializer.id if keyed else None,
            states=states,
            keyed_files=keyed_files,
            operator_file=operator_file,
            processing_time=now,
        )
        return PreparedSubtask(snapshot, uploads)

    def _prepare_operator_file(
        self,
        store: SnapshotStore,
        epoch: int,
        owner: str,
        uploads: list[PreparedFile],
        incremental: bool,
    ) -> FileEntry | None:
        """The operator state's file: the last one again when its bytes are unchanged (a
        function with no operator state, or one that did not touch it, uploads nothing: on
        object storage a file a range per epoch, and its deletion later, is paid per request),
        else a new one, appended to ``uploads``."""
        if self.operator_state is None:
            return None
        data = encode_operator_state(self.operator_state)
        last = self._operator_file
        if incremental and last is not None and last[1] == data:
            return last[0]
        path = store.operator_file_name(
            epoch, self.operator_state.index, self.operator_state.parallelism, owner
        )
        entry = dataclasses.replace(
            keyed_entry(path, data, "", "", BASE, epoch),
            state=None,
            key_groups=None,
            operator_index=self.operator_state.index,
        )
        uploads.append(PreparedFile(entry, data))
        self._operator_file = (entry, data)
        return entry

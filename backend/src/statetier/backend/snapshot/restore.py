"""Restore: the key groups of one backend from base + deltas, at any parallelism.

For each state, the manifest's chains partition the key groups; a backend reads, from every
chain whose range overlaps its own, the blocks of its key groups: the base, then each delta in
epoch order (later values win, tombstones remove). Files are fetched concurrently and each is
checked as it arrives: every byte once, part by part (header, index, footer, every block), so a
damaged checkpoint fails the restore with the file and block named; the whole-file crc32 the
manifest records is consulted when a part fails, or when the format has no part checksums.
Blocks are kept undecoded until their key group is first read (see lazy): the restore costs the
download and one checksum pass.
Operator state is redistributed over the new parallelism (even split or union).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from statetier.backend.keyed_backend import (
    KeyedStateBackend,
    RestoredState,
    check_restored_compatible,
)
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.operator_state import (
    OperatorStateBackend,
    Redistribution,
    even_split_ranges,
)
from statetier.backend.snapshot.commit import SnapshotError
from statetier.backend.snapshot.format import (
    Block,
    CorruptFileError,
    DataFileReader,
    checks_every_part,
    decode_operator_file,
)
from statetier.backend.snapshot.lazy import LazyEntries
from statetier.backend.snapshot.manifest import FileEntry, Manifest
from statetier.backend.snapshot.store import SnapshotStore
from statetier.backend.state.table import StateTable

__all__ = ["read_key_groups", "restore_keyed_state", "restore_operator_state", "restored_bytes"]

_FilePlan = tuple[KeyGroupRange, bool, bool]  # the overlap, copy the blocks, decode them now


def read_key_groups(
    store: SnapshotStore,
    manifest: Manifest,
    key_groups: KeyGroupRange,
    concurrency: int = 8,
    *,
    decode: Collection[str] = (),
) -> dict[str, RestoredState]:
    """State name -> its entries in ``key_groups``, from base + deltas.

    The files are downloaded and checked now, each as it arrives; the entries are
    :class:`LazyEntries`, decoded per key group on first read (see lazy). The bases of the
    states named in ``decode`` (states about to be filled anyway) are decoded now instead, each
    file as it arrives while the others are still downloading.
    """
    lazy = {name: LazyEntries() for name in manifest.states}
    plan, wanted = _plan(manifest, key_groups, decode)

    def blocks_of(entry: FileEntry, data: bytes) -> tuple[dict[int, Block], LazyEntries]:
        overlap, copy, eager = wanted[entry.path]
        blocks = _blocks(_checked_reader(store, entry, data), overlap, copy and not eager)
        if not eager:
            return blocks, LazyEntries()
        decoded = LazyEntries({kg: [block] for kg, block in blocks.items()})
        decoded.decode_all()
        return {}, decoded

    files = [f for *_, chain_files in plan for f in chain_files]
    # each file checked once, part by part (not also as a whole: a second pass for nothing)
    per_file = iter(store.read_each(files, blocks_of, concurrency, checksum=False))
    for state, overlap, chain_files in plan:
        chain_blocks = [next(per_file) for _ in chain_files]  # base first
        for _, decoded in chain_blocks:
            lazy[state].take(decoded)
        for key_group in overlap:
            blocks = [found[key_group] for found, _ in chain_blocks if key_group in found]
            if blocks:
                lazy[state].add(key_group, blocks)
    return {name: RestoredState(meta, lazy[name]) for name, meta in manifest.states.items()}


def _plan(
    manifest: Manifest, key_groups: KeyGroupRange, decode: Collection[str]
) -> tuple[list[tuple[str, KeyGroupRange, list[FileEntry]]], dict[str, _FilePlan]]:
    """The chains overlapping ``key_groups`` (state, overlap, files), and per file what to take
    from it: the overlap, whether to copy its blocks, whether to decode them at once."""
    plan: list[tuple[str, KeyGroupRange, list[FileEntry]]] = []
    wanted: dict[str, _FilePlan] = {}
    for chain in manifest.chains():
        if chain.state not in manifest.states:
            raise SnapshotError(
                f"the manifest names files of state {chain.state!r} it does not list"
            )
        chain_range = KeyGroupRange.parse(chain.key_groups)
        overlap = chain_range.intersection(key_groups)
        if len(overlap):
            plan.append((chain.state, overlap, chain.files))
            # a view into a file keeps all of it in memory: copy when only a little is ours
            copy = 2 * len(overlap) < len(chain_range)
            eager = chain.state in decode and len(chain.files) == 1  # a base alone
            wanted.update({f.path: (overlap, copy, eager) for f in chain.files})
    return plan, wanted


def restored_bytes(manifest: Manifest, key_groups: KeyGroupRange) -> int:
    """The bytes a restore of ``key_groups`` from ``manifest`` downloads (keyed and operator
    files): what a move of the range costs in object-storage reads."""
    _, wanted = _plan(manifest, key_groups, ())
    keyed = {f.path: f.size for chain in manifest.chains() for f in chain.files if f.path in wanted}
    return sum(keyed.values()) + sum(f.size for f in manifest.operator_files)


def _checked_reader(store: SnapshotStore, entry: FileEntry, data: bytes) -> DataFileReader:
    """A reader of ``data`` with every byte checked once: part by part (header, index, footer,
    every block) where the format allows, else against the manifest's whole-file checksum."""
    if len(data) != entry.size or not checks_every_part(data):
        store.check(entry, data)  # version 1, damaged where the version is, or another size
    try:
        reader = DataFileReader(data, store.full_path(entry.path))
        reader.check_every_block()
        reader.check_is(entry.state, entry.key_groups, entry.kind, entry.epoch)
    except CorruptFileError:
        store.check(entry, data)  # damage the manifest's checksum sees: reported as such
        raise  # the file is what the manifest says, but fails its own checks
    return reader


def _blocks(reader: DataFileReader, overlap: KeyGroupRange, copy: bool) -> dict[int, Block]:
    """The blocks of ``overlap`` in one (checked) file."""
    found = {}
    for key_group in overlap:
        block = reader.block(key_group)
        if block is not None:
            found[key_group] = dataclasses.replace(block, data=bytes(block.data)) if copy else block
    return found


def restore_keyed_state(
    store: SnapshotStore, backend: KeyedStateBackend, epoch: int | None = None
) -> Manifest:
    """Load the backend's key groups from the snapshot of ``epoch`` (default: the latest).

    States are kept as bytes until registered; already registered states are filled now.
    """
    manifest = store.manifest(epoch)
    if manifest.max_parallelism and manifest.max_parallelism != backend.max_parallelism:
        raise SnapshotError(
            f"snapshot of epoch {manifest.epoch} has max parallelism {manifest.max_parallelism}; "
            f"the backend has {backend.max_parallelism} (max parallelism is fixed once "
            "checkpointed)"
        )
    if manifest.key_serializer != backend.key_serializer.id:
        raise SnapshotError(
            f"snapshot keys were written with serializer {manifest.key_serializer!r}, the "
            f"backend uses {backend.key_serializer.id!r}"
        )
    restored = read_key_groups(store, manifest, backend.key_groups, decode=set(backend.tables))
    for name, state in restored.items():
        table = backend.tables.get(name)
        if table is None:
            backend.restored[name] = state
        else:
            check_restored_compatible(state.meta, table.descriptor)
            _fill_registered(backend, table, state)
    return manifest


def _fill_registered(backend: KeyedStateBackend, table: StateTable, state: RestoredState) -> None:
    key_loads = backend.key_serializer.loads
    for key_group in backend.key_groups:
        table.map_for(key_group).clear()
    for key_group, pairs in state.entries.items():
        kg_map = table.map_for(key_group)
        for key_bytes, value_bytes in pairs:
            kg_map[key_loads(key_bytes)] = table.codec.decode(value_bytes)


def restore_operator_state(
    store: SnapshotStore, backend: OperatorStateBackend, epoch: int | None = None
) -> Manifest:
    """Redistribute the operator state of ``epoch`` to instance ``backend.index``.

    At the parallelism the snapshot was written with, even-split states are not redistributed:
    the instance gets its own lists back, as Flink's repartitioner returns the previous
    assignment when the parallelism is unchanged. Union states always go to everyone whole.
    """
    manifest = store.manifest(epoch)
    files = sorted(manifest.operator_files, key=lambda e: e.operator_index or 0)
    same_parallelism = manifest.parallelism == backend.parallelism and [
        f.operator_index for f in files
    ] == list(range(backend.parallelism))
    per_state: dict[str, tuple[Redistribution, str, list[bytes]]] = {}
    own: dict[str, list[bytes]] = {}
    for entry, data in zip(files, store.read_many(files), strict=True):
        decoded = decode_operator_file(data, store.full_path(entry.path))
        for name, part in decoded.items():
            mode = Redistribution(part["mode"])
            known = per_state.setdefault(name, (mode, part["serializer"], []))
            if known[0] is not mode:
                raise SnapshotError(f"operator state {name!r} has mixed redistribution modes")
            known[2].extend(part["elements"])
            if entry.operator_index == backend.index:
                own[name] = list(part["elements"])
    split_sizes = {
        name: len(elements)
        for name, (mode, _, elements) in per_state.items()
        if mode is Redistribution.EVEN_SPLIT
    }
    ranges = even_split_ranges(split_sizes, backend.parallelism)
    for name, (mode, serializer_id, elements) in per_state.items():
        mine = elements
        if mode is Redistribution.EVEN_SPLIT:
            cut = ranges[name][backend.index]
            mine = own.get(name, []) if same_parallelism else elements[cut.start : cut.stop]
        backend.restored[name] = (mode, serializer_id, mine)
    return manifest

"""The spilled per-record path: the read-modify-write memo, the default serializer's packer, the
policy's rate scale under Zipf traffic, and the count of records served from disk.

The memo lets a write after a read overwrite the value in place without probing again; these
tests put everything that can move a record between the read and the write (an append, a
compaction, a snapshot view, a rebuild) and check that no write lands in the wrong place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.serializers import DEFAULT_SERIALIZER, SerializationError
from statetier.backend.spill import SpilledMap, SpillManager, SpillStorage
from statetier.backend.spill.policy import Candidate, choose_spill
from statetier.backend.spill.spilled_map import MapCodec
from statetier.backend.spill.storage import Chunk

S = DEFAULT_SERIALIZER
ENCODE, DECODE = S.direct_codec()
CODEC = MapCodec(S.dumps, S.loads, ENCODE, DECODE)


def _map(storage: SpillStorage, items: dict[Any, Any], **kwargs: Any) -> SpilledMap:
    return SpilledMap(storage, CODEC, items.items(), **kwargs)


def _chunk_of(spilled: SpilledMap) -> Chunk:
    assert spilled._data is not None
    return spilled._data.chunk


def test_writes_after_reads_land_on_their_key_whatever_moved_between(tmp_path: Path) -> None:
    storage = SpillStorage([str(tmp_path)], 1 << 16)
    spilled = _map(storage, {f"k{n}": n for n in range(50)})
    reference = {f"k{n}": n for n in range(50)}
    for n in range(50):  # 0..49 -> 200..249: one byte to two, so each write appends
        key = f"k{n}"
        spilled[key] = spilled.get(key) + 200
        reference[key] += 200
        spilled[key] = reference[key] = reference[key] + 1  # no read: the memo moved along
    assert dict(spilled.items()) == reference
    # a longer value appended, then one of the first length: not back in the old record
    assert spilled.get("k1") == 202
    spilled["k1"] = 70_000
    spilled["k1"] = 203
    assert spilled["k1"] == 203
    # a delete and an insert between a read and a write
    assert spilled.get("k3") == 204
    del spilled["k4"]
    spilled["new"] = 7
    spilled["k3"] = 300
    assert spilled["k3"] == 300 and spilled["new"] == 7 and "k4" not in spilled
    # a snapshot view pins the log between a read and a same-length write
    assert spilled.get("k5") == 206
    with spilled.frozen() as view:
        spilled["k5"] = 207
        assert view["k5"] == 206 and spilled["k5"] == 207
    storage.close()


def test_a_write_after_compaction_moved_the_regions_goes_to_the_new_place(
    tmp_path: Path,
) -> None:
    storage = SpillStorage([str(tmp_path)], 1 << 16)
    spilled = _map(storage, {"a": 1000, "b": 2000})
    first = _chunk_of(spilled)
    fillers: list[SpilledMap] = []
    while len(storage.chunks) < 2 or _chunk_of(fillers[-1]) is first:
        fillers.append(_map(storage, {f"f{n}": "x" * 200 for n in range(20)}))
    for other in fillers:
        if _chunk_of(other) is first:
            other.release()
    assert spilled.get("a") == 1000  # memoized where "a" is now
    assert storage.compact() == 1
    assert _chunk_of(spilled) is not first
    spilled["a"] = 1001  # same length as the memoized read
    assert spilled["a"] == 1001 and spilled["b"] == 2000
    assert dict(spilled.items()) == {"a": 1001, "b": 2000}
    storage.close()


@pytest.mark.parametrize(
    "value",
    [0, 127, 128, 65535, -33, 2**63, 1.5, "w", b"\x00", None, True, [1, (2, 3)], {"a": {1, 2}}],
)
def test_the_packer_writes_the_serializers_bytes(value: Any) -> None:
    assert ENCODE(value) == S.dumps(value)
    assert DECODE(ENCODE(value)) == S.loads(S.dumps(value))


def test_values_the_packer_refuses_move_the_key_group_back_to_heap(tmp_path: Path) -> None:
    storage = SpillStorage([str(tmp_path)], 1 << 16)
    heap: dict[Any, Any] = {}
    reasons: list[Exception] = []

    def fallback(exc: Exception) -> dict[Any, Any]:
        reasons.append(exc)
        return heap

    spilled = _map(storage, {"a": 1}, fallback=fallback)
    for value in (2**70, object()):
        assert spilled.get("a") == 1
        spilled["a"] = value
        assert heap["a"] is value
    assert all(isinstance(r, SerializationError) for r in reasons) and len(reasons) == 2
    with pytest.raises(SerializationError):
        _map(storage, {"a": 2**70})
    with pytest.raises(msgpack.ExtraData):
        msgpack.unpackb(ENCODE(1) + b"\x01")  # the packer keeps no bytes of a refused value
    storage.close()


def test_the_policy_spills_the_coldest_key_groups_under_zipf_traffic() -> None:
    # One key group takes most of the traffic; the others' rates differ by a factor of 3 and
    # their sizes a little, the colder ones being a little smaller. Dividing rates by the
    # hottest one's made them all about 0 and let the size decide: the warmest went first.
    candidates = [Candidate(kg, size=880 + 6 * kg, rate=10.0 + kg) for kg in range(19)]
    candidates.append(Candidate(19, size=1000, rate=10_000.0))
    chosen = [c.key_group for c, _ in choose_spill(candidates, 9 * 900, 0.5)]
    assert sorted(chosen) == list(range(len(chosen)))
    # close rates: the size decides
    even = [Candidate(kg, size=100 + 50 * kg, rate=100.0 + kg % 2) for kg in range(10)]
    assert [c.key_group for c, _ in choose_spill(even, 1, 0.5)] == [9]


def test_records_served_from_disk_are_counted_by_the_tier_they_were_in(tmp_path: Path) -> None:
    backend = KeyedStateBackend(KeyGroupRange.of(16), 16)
    count = backend.get_state(ValueStateDescriptor[int]("count"))
    manager = SpillManager(backend, SpillStorage([str(tmp_path)], 1 << 16))
    words = [f"w{n}" for n in range(200)]

    def run() -> int:
        on_disk = 0
        for word in words:
            backend.set_current_key(word)
            count.update((count.value() or 0) + 1)
            on_disk += manager.is_spilled(assign_to_key_group(word, 16))
        return on_disk

    first = run()
    assert first == 0
    for kg in range(0, 16, 3):
        manager.spill_key_group(kg)
    second = run()
    manager.load_key_group(0)
    third = run()
    manager.refresh_accounting()
    assert manager.records_counted == 3 * len(words)
    assert manager.records_on_disk == second + third > third > 0
    manager.close()

"""Spill storage: crash leftovers, clean exit, disk full, unwritable dirs, rotation, versions."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from statetier.backend.descriptors import ListStateDescriptor, ValueStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.serializers import DEFAULT_SERIALIZER
from statetier.backend.spill import SpaceUnavailableError, SpilledMap, SpillManager, SpillStorage
from statetier.backend.spill.lifecycle import PREFIX
from statetier.backend.spill.spilled_map import MapCodec

MAX_P = 16
S = DEFAULT_SERIALIZER
CODEC = MapCodec(S.dumps, S.loads, S.dumps, S.loads)


def _map(storage: SpillStorage, items: dict[Any, Any] | None = None) -> SpilledMap:
    return SpilledMap(storage, CODEC, (items or {}).items())


def _spill_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(PREFIX))


def _errors(reason: str) -> float:
    return REGISTRY.get_sample_value("statetier_spill_errors_total", {"reason": reason}) or 0.0


# ----------------------------------------------------------------------------- lifecycle

_CHILD = textwrap.dedent(
    """
    import sys, time
    from statetier.backend.serializers import DEFAULT_SERIALIZER as S
    from statetier.backend.spill import SpilledMap, SpillStorage
    from statetier.backend.spill.spilled_map import MapCodec
    storage = SpillStorage([sys.argv[1]], 1 << 16)
    spilled = SpilledMap(storage, MapCodec(S.dumps, S.loads, S.dumps, S.loads), {"k": 1}.items())
    print("ready", flush=True)
    if sys.argv[2] == "sleep":
        time.sleep(60)
    """
)


def _child(directory: Path, mode: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(directory), mode], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def test_files_of_a_killed_process_are_removed_at_start(tmp_path: Path) -> None:
    killed = _child(tmp_path, "sleep")
    alive = _child(tmp_path, "sleep")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        left = _spill_files(tmp_path)
        assert any(f"-{killed.pid}-" in n for n in left), left  # the crash left its files
        storage = SpillStorage([str(tmp_path)], 1 << 16)
        after = _spill_files(tmp_path)
        assert not any(f"-{killed.pid}-" in n for n in after)
        # a live process's chunk and lock are left alone (it holds its lock)
        assert any(f"-{alive.pid}-" in n and n.endswith(".chunk") for n in after)
        assert any(n.endswith(".lock") and f"-{alive.pid}-" in n for n in after)
        assert len(storage.dirs.removed_stale) >= 2
        storage.close()
    finally:
        alive.kill()
        alive.wait()


def test_clean_exit_removes_everything(tmp_path: Path) -> None:
    child = _child(tmp_path, "exit")  # exits without close(): atexit cleans up
    assert child.wait() == 0
    assert _spill_files(tmp_path) == []
    storage = SpillStorage([str(tmp_path)], 1 << 16)
    spilled = _map(storage, {"a": 1})
    assert any(n.endswith(".chunk") for n in _spill_files(tmp_path))
    assert spilled["a"] == 1
    storage.close()
    assert _spill_files(tmp_path) == []


# ----------------------------------------------------------------------------- failures


def _backend_with_state() -> tuple[KeyedStateBackend, dict[str, int], dict[str, list[int]]]:
    backend = KeyedStateBackend(KeyGroupRange.of(MAX_P), MAX_P)
    count = backend.get_state(ValueStateDescriptor[int]("count"))
    seen = backend.get_state(ListStateDescriptor[int]("seen"))
    counts, lists = {}, {}
    for n in range(400):
        key = f"w{n}"
        backend.set_current_key(key)
        count.update(n)
        seen.add_all([n, n + 1])
        counts[key], lists[key] = n, [n, n + 1]
    return backend, counts, lists


def _assert_state(
    backend: KeyedStateBackend, counts: dict[str, int], lists: dict[str, Any]
) -> None:
    count = backend.get_state(ValueStateDescriptor[int]("count"))
    seen = backend.get_state(ListStateDescriptor[int]("seen"))
    for key, value in counts.items():
        backend.set_current_key(key)
        assert count.value() == value
        assert seen.get() == lists[key]


def test_unwritable_spill_dir_keeps_key_groups_on_heap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    backend, counts, lists = _backend_with_state()
    before = _errors("ENOENT")
    with caplog.at_level(logging.ERROR):
        manager = SpillManager(backend, SpillStorage([str(blocker / "spill")], 1 << 16))
        assert not manager.spill_key_group(3)
        assert not manager.spill_key_group(4)
    assert manager.tier(3) == "heap" and manager.spilled == {}
    assert _errors("ENOENT") == before + 2
    # logged once per kind of error, however often it happens
    spill_errors = [r for r in caplog.records if "stays on heap" in r.getMessage()]
    assert len(spill_errors) == 1
    _assert_state(backend, counts, lists)
    manager.close()


def test_disk_full_on_spill_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, counts, lists = _backend_with_state()
    manager = SpillManager(backend, SpillStorage([str(tmp_path)], 1 << 16))

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)  # the file-write boundary
    before = _errors("ENOSPC")
    assert not manager.spill_key_group(5)
    assert manager.tier(5) == "heap"
    assert _errors("ENOSPC") == before + 1
    assert [n for n in os.listdir(tmp_path) if n.endswith(".chunk")] == []
    _assert_state(backend, counts, lists)
    manager.close()


def test_disk_full_while_a_spilled_key_group_grows_moves_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, counts, lists = _backend_with_state()
    manager = SpillManager(backend, SpillStorage([str(tmp_path)], 1 << 16))
    key_group = assign_to_key_group("w1", MAX_P)
    assert manager.spill_key_group(key_group)
    real = os.posix_fallocate

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    seen = backend.get_state(ListStateDescriptor[int]("seen"))
    backend.set_current_key("w1")
    big = list(range(30_000))  # needs a bigger log than the first chunk can give
    seen.add_all(big)
    lists["w1"] = lists["w1"] + big
    assert manager.tier(key_group) == "heap"  # moved back to take the write
    _assert_state(backend, counts, lists)
    monkeypatch.setattr(os, "posix_fallocate", real)
    assert manager.spill_key_group(key_group)  # space again: it can go
    _assert_state(backend, counts, lists)
    manager.close()


# ----------------------------------------------------------------------------- space


def test_chunks_rotate_over_the_spill_dirs(tmp_path: Path) -> None:
    dirs = [tmp_path / "ssd0", tmp_path / "ssd1", tmp_path / "ssd2"]
    storage = SpillStorage([str(d) for d in dirs], 1 << 16)
    maps = [_map(storage, {f"k{i}-{j}": "x" * 200 for j in range(100)}) for i in range(12)]
    per_dir = [len([n for n in os.listdir(d) if n.endswith(".chunk")]) for d in dirs]
    assert all(count >= 2 for count in per_dir), per_dir
    assert max(per_dir) - min(per_dir) <= 1  # round robin
    for i, spilled in enumerate(maps):
        assert spilled[f"k{i}-7"] == "x" * 200
    storage.close()


def test_freed_space_is_reused_and_fragmented_chunks_compacted(tmp_path: Path) -> None:
    storage = SpillStorage([str(tmp_path)], 1 << 16)
    maps = [_map(storage, {f"k{i}-{j}": j for j in range(200)}) for i in range(20)]
    chunks = len(storage.chunks)
    assert chunks >= 3
    used = storage.used_bytes()
    for spilled in maps[::2]:
        spilled.release()
    assert storage.used_bytes() < used
    again = [_map(storage, {f"n{i}-{j}": j for j in range(200)}) for i in range(10)]
    assert len(storage.chunks) <= chunks + 1  # the freed space took them
    for spilled in again:
        spilled.release()
    for spilled in maps[1::2][:6]:
        spilled.release()
    fragmented = len(storage.chunks)
    assert storage.compact() >= 1
    assert len(storage.chunks) < fragmented
    for i, spilled in list(enumerate(maps))[1::2][6:]:  # survivors moved, still readable
        assert dict(spilled.items()) == {f"k{i}-{j}": j for j in range(200)}
        spilled[f"k{i}-0"] = -1
        assert spilled[f"k{i}-0"] == -1
    storage.close()


def test_a_frozen_view_reads_the_old_version_while_writes_go_on(tmp_path: Path) -> None:
    storage = SpillStorage([str(tmp_path)], 1 << 16)
    old = {f"k{j}": j for j in range(300)}
    spilled = _map(storage, old)
    view = spilled.frozen()
    for j in range(300):  # overwrites of the same length, appends, deletes, growth
        spilled[f"k{j}"] = j + 1 if j % 3 else "changed"
    for j in range(0, 300, 7):
        del spilled[f"k{j}"]
    for j in range(2000):
        spilled[f"new{j}"] = [j]
    assert dict(view.items()) == old
    assert view["k5"] == 5 and len(view) == 300
    assert spilled["k5"] == 6 and "k7" not in spilled
    used_with_view = storage.used_bytes()
    view.close()
    assert storage.used_bytes() < used_with_view  # the old log was freed at the last unpin
    with pytest.raises(ValueError):
        view["k5"]
    storage.close()


def test_no_space_at_all_raises_a_typed_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    storage = SpillStorage([str(blocker / "x")], 1 << 16)
    with pytest.raises(SpaceUnavailableError):
        _map(storage, {"a": 1})
    storage.close()

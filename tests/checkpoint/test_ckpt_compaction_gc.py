"""Local compaction (count and size-ratio triggers) never changes what a restore returns;
retention keeps the last N epochs and deletes every file none of them names; the Compactor
interface speaks JSON-serializable requests and results."""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY
from statetier.backend.compaction_client import RemoteCompactor
from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot import (
    CompactionRequest,
    CompactionResult,
    CorruptFileError,
    LocalCompactor,
    SnapshotStore,
    process_compactor,
)
from statetier.backend.snapshot.chain_compaction import CUT_FACTOR
from statetier.backend.snapshot.compaction import CompactionError, make_request, needs_compaction
from statetier.backend.snapshot.gc import collect_garbage
from statetier.backend.snapshot.layout import epoch_of
from statetier.backend.snapshot.process_compactor import MERGE_NICENESS, ProcessCompactor
from statetier.backend.snapshot.upkeep import WHOLE_LISTING_EVERY
from statetier.backend.snapshot.verify import verify_store
from statetier.tools.ports import free_port

from tests.checkpoint.ckpt_support import MAX_P, Accumulate, Location, dump_keyed, records


def make(
    location: Location, parallelism: int = 2, config: dict[str, object] | None = None
) -> LocalRunner:
    return location.runner(parallelism, config=load_config(config or {}))


def restored(location: Location, parallelism: int = 3) -> dict[str, Any]:
    return dump_keyed(make(location, parallelism))


def test_count_trigger_compacts_without_changing_restores(location: Location) -> None:
    live = make(location, config={"compaction.delta-trigger": 3, "compaction.size-ratio": 100.0})
    compacted_seen = False
    for epoch in range(1, 9):
        live.process(records(epoch))
        manifest = live.checkpoint()
        live.checkpointer.drain()  # type: ignore[union-attr]
        assert all(len(c.deltas) <= 3 for c in manifest.chains())
        compacted_seen |= any("/compacted/" in c.base.path for c in manifest.chains())
        assert restored(location) == dump_keyed(live), f"epoch {epoch}"
    assert compacted_seen
    assert verify_store(location.store()).ok


def test_size_ratio_trigger(location: Location) -> None:
    live = make(location, config={"compaction.delta-trigger": 100, "compaction.size-ratio": 0.3})
    live.process(records(1, n=100))
    live.checkpoint()
    live.process(records(2, n=3000))  # deltas larger than 0.3 x the small bases
    live.checkpoint()
    live.checkpointer.drain()  # type: ignore[union-attr]
    live.process(records(3, n=10))
    manifest = live.checkpoint()
    assert any("/compacted/" in c.base.path for c in manifest.chains())
    assert restored(location) == dump_keyed(live)


def test_retention_deletes_what_no_retained_manifest_names(location: Location) -> None:
    live = make(
        location,
        config={
            "checkpoint.retained": 2,
            "compaction.delta-trigger": 2,
            "checkpoint.incremental": True,
        },
    )
    for epoch in range(1, 8):
        live.process(records(epoch))
        live.checkpoint()
        live.checkpointer.drain()  # type: ignore[union-attr]
    store = location.store()
    assert store.epochs() == [6, 7]
    named = {f.path for e in (6, 7) for f in store.manifest(e).files()}
    for name in store.list_files():
        if name.startswith("manifests/"):
            continue
        file_epoch = epoch_of(name)
        assert name in named or (file_epoch is not None and file_epoch >= 6), name
    assert verify_store(store).ok
    assert restored(location, 1) == dump_keyed(live)
    # an offline gc keeping one epoch: nothing epoch 7 needs goes
    report = collect_garbage(store, 1)
    assert store.epochs() == [7] and report.deleted_manifests == ["manifests/epoch-0000000006.json"]
    assert verify_store(store).ok
    assert restored(location, 2) == dump_keyed(live)


def test_retention_after_each_commit_lists_only_what_falls_out_between_whole_listings(
    location: Location,
) -> None:
    """A stray file in an epoch retention collected already (a zombie attempt's late upload)
    is not seen by the short listings, only by the next whole one; files of the epochs
    falling out, and bases only dropped manifests name, go at once."""
    live = make(location, config={"checkpoint.retained": 2, "compaction.delta-trigger": 2})
    store = location.store()
    stray = "data/epoch-0000000001/zombie-t9/acc/0-63.delta.kgd"

    def commit(epoch: int) -> None:
        live.process(records(epoch))
        live.checkpoint()
        live.checkpointer.drain()  # type: ignore[union-attr]

    for epoch in range(1, 4):  # the first retention lists everything
        commit(epoch)
    store.put(stray, b"late")
    for epoch in range(4, 4 + WHOLE_LISTING_EVERY - 3):  # retention runs 3 .. 9: short
        commit(epoch)
        kept = store.epochs()
        assert kept == [epoch - 1, epoch]
        named = {f.path for e in kept for f in store.manifest(e).files()}
        for name in store.list_files():
            file_epoch = epoch_of(name)
            assert name == stray or name in named or file_epoch in kept, name
    assert stray in store.list_files()
    commit(4 + WHOLE_LISTING_EVERY - 3)  # retention run 10: a whole listing again
    assert stray not in store.list_files()
    assert verify_store(store).ok
    assert restored(location, 3) == dump_keyed(live)


def test_a_short_collection_leaves_older_epochs_and_newer_files_alone(location: Location) -> None:
    live = make(location, config={"checkpoint.retained": 100})
    for epoch in range(1, 6):
        live.process(records(epoch))
        live.checkpoint()
        live.checkpointer.drain()  # type: ignore[union-attr]  # no compaction in flight
    store = location.store()
    before = set(store.list_files())
    store.put("data/epoch-0000000001/zombie/x.kgd", b"late")
    store.put("data/epoch-0000000006/inflight/x.kgd", b"new")
    store.put("operator/epoch-0000000002/failed/0-of-2.ops", b"unnamed")  # not listed
    # epochs 2 and 3 fall out; 1 was collected (its directory is not listed again; what
    # its dropped manifest names goes)
    report = collect_garbage(store, 2, since=2)
    assert report.retained_epochs == [4, 5]
    assert report.deleted_manifests == [f"manifests/epoch-000000000{e}.json" for e in (1, 2, 3)]
    left = set(store.list_files())
    named = {f.path for e in (4, 5) for f in store.manifest(e).files()}
    assert "data/epoch-0000000001/zombie/x.kgd" in left
    assert "data/epoch-0000000006/inflight/x.kgd" in left
    assert "operator/epoch-0000000002/failed/0-of-2.ops" in left
    assert not [
        n
        for n in left
        if n.startswith("operator/")
        and epoch_of(n) in (1, 2, 3)
        and n not in named
        and "failed" not in n
    ]
    falling_out = {n for n in before if epoch_of(n) in (2, 3)}
    assert falling_out - named and not (falling_out - named) & left
    collect_garbage(store, 2)  # the whole listing finds what the short one left
    assert "data/epoch-0000000001/zombie/x.kgd" not in store.list_files()
    assert "operator/epoch-0000000002/failed/0-of-2.ops" not in store.list_files()
    assert restored(location, 2) == dump_keyed(live)


class JsonCompactor:
    """What a remote compactor does: the request and result cross a wire as JSON."""

    def __init__(self, store: SnapshotStore) -> None:
        self.inner = LocalCompactor(filesystem=store.fs)
        self.requests: list[dict[str, Any]] = []

    def compact(self, request: CompactionRequest) -> CompactionResult:
        wire = request.to_json()
        self.requests.append(__import__("json").loads(wire))
        result = self.inner.compact(CompactionRequest.from_json(wire))
        return CompactionResult.from_json(result.to_json())


def test_a_compactor_plugs_in_through_json(location: Location) -> None:
    live = make(location, config={"compaction.delta-trigger": 2, "compaction.size-ratio": 100.0})
    assert live.checkpointer is not None
    compactor = JsonCompactor(live.checkpointer.store)
    live.checkpointer.compactor = compactor
    for epoch in range(1, 5):
        live.process(records(epoch))
        live.checkpoint()
        live.checkpointer.drain()
    assert compactor.requests
    request = compactor.requests[0]
    assert set(request) >= {"job_id", "inputs", "key_groups", "output_prefix", "format_version"}
    assert request["inputs"][0]["kind"] == "base" and request["output_prefix"].startswith(
        location.uri
    )
    assert restored(location) == dump_keyed(live)


def test_compactor_refuses_bad_input(location: Location) -> None:
    live = make(location, config={"compaction.delta-trigger": 100})
    live.process(records(1))
    live.checkpoint()
    live.process(records(2))
    manifest = live.checkpoint()
    store = location.store()
    chain = manifest.chains()[0]
    compactor = LocalCompactor(filesystem=store.fs)
    request = make_request(store.url, chain.state, chain.files, "data/tmp-out", MAX_P)
    result = compactor.compact(request)
    assert result.outputs[0].size > 0 and result.entries > 0
    newer = CompactionRequest.from_json(
        request.to_json().replace('"format_version": 2', '"format_version": 99')
    )
    with pytest.raises(CompactionError):
        compactor.compact(newer)
    lying = make_request(store.url, chain.state, chain.files, "data/tmp-out", MAX_P)
    first = lying.inputs[0]
    tampered = CompactionRequest.from_json(
        lying.to_json().replace(f'"crc32": {first.crc32}', '"crc32": 1', 1)
    )
    with pytest.raises(CorruptFileError):
        compactor.compact(tampered)


def test_maintenance_of_a_superseded_epoch_skips_compaction(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Maintenance jobs queue up behind a slow compaction when epochs are short. A job for an
    epoch that a newer commit superseded must not compact that epoch's chains: retention, run
    for the newer epochs meanwhile, may have deleted their files (it did, and every such job
    logged a failed compaction with a traceback)."""
    live = LocalRunner(
        Accumulate,
        1,
        max_parallelism=MAX_P,
        checkpoint_uri=f"file://{tmp_path}",
        config=load_config({"checkpoint.retained": 2, "compaction.delta-trigger": 2}),
    )
    stale = None
    for epoch in range(1, 7):
        live.process(records(epoch, n=50))
        manifest = live.checkpoint()
        if stale is None and any(needs_compaction(c, 2, 1.0) for c in manifest.chains()):
            stale = manifest  # due for compaction (and compacted by its own job, in time)
        live.checkpointer.drain()  # type: ignore[union-attr]
    assert stale is not None and stale.epoch <= 4
    store = live.store
    assert store is not None and store.epochs() == [5, 6]
    assert any(not store.fs.exists(store.full_path(f.path)) for f in stale.files())
    caplog.clear()
    live.checkpointer._maintain(stale)  # type: ignore[union-attr]  # a job that waited too long
    assert not [r for r in caplog.records if "maintenance" in r.getMessage()]
    assert verify_store(store).ok
    live.close()


def _samples(name: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(name, {"outcome": outcome})
    return value or 0.0


def test_a_failing_compactor_never_stops_retention(
    location: Location, caplog: pytest.LogCaptureFixture
) -> None:
    """A compaction service that is down (a real client, an address nobody serves, no
    fallback): every compaction fails, yet retention keeps 3 epochs and chains stay bounded."""
    live = make(
        location,
        config={
            "checkpoint.retained": 3,
            "compaction.delta-trigger": 2,
            "compaction.size-ratio": 100.0,
        },
    )
    assert live.checkpointer is not None
    live.checkpointer.compactor = RemoteCompactor(
        [f"http://127.0.0.1:{free_port()}"], timeout=2, retries=0, failure_strategy="fail"
    )
    failed = _samples("statetier_compactions_total", "failed")
    retained = _samples("statetier_retention_runs_total", "succeeded")
    caplog.set_level(logging.INFO, logger="statetier.backend.snapshot")
    longest = 0
    for epoch in range(1, 16):
        live.process(records(epoch))
        manifest = live.checkpoint()
        live.checkpointer.drain()
        longest = max([longest, *(len(c.deltas) for c in manifest.chains())])
    store = location.store()
    assert store.epochs() == [13, 14, 15]
    assert longest <= CUT_FACTOR * 2  # a chain compaction cannot shorten is cut
    named = {f.path for e in store.epochs() for f in store.manifest(e).files()}
    data = [n for n in store.list_files() if not n.startswith("manifests/")]
    assert set(data) <= named | {n for n in data if (epoch_of(n) or 0) >= 13}
    assert _samples("statetier_compactions_total", "failed") > failed
    # (other tests' background maintenance may add to the process-wide counters meanwhile)
    assert _samples("statetier_retention_runs_total", "succeeded") >= retained + 15
    messages = [r.getMessage() for r in caplog.records]
    assert any("compaction of" in m and "failed" in m for m in messages)
    for epoch in range(1, 16):
        assert any(m.startswith(f"retention after epoch {epoch}:") for m in messages), epoch
    assert restored(location) == dump_keyed(live)


class Counting:
    """Counts the merges a compactor was asked for."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def compact(self, request: CompactionRequest) -> CompactionResult:
        self.calls += 1
        result: CompactionResult = self.inner.compact(request)
        return result


def test_merges_in_a_child_process_restore_the_same_and_survive_its_death(
    location: Location,
) -> None:
    """The Spark driver's local compactor: merges in a child process (the GIL stays with the
    driver's own work) at a lower CPU priority; a child that dies fails that merge only, the
    next one starts anew."""
    live = make(location, config={"compaction.delta-trigger": 2, "compaction.size-ratio": 100.0})
    assert live.checkpointer is not None
    store = live.checkpointer.store
    child = ProcessCompactor(LocalCompactor(filesystem=store.fs))
    counting = Counting(child)
    live.checkpointer.compactor = counting
    try:
        for epoch in range(1, 5):
            live.process(records(epoch))
            live.checkpoint()
            live.checkpointer.drain()
        assert counting.calls >= 1
        assert any("/compacted/" in c.base.path for c in store.manifest().chains())
        assert restored(location) == dump_keyed(live)
        assert child.pid is not None
        # background work: the merges yield the CPU to the executors a driver shares it with
        expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + MERGE_NICENESS)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == expected
        os.kill(child.pid, signal.SIGKILL)  # the child is killed (out of memory, say)
        calls = counting.calls
        for epoch in range(5, 11):
            live.process(records(epoch))
            live.checkpoint()
            live.checkpointer.drain()
        assert counting.calls > calls + 1  # the merge that met the dead child, then more
        assert restored(location) == dump_keyed(live)
    finally:
        process_compactor.stop_merge_process()
        live.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _compacting(location: Location, child: ProcessCompactor, epochs: range) -> LocalRunner:
    """A runner whose merges go through ``child``, run for ``epochs``; it made at least one."""
    live = make(location, config={"compaction.delta-trigger": 2, "compaction.size-ratio": 100.0})
    assert live.checkpointer is not None
    counting = Counting(child)
    live.checkpointer.compactor = counting
    for epoch in epochs:
        live.process(records(epoch))
        live.checkpoint()
        live.checkpointer.drain()
    assert counting.calls >= 1
    return live


@pytest.mark.parametrize("location", ["file"], indirect=True)  # the store does not matter
def test_the_merge_process_is_the_processs_shared_and_stops_when_idle(
    location: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver's pipelines, one after another, merge in one child: the second does not start
    an interpreter and an object store client again. It stops after an idle while, or when told."""
    monkeypatch.setattr(process_compactor, "IDLE_SECONDS", 1.5)
    first, second = (ProcessCompactor(LocalCompactor(filesystem=location.store().fs)) for _ in "ab")
    live = _compacting(location, first, range(1, 5))
    pid = first.pid
    assert pid is not None and second.pid == pid
    live.close()  # one pipeline is done: the child stays for the others
    again = _compacting(location, second, range(5, 9))
    assert second.pid == pid and second.cpu_seconds > 0
    assert restored(location) == dump_keyed(again)
    again.close()
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:  # idle: it stops
        time.sleep(0.1)
    assert not _alive(pid) and second.pid is None
    live = _compacting(location, second, range(9, 13))  # a merge starts a new one
    pid = second.pid
    assert pid is not None
    process_compactor.stop_merge_process()
    assert not _alive(pid) and second.pid is None
    live.close()


UNGUARDED_DRIVER = """
import sys
from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot.compaction import LocalCompactor
from statetier.backend.snapshot.process_compactor import ProcessCompactor
from tests.checkpoint.ckpt_support import Accumulate, records

print("the script's top level ran", flush=True)
config = load_config({"compaction.delta-trigger": 2, "compaction.size-ratio": 100.0})
runner = LocalRunner(Accumulate, 2, max_parallelism=16, checkpoint_uri=sys.argv[1], config=config)
child = ProcessCompactor(LocalCompactor(filesystem=runner.checkpointer.store.fs))
runner.checkpointer.compactor = child
for epoch in range(1, 7):
    runner.process(records(epoch))
    runner.checkpoint()
    runner.checkpointer.drain()
print("compacted bases:", sum("/compacted/" in c.base.path
      for c in runner.checkpointer.store.manifest().chains()), flush=True)
runner.close()
"""


def test_a_driver_script_without_a_main_guard_runs_once(tmp_path: Any) -> None:
    """The merge process is a module of its own, not the driver's script run again: a user's
    script without ``if __name__ == "__main__"`` is not executed a second time in it (as
    multiprocessing's spawn would: a second Spark job, started from the merge process)."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "driver.py"
    script.write_text(UNGUARDED_DRIVER)
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(script), f"file://{tmp_path}/ckpt"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("the script's top level ran") == 1, done.stdout
    compacted = int(done.stdout.rsplit("compacted bases:", 1)[1])
    assert compacted >= 1, done.stdout

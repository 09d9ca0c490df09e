"""Savepoints on file:// and SeaweedFS: ``statetier checkpoint savepoint`` as a real process,
the savepoint's content, ``delete-savepoint``, ``verify`` on damage, and
``checkpoint.restore-from`` in the local runner (at another parallelism, never writing the
savepoint). The Spark half (a streaming query resumed exactly) is in tests/spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from statetier.backend.config import load_config
from statetier.backend.snapshot import CorruptFileError, SnapshotStore
from statetier.backend.snapshot.layout import TOP_DIRS
from statetier.backend.snapshot.savepoint import MARKER
from statetier.backend.ttl import ManualClock

from tests.checkpoint.ckpt_support import (
    CLOCK_MS,
    Location,
    dump_keyed,
    dump_operator,
    expected_keyed,
    records,
)

EPOCHS = 5


def statetier(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``statetier`` command, a process of its own (as the operator's Job runs it)."""
    command = [sys.executable, "-m", "statetier.backend", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def sibling(location: Location, name: str) -> Location:
    """Another location on the same storage as ``location``."""
    root = f"{location.root.rsplit('/', 1)[0]}/{name}-{uuid.uuid4().hex[:8]}"
    scheme = "s3" if location.kind == "s3" else "file"
    return Location(location.kind, f"{scheme}://{root}", root, location.options)


@pytest.fixture
def source(location: Location) -> Location:
    """A checkpoint of EPOCHS epochs at parallelism 2 whose chains have deltas (no compaction)."""
    config = load_config({"checkpoint.retained": 10, "compaction.delta-trigger": 100})
    runner = location.runner(2, config=config, clock=ManualClock(CLOCK_MS))
    for epoch in range(1, EPOCHS + 1):
        runner.process(records(epoch))
        runner.checkpoint()
    runner.close()
    return location


def take(source: Location, dest: Location, *extra: str) -> subprocess.CompletedProcess[str]:
    return statetier("checkpoint", "savepoint", source.uri, dest.uri, *extra, *source.cli_options())


def test_a_savepoint_is_one_epoch_self_contained_with_its_chains_merged(source: Location) -> None:
    dest = sibling(source, "savepoint")
    done = take(source, dest, "--epoch", "4", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # exactly one JSON object
    store, origin = dest.store(), source.store()
    manifest = store.manifest()
    assert report == {
        "uri": dest.uri,
        "source": source.uri,
        "epoch": 4,
        "bytes": sum(f.size for f in manifest.files()),
        "files": len(manifest.files()),
        "spark_batch": None,
    }
    assert store.epochs() == [4] and manifest.parallelism == 2
    assert all(not chain.deltas for chain in manifest.chains())  # 3 deltas each: merged
    assert any(chain.deltas for chain in origin.manifest(4).chains())
    listed = set(store.list_files())
    assert {f.path for f in manifest.files()} | {store.manifest_name(4)} == listed
    # the same state as the source's epoch 4, restored at another parallelism
    restored = dest.runner(3)
    assert dump_keyed(restored) == expected_keyed(4)
    restored.close()
    # verify, list and inspect read it as a checkpoint
    assert statetier("checkpoint", "verify", dest.uri, *dest.cli_options()).returncode == 0
    listing = statetier("checkpoint", "list", dest.uri, "--json", *dest.cli_options())
    assert [row["epoch"] for row in json.loads(listing.stdout)] == [4]
    inspect = statetier("checkpoint", "inspect", dest.uri, *dest.cli_options())
    assert inspect.stdout.startswith("epoch 4") and "deltas: none" in inspect.stdout


def test_a_destination_with_a_savepoint_is_refused_and_gc_never_touches_one(
    source: Location,
) -> None:
    dest = sibling(source, "savepoint")
    assert take(source, dest).returncode == 0
    before = dest.store().list_files()
    again = take(source, dest, "--json")
    assert again.returncode == 1 and again.stdout == ""
    assert len(again.stderr.strip().splitlines()) <= 2
    assert f"{dest.uri} already holds a savepoint" in again.stderr
    gc = statetier("checkpoint", "gc", dest.uri, "--retained", "1", *dest.cli_options())
    assert gc.returncode == 2 and "is a savepoint" in gc.stderr
    assert dest.store().list_files() == before
    usage = statetier("checkpoint", "savepoint", source.uri)
    assert usage.returncode == 2 and "DEST_URI" in usage.stderr
    missing = take(source, sibling(source, "other"), "--epoch", "99")
    assert missing.returncode == 1 and "epoch 99 is not committed" in missing.stderr


def test_delete_savepoint_removes_only_the_savepoints_files(source: Location) -> None:
    dest = sibling(source, "savepoint")
    assert take(source, dest).returncode == 0
    store = dest.store()
    store.write("notes/keep-me.txt", b"not the savepoint's")
    refused = statetier("checkpoint", "delete-savepoint", source.uri, *source.cli_options())
    assert refused.returncode == 1 and "holds no savepoint" in refused.stderr
    assert source.store().epochs() == list(range(1, EPOCHS + 1))
    done = statetier("checkpoint", "delete-savepoint", dest.uri, *dest.cli_options())
    assert done.returncode == 0, done.stderr
    left = [name for name in store.list_files() if name not in TOP_DIRS]  # (empty dirs)
    assert left == []  # data, operator and manifests: all gone
    assert store.fs.exists(store.full_path("notes/keep-me.txt"))
    assert not store.fs.exists(store.full_path(MARKER))


def flip_a_bit(store: SnapshotStore, name: str) -> None:
    path = store.full_path(name)
    data = bytearray(store.fs.cat_file(path))
    data[len(data) // 2] ^= 0x10
    store.fs.pipe_file(path, bytes(data))


def test_bit_flips_in_a_savepoint_are_found_by_verify_and_by_the_restore(
    source: Location,
) -> None:
    dest = sibling(source, "savepoint")
    assert take(source, dest).returncode == 0
    store = dest.store()
    damaged = max(store.manifest().keyed_files, key=lambda f: f.size)
    flip_a_bit(store, damaged.path)
    verify = statetier("checkpoint", "verify", dest.uri, *dest.cli_options())
    assert verify.returncode == 1
    problems = [line for line in verify.stdout.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 1 and damaged.path in problems[0]
    target = sibling(source, "restored")
    config = load_config({"checkpoint.restore-from": dest.uri})
    with pytest.raises(CorruptFileError, match=damaged.path.rsplit("/", 1)[-1]):
        target.runner(3, config=config)
    # the damage never became the new location's epoch: a next start tries the savepoint again
    assert target.store().epochs() == []
    flip_a_bit(store, MARKER)
    verify = statetier("checkpoint", "verify", dest.uri, *dest.cli_options())
    assert verify.returncode == 1 and "savepoint marker fails its checksum" in verify.stdout


def test_restore_from_starts_a_new_location_at_another_parallelism(source: Location) -> None:
    dest = sibling(source, "savepoint")
    assert take(source, dest, "--epoch", "3").returncode == 0
    savepoint_files = dest.store().list_files()
    target = sibling(source, "restored")
    config = load_config({"checkpoint.restore-from": dest.uri, "checkpoint.retained": 1})
    runner = target.runner(3, config=config, clock=ManualClock(CLOCK_MS))
    assert runner.restored_epoch == 3
    assert dump_keyed(runner) == expected_keyed(3)
    assert dump_operator(runner) == dump_operator(dest.runner(3))  # the savepoint's, as read
    for epoch in range(4, EPOCHS + 2):
        runner.process(records(epoch))
        runner.checkpoint()
    runner.close()
    assert dump_keyed(target.runner(4)) == expected_keyed(EPOCHS + 1)
    # retention of the new location dropped the restored epoch; the savepoint is unchanged
    assert target.store().epochs() == [EPOCHS + 1]
    assert dest.store().list_files() == savepoint_files
    # a location that has epochs resumes them: the setting is ignored
    again = target.runner(2, config=config)
    assert again.restored_epoch == EPOCHS + 1
    again.close()


def test_a_location_started_from_a_savepoint_outlives_it(source: Location) -> None:
    """The restore reads the savepoint while its copy runs; the first checkpoint commits the
    copy first, so deleting the savepoint and collecting the location break nothing."""
    dest = sibling(source, "savepoint")
    assert take(source, dest, "--epoch", "4").returncode == 0
    target = sibling(source, "restored")
    config = load_config({"checkpoint.restore-from": dest.uri, "checkpoint.retained": 1})
    runner = target.runner(2, config=config, clock=ManualClock(CLOCK_MS))
    assert runner.restored_epoch == 4 and dump_keyed(runner) == expected_keyed(4)
    assert target.store().epochs() == []  # nothing committed before the first checkpoint
    runner.process(records(5))
    runner.checkpoint()  # a delta on the copied chains; retention then drops epoch 4
    runner.close()
    assert target.store().epochs() == [5]
    deleted = statetier("checkpoint", "delete-savepoint", dest.uri, *dest.cli_options())
    assert deleted.returncode == 0, deleted.stderr
    gc = statetier("checkpoint", "gc", target.uri, "--retained", "1", *target.cli_options())
    assert gc.returncode == 0, gc.stderr
    assert statetier("checkpoint", "verify", target.uri, *target.cli_options()).returncode == 0
    resumed = target.runner(3, config=config)
    assert resumed.restored_epoch == 5 and dump_keyed(resumed) == expected_keyed(5)
    resumed.close()


def test_a_savepoint_is_refused_as_a_pipelines_own_location(source: Location) -> None:
    dest = sibling(source, "savepoint")
    assert take(source, dest).returncode == 0
    config = load_config({"checkpoint.restore-from": source.uri})
    with pytest.raises(ValueError, match="holds a savepoint"):
        dest.runner(2, config=config)
    not_one = sibling(source, "restored")
    with pytest.raises(FileNotFoundError, match="holds no savepoint"):
        not_one.runner(2, config=config)


def test_credentials_come_from_the_environment(source: Location) -> None:
    if source.kind != "s3":
        pytest.skip("object-store credentials")
    dest = sibling(source, "savepoint")
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": source.options["key"],
        "AWS_SECRET_ACCESS_KEY": source.options["secret"],
        "AWS_ENDPOINT_URL": source.options["endpoint_url"],
    }
    command = [sys.executable, "-m", "statetier.backend", "checkpoint", "savepoint"]
    done = subprocess.run(
        [*command, source.uri, dest.uri, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["epoch"] == EPOCHS

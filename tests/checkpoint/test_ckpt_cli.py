"""``statetier checkpoint list|inspect|verify|gc URI`` against real checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from statetier.backend.cli import main
from statetier.backend.config import load_config

from tests.checkpoint.ckpt_support import Location, records


@pytest.fixture
def checkpointed(location: Location) -> Location:
    runner = location.runner(
        2, config=load_config({"checkpoint.retained": 10, "compaction.delta-trigger": 100})
    )
    for epoch in range(1, 5):
        runner.process(records(epoch, n=600 if epoch == 1 else 40))
        runner.checkpoint()
    runner.close()
    return location


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["checkpoint", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_and_inspect(checkpointed: Location, capsys: pytest.CaptureFixture[str]) -> None:
    opts = checkpointed.cli_options()
    code, out, _ = run(capsys, "list", checkpointed.uri, *opts, "--json")
    rows = json.loads(out)
    assert code == 0 and [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert rows[1]["new_bytes"] < rows[0]["new_bytes"]  # epoch 2 is a delta
    code, out, _ = run(capsys, "list", checkpointed.uri, *opts)
    assert code == 0 and "epoch" in out.splitlines()[0] and len(out.splitlines()) == 5
    code, out, _ = run(capsys, "inspect", checkpointed.uri, *opts, "--epoch", "3")
    assert code == 0 and out.startswith("epoch 3") and "deltas: e2" in out and "residues" in out


def test_verify_finds_and_names_damage(
    checkpointed: Location, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = checkpointed.cli_options()
    code, out, _ = run(capsys, "verify", checkpointed.uri, *opts)
    assert code == 0 and out.startswith("OK: 4 epoch(s)")
    store = checkpointed.store()
    entry = max(store.manifest(4).keyed_files, key=lambda f: f.size)
    path = store.full_path(entry.path)
    data = bytearray(store.fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    store.fs.pipe_file(path, bytes(data))
    code, out, _ = run(capsys, "verify", checkpointed.uri, *opts)
    assert code == 1
    problem = next(line for line in out.splitlines() if line.startswith("PROBLEM"))
    assert path in problem and "block of key group" in problem


def test_gc(checkpointed: Location, capsys: pytest.CaptureFixture[str]) -> None:
    opts = checkpointed.cli_options()
    code, out, _ = run(capsys, "gc", checkpointed.uri, *opts, "--retained", "1", "--dry-run")
    assert code == 0 and "would delete 3 manifest(s)" in out
    assert checkpointed.store().epochs() == [1, 2, 3, 4]
    code, out, _ = run(capsys, "gc", checkpointed.uri, *opts, "--retained", "1")
    assert code == 0 and "deleted 3 manifest(s)" in out
    assert checkpointed.store().epochs() == [4]
    code, out, _ = run(capsys, "verify", checkpointed.uri, *opts)
    assert code == 0


def test_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "list", f"file://{tmp_path}/nothing")
    assert code == 2 and "no committed snapshot" in err
    code, _, err = run(capsys, "verify", f"file://{tmp_path}/nothing")
    assert code == 2 and "no committed snapshot" in err

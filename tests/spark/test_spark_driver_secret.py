"""The secret the coordinators on one Connect driver share (see driver_secret): one per
application, made once even by processes that race, readable by this user only."""

from __future__ import annotations

import concurrent.futures
import os
import stat
import tempfile
from pathlib import Path

import pytest
from statetier.backend.spark.driver_secret import (
    SecretFileError,
    driver_scratch_dir,
    shared_secret,
    shared_secret_path,
)


def test_the_first_caller_makes_the_secret_and_the_others_read_it(tmp_path: Path) -> None:
    first = shared_secret("app-1", str(tmp_path))
    assert len(first) == 32
    assert shared_secret("app-1", str(tmp_path)) == first
    assert shared_secret("app-2", str(tmp_path)) != first  # each application its own
    path = Path(shared_secret_path("app-1", str(tmp_path)))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "statetier-app-1.secret",
        "statetier-app-2.secret",
    ]  # nothing left aside


def _made_in_a_process(directory: str) -> bytes:
    return shared_secret("app-race", directory)


def test_processes_that_race_all_get_one_secret(tmp_path: Path) -> None:
    with concurrent.futures.ProcessPoolExecutor(4) as pool:
        secrets = set(pool.map(_made_in_a_process, [str(tmp_path)] * 16))
    assert len(secrets) == 1


def test_a_file_others_may_read_is_refused_by_name(tmp_path: Path) -> None:
    shared_secret("app-1", str(tmp_path))
    path = shared_secret_path("app-1", str(tmp_path))
    os.chmod(path, 0o644)
    with pytest.raises(SecretFileError, match=rf"{path} is not this user's alone .*-rw-r--r--"):
        shared_secret("app-1", str(tmp_path))


def test_a_file_that_is_not_a_secret_is_refused_by_name(tmp_path: Path) -> None:
    path = Path(shared_secret_path("app-1", str(tmp_path)))
    path.write_text("not hex")
    path.chmod(0o600)
    with pytest.raises(SecretFileError, match=rf"{path} is not a secret \(7 characters\)"):
        shared_secret("app-1", str(tmp_path))
    path.write_text("zz" * 32)
    with pytest.raises(SecretFileError, match=r"is not a secret \(non-hexadecimal"):
        shared_secret("app-1", str(tmp_path))


def test_the_files_go_to_sparks_local_dir_which_spark_deletes_with_the_application(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark gives its Python processes ``SPARK_LOCAL_DIRS`` (the block manager's folders): the
    first that exists holds the files; without one, the temp dir."""
    missing, local = tmp_path / "gone", tmp_path / "blockmgr-1"
    local.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{missing},{local}")
    assert driver_scratch_dir() == str(local)
    assert Path(shared_secret_path("app-1")).parent == local
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    assert driver_scratch_dir() == tempfile.gettempdir()

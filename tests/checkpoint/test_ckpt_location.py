"""A checkpoint location that cannot hold checkpoints is refused when a runner opens it, in one
line naming the location, the setting and the fix (issue 45), on a real file system and a real
S3 server (SeaweedFS) without credentials."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from statetier.backend import LocalRunner
from statetier.backend.snapshot.location import CheckpointLocationError
from statetier.tools.seaweed import BUCKET
from statetier.tools.wordcount import WordCount

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.checkpoint.*

from tests.checkpoint.ckpt_support import S3Server

SETTING = "checkpoint.uri (spark.statetier.checkpoint.uri or STATETIER_CHECKPOINT_URI)"


def _refusal(uri: str, **options: object) -> str:
    with pytest.raises(CheckpointLocationError) as info:
        LocalRunner(WordCount, 1, checkpoint_uri=uri, storage_options=options)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"checkpoint location {uri!r}: "), message
    return message


def test_a_directory_that_cannot_be_created_names_the_setting() -> None:
    message = _refusal("file:///proc/statetier-ckpt")
    assert "cannot create the directory /proc/statetier-ckpt" in message
    assert f"set {SETTING} to a writable directory" in message


def test_a_path_under_a_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    message = _refusal(f"file://{tmp_path}/notes.txt/ckpt")
    assert f"{tmp_path}/notes.txt is a file, not a directory" in message
    assert f"set {SETTING}" in message


def test_a_bucket_without_credentials_says_which_variables_to_set(
    seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    message = _refusal(f"s3://{BUCKET}/no-credentials", endpoint_url=seaweedfs.endpoint)
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment" in message


def test_a_usable_location_is_created_and_opened(tmp_path: Path) -> None:
    runner = LocalRunner(WordCount, 1, checkpoint_uri=f"file://{tmp_path}/a/b")
    runner.close()
    assert (tmp_path / "a" / "b").is_dir() and runner.restored_epoch == 0

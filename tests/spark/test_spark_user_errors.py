"""What a pipeline says about its checkpoint location when it opens it (issue 45): the default
location in one line, and whether a run resumes what an earlier run left there; a location
that cannot hold checkpoints is refused naming the setting. Real Spark (the session's conf is
where the pipeline reads its settings)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from statetier.backend import LocalRunner
from statetier.backend.snapshot.location import CheckpointLocationError
from statetier.backend.spark import StatefulPipeline

from tests.spark.spark_support import WordCount


def _pipeline(config: dict[str, str]) -> StatefulPipeline:
    return StatefulPipeline(
        WordCount, key="word", output_schema="word string, count bigint", parallelism=2,
        config=config,
    )  # fmt: skip


def _notices(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "checkpoint.uri is not set" in r.getMessage()]


def test_the_default_location_is_said_and_so_is_resuming_it(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.chdir(tmp_path)
    where = tmp_path / "statetier-checkpoints"
    with caplog.at_level(logging.WARNING, logger="statetier"):
        _pipeline({})._setup(spark)
    (first,) = _notices(caplog)
    assert f"state goes to {where} (starting empty)" in first
    assert "spark.statetier.checkpoint.uri" in first and len(first.splitlines()) == 1
    runner = LocalRunner(WordCount, 1, checkpoint_uri=f"file://{where}")  # an earlier run
    runner.run_epoch([("a", None)])
    runner.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="statetier"):
        _pipeline({})._setup(spark)
    (second,) = _notices(caplog)
    assert f"state goes to {where} (resuming epoch 1 an earlier run committed there)" in second
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="statetier"):
        _pipeline({"checkpoint.uri": f"file://{tmp_path}/chosen"})._setup(spark)
    assert _notices(caplog) == []  # a chosen location needs no word


def test_a_location_under_a_file_is_refused_naming_the_setting(
    spark: SparkSession, tmp_path: Path
) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointLocationError) as info:
        _pipeline({"checkpoint.uri": f"file://{tmp_path}/f/ckpt"})._setup(spark)
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert f"{tmp_path}/f is a file, not a directory" in message
    assert "spark.statetier.checkpoint.uri" in message

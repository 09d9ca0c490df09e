"""The key-type and output-width mistakes get messages that say what to do: unit cases, and a
real pipeline on an INT key column that fails when it is planned, before any task runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline
from statetier.backend.spark.checks import (
    OutputWidthError,
    check_key_columns,
    check_output_rows,
)

from tests.spark.spark_support import WideRows, WordCount

FIELDS = [("word", "string"), ("id", "int"), ("user", "bigint"), ("at", "timestamp")]


def test_key_types_statetier_hashes_like_spark_pass() -> None:
    check_key_columns(FIELDS, ["word"])
    check_key_columns(FIELDS, ["word", "user"])
    check_key_columns([("b", "binary")], ["b"])


def test_an_int_key_column_says_cast_to_bigint() -> None:
    with pytest.raises(ValueError, match=r"key column 'id' is int: cast it to BIGINT") as err:
        check_key_columns(FIELDS, ["word", "id"])
    assert "df.withColumn('id', df['id'].cast('bigint'))" in str(err.value)


def test_other_key_types_and_missing_columns_are_named() -> None:
    with pytest.raises(ValueError, match=r"key column 'at' is timestamp: keys must be string"):
        check_key_columns(FIELDS, ["at"])
    with pytest.raises(ValueError, match=r"key column 'wrod' is not in the input; its columns"):
        check_key_columns(FIELDS, ["wrod"])


def test_rows_of_the_wrong_width_name_the_row_and_the_schema() -> None:
    check_output_rows([("a", 1), {"word": "b", "count": 2}], ["word", "count"])
    with pytest.raises(OutputWidthError) as err:
        check_output_rows([("a", 1), ("b", 2, "extra")], ["word", "count"])
    assert str(err.value) == (
        "the function returned the row ('b', 2, 'extra') (3 values) for an output schema of 2 "
        "columns (word, count): return tuples of 2 values in that order, or dicts keyed by "
        "column name"
    )
    with pytest.raises(OutputWidthError, match=r"\(a int, not a tuple\)"):
        check_output_rows([7], ["word", "count"])


def test_a_pipeline_on_an_int_key_fails_at_plan_time(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id int, word string")
    pipeline = StatefulPipeline(
        WordCount,
        key="id",
        output_schema="id bigint, count bigint",
        parallelism=2,
        config={"checkpoint.uri": f"file://{tmp_path}/ckpt"},
    )
    with pytest.raises(ValueError, match="key column 'id' is int: cast it to BIGINT"):
        pipeline.transform(df, 1)
    assert not pipeline.hosts  # nothing ran


def test_a_function_returning_rows_of_the_wrong_width_fails_saying_so(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    pipeline = StatefulPipeline(
        WideRows,
        key="word",
        output_schema="word string, count bigint",
        parallelism=2,
        config={"checkpoint.uri": f"file://{tmp_path}/ckpt"},
    )
    pipelines.append(pipeline)
    df = spark.createDataFrame([("a",), ("b",)], "word string")
    with pytest.raises(Exception, match=r"\(3 values\) for an output schema of 2 columns"):
        pipeline.run(df)
    assert pipeline.store.epochs() == []

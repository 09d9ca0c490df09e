"""Typed state through the Spark pipeline (issue 41): a function keeps a dataclass in a
``TypedSerializer`` ValueState; the job restarts from its checkpoint with the dataclass changed.
An accepted change (a field added with a default, ``int`` widened to ``float``) reads every
old value in the new shape, exactly; a refused one fails the epoch at the driver with the one
line naming the state, the field and both types, and commits nothing. Real Spark (the session
fixture), a few keys, file://.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from statetier.backend.keyed_backend import StateRegistrationError
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.spark import StatefulPipeline

from tests.spark.typed_support import (
    Tally,
    TallyRefused,
    TallyWider,
    counting,
    first,
    refused,
    wider,
)


def run(
    spark: SparkSession,
    uri: str,
    function: type,
    schema: str,
    words: list[str],
    pipelines: list[StatefulPipeline],
) -> dict[str, tuple[Any, ...]]:
    """One epoch of ``function`` over ``words`` by a new pipeline (a restarted job); the last
    output row of each word."""
    pipe = StatefulPipeline(
        function, key="word", output_schema=schema, parallelism=2, config={"checkpoint.uri": uri}
    )
    pipelines.append(pipe)
    out: dict[str, tuple[Any, ...]] = {}

    def sink(batch: Any, epoch: int) -> None:
        for row in batch.collect():
            out[row[0]] = tuple(row[1:])

    # a new pipeline's ranges are none of the hosts' warm ones: they restore from the checkpoint
    pipe.run(spark.createDataFrame([(w,) for w in words], "word string"), sink)
    return out


def test_a_changed_dataclass_restores_in_its_new_shape_or_is_refused_in_one_line(
    spark: SparkSession, tmp_path: Path, pipelines: list[StatefulPipeline]
) -> None:
    uri = f"file://{tmp_path}/ckpt"
    rnd = random.Random(41)
    before = [f"w{rnd.randrange(40)}" for _ in range(300)]
    after = [f"w{rnd.randrange(60)}" for _ in range(300)]  # w40..w59 are new keys
    oracle = {w: before.count(w) for w in before}
    seen = run(spark, uri, counting(Tally, first), "word string, count bigint", before, pipelines)
    assert seen == {w: (n,) for w, n in oracle.items()}

    with pytest.raises(StateRegistrationError) as raised:
        run(spark, uri, counting(TallyRefused, refused), "word string, count string", after,
            pipelines)  # fmt: skip
    message = str(raised.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith("state 'tally' cannot be restored as its new value type")
    assert "field 'count' is stored as int and declared as str" in message
    assert raised.value.__suppress_context__  # Spark's stacks are not chained below it
    assert SnapshotStore(uri).epochs() == [1]  # the refused restart committed nothing

    schema = "word string, count double, origin string"
    seen = run(spark, uri, counting(TallyWider, wider), schema, after, pipelines)
    for word in after:
        if word in oracle:
            oracle[word] += 1
    expected = {
        w: (float(oracle[w]), "before") if w in oracle else (float(after.count(w)), "after")
        for w in set(after)
    }
    assert seen == expected
    assert all(isinstance(count, float) for count, _ in seen.values())
    assert pipelines[-1].reports[-1].restored == 2  # both ranges from the checkpoint
    assert SnapshotStore(uri).epochs() == [1, 2]

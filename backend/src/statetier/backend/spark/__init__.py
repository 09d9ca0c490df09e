"""statetier on Spark: keyed functions with tiered state over DataFrames and micro-batches.

A public module (docs/architecture.md, "Public API"): ``__all__`` is what a Spark job writes
against: the pipeline, the per-key-group function form and its combiner, the task a function is
serving. The functions and their context come from :mod:`statetier.backend`. See docs/spark.md.
The driver side (:class:`StatefulPipeline`) needs pyspark (the backend's ``spark`` extra); it is
imported lazily, so the executors' state hosts, which import this package for the function
classes, start without loading pyspark.
"""

from typing import TYPE_CHECKING, Any

from statetier.backend.spark.functions import (
    KEY_GROUP_COLUMN,
    Combiner,
    KeyGroupFunction,
    SparkTask,
    current_task,
)

if TYPE_CHECKING:
    from statetier.backend.spark.pipeline import EpochReport, StatefulPipeline

__all__ = [
    "KEY_GROUP_COLUMN",
    "Combiner",
    "EpochReport",
    "KeyGroupFunction",
    "SparkTask",
    "StatefulPipeline",
    "current_task",
]


def __getattr__(name: str) -> Any:
    if name in ("EpochReport", "StatefulPipeline"):
        from statetier.backend.spark import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)

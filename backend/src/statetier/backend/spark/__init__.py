"""statetier on Spark: keyed functions with tiered state over DataFrames and micro-batches.

A public module (docs/architecture.md, "Public API"): ``__all__`` is what a Spark job writes
against: the pipeline, the per-key-group function form and its combiner, the task a function is
serving, ``write_state`` (state bootstrapped from a DataFrame) and the registration of the
data sources that read state (docs/state-as-data.md). The functions and their context come
from :mod:`statetier.backend`. See docs/spark.md. The driver side (:class:`StatefulPipeline`,
``write_state``) needs pyspark (the backend's ``spark`` extra); it is
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
    from statetier.backend.spark.state_source import register_data_sources
    from statetier.backend.spark.state_writer import write_state

__all__ = [
    "KEY_GROUP_COLUMN",
    "Combiner",
    "EpochReport",
    "KeyGroupFunction",
    "SparkTask",
    "StatefulPipeline",
    "current_task",
    "register_data_sources",
    "write_state",
]


def __getattr__(name: str) -> Any:
    if name in ("EpochReport", "StatefulPipeline"):
        from statetier.backend.spark import pipeline

        return getattr(pipeline, name)
    if name == "register_data_sources":
        from statetier.backend.spark import state_source

        return state_source.register_data_sources
    if name == "write_state":
        from statetier.backend.spark import state_writer

        return state_writer.write_state
    raise AttributeError(name)

"""statetier on Spark: keyed functions with tiered state over DataFrames and micro-batches.

See docs/spark.md. Importing this package needs pyspark (the backend's ``spark`` extra).
"""

from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.spark.functions import KeyGroupFunction, SparkTask, current_task
from statetier.backend.spark.pipeline import EpochReport, StatefulPipeline

__all__ = [
    "EpochReport",
    "KeyGroupFunction",
    "KeyedProcessFunction",
    "RuntimeContext",
    "SparkTask",
    "StatefulPipeline",
    "current_task",
]

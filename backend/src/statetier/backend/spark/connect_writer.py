"""The streaming writer ``StatefulPipeline.write_stream`` returns on a Spark Connect session.

Connect pickles a ``foreachBatch`` function when it is given and runs it in a Python process on
the Connect server (beside the driver), which has no handle on the query. The function needs the
query's checkpoint location there, to read each micro-batch's time from the offset log (see
offset_log); the location is known only when the query starts. So this writer gives
``foreachBatch`` its function at ``start``/``toTable``, made for the location the query was
configured with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

__all__ = ["MISSING_LOCATION", "connect_stream_writer"]

BatchFunction = Callable[[DataFrame, int], None]

MISSING_LOCATION = (
    "statetier on Spark Connect: set the query's checkpoint location "
    "(.option('checkpointLocation', ...)); each micro-batch's time is read from its offset log"
)


def connect_stream_writer(df: DataFrame, function_for: Callable[[str], BatchFunction]) -> Any:
    """A ``DataStreamWriter`` of the Connect DataFrame ``df`` whose ``foreachBatch`` function is
    ``function_for(checkpoint location)``, set when the query starts."""
    from pyspark.sql.connect.streaming.readwriter import DataStreamWriter

    class StatetierStreamWriter(DataStreamWriter):
        def _start_internal(self, *args: Any, **options: Any) -> Any:
            location = options.get("checkpointLocation") or self._write_proto.options.get(
                "checkpointLocation"
            )
            if not location:
                raise ValueError(MISSING_LOCATION)
            self.foreachBatch(function_for(str(location)))
            return super()._start_internal(*args, **options)

    return StatetierStreamWriter(df._plan, df.sparkSession)  # type: ignore[arg-type]

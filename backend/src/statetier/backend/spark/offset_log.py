"""A micro-batch's time read from its query's offset log file (Spark Connect).

On a classic session the driver reads the running query's offset log through py4j (see
epoch_time). The Python process in which a Connect server runs ``foreachBatch`` has no py4j and
no handle on the query; it reads the same entry from the file Spark wrote before it ran the
batch, ``<checkpointLocation>/offsets/<batch id>``: a version line, then the batch's metadata
(``batchWatermarkMs``, ``batchTimestampMs``), then the sources' offsets. A restarted query runs
a batch again with the entry it logged, so the time is the same on every run, as on classic.
"""

from __future__ import annotations

import json

import fsspec
from statetier.backend.spark.messages import EpochTime

__all__ = ["OffsetLogError", "offset_log_time"]


class OffsetLogError(RuntimeError):
    """The offset log has no readable entry for a micro-batch."""


def offset_log_time(checkpoint_location: str, batch_id: int, watermarked: bool) -> EpochTime:
    """The time of micro-batch ``batch_id`` of the query checkpointed at
    ``checkpoint_location``; its watermark only when the query has one (``watermarked``) and
    it has moved (Spark's is 0 until a batch with event times ran)."""
    path = f"{checkpoint_location.rstrip('/')}/offsets/{batch_id}"
    try:
        fs, local = fsspec.core.url_to_fs(path)
        with fs.open(local, "r") as f:
            lines = f.read().splitlines()
        metadata = json.loads(lines[1])
        watermark = int(metadata.get("batchWatermarkMs", 0))
        timestamp = int(metadata["batchTimestampMs"])
    except (OSError, IndexError, KeyError, TypeError, ValueError) as e:
        raise OffsetLogError(
            f"micro-batch {batch_id}: no readable offset log entry at {path} ({e!r}): the "
            "query's checkpointLocation must be readable from the Spark driver's machine"
        ) from e
    return EpochTime(
        watermark=watermark if watermarked and watermark > 0 else None,
        processing_time=timestamp,
    )

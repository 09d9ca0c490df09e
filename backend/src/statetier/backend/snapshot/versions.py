"""What the checkpoint format calls its versions and file kinds, and the error of a file that
fails its checks: all that a manifest needs of the format (see format), without its codecs and
columnar blocks, so that the processes that only pass manifests' entries on (a Spark task
forwarding the driver's chain updates) do not load them."""

from __future__ import annotations

__all__ = [
    "BASE",
    "COLUMNS_FORMAT_VERSION",
    "COMPRESSED_FORMAT_VERSION",
    "DELTA",
    "FORMAT_VERSION",
    "READABLE_VERSION",
    "CorruptFileError",
]

FORMAT_VERSION = 2  # of manifests, compaction requests and data files with plain blocks
COMPRESSED_FORMAT_VERSION = 3  # data files of msgpack blocks whose header names a codec
COLUMNS_FORMAT_VERSION = 4  # data files of columnar blocks, compressed or not
READABLE_VERSION = COLUMNS_FORMAT_VERSION  # the newest data file this reader reads
BASE = "base"
DELTA = "delta"


class CorruptFileError(ValueError):
    """A data file or manifest fails a format or checksum check."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

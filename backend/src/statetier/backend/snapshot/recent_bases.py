"""The bases a merge process wrote last, kept to start the next merges of their ranges from.

A range's next compaction merges the base its last one wrote with the deltas since. Reading that
base back from an object store is a GET of the chain's largest file: for a 3 MB base on
SeaweedFS, 12 ms of the client's CPU and 9 ms of the server's, on the same cores as the stream.
A process that merges many times (the Spark driver's merge process) keeps what it wrote, up to a
bound in bytes, oldest forgotten first. A kept base is used only for its exact URL, and the
merge checks it against the request's size and checksum as it checks every input. Names of
compacted bases are never reused for other bytes (see layout).
"""

from __future__ import annotations

import collections
import threading

__all__ = ["RECENT_BASES_BYTES", "RecentBases"]

RECENT_BASES_BYTES = 64 << 20  # the merge process's bound: about a 500 MB state's bases


class RecentBases:
    """URL -> bytes of the last bases written here, at most ``limit`` bytes in all."""

    def __init__(self, limit: int = RECENT_BASES_BYTES) -> None:
        self.limit = limit
        self.hits = 0
        self._kept: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # a merge reads its inputs on several threads

    def keep(self, url: str, data: bytes) -> None:
        """Remember ``data`` as the bytes at ``url`` (one larger than the bound is not kept)."""
        if len(data) > self.limit:
            return
        with self._lock:
            old = self._kept.pop(url, None)
            self._bytes += len(data) - (len(old) if old is not None else 0)
            self._kept[url] = data
            while self._bytes > self.limit:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= len(dropped)

    def get(self, url: str) -> bytes | None:
        """The bytes kept for ``url``, or None."""
        with self._lock:
            data = self._kept.get(url)
            if data is not None:
                self._kept.move_to_end(url)
                self.hits += 1
            return data

"""The launcher of :mod:`statetier.compaction.launch`, under the name the tests import.

The benchmarks (runtime code) import :mod:`~statetier.compaction.launch` itself.
"""

from __future__ import annotations

from statetier.compaction.launch import BUCKET, KEY, SECRET, Processes, SeaweedFS, free_port

__all__ = ["BUCKET", "KEY", "SECRET", "Processes", "SeaweedFS", "free_port"]

"""The JVMs the tests start: the JIT's first tier and the serial collector.

``make test`` is bound by the CPU of two cores, and much of it is JVMs that live a minute or less
(Spark drivers, executors, Connect servers; dozens per run) and spend a large part of it
compiling their own code with the JIT's optimizing tier. The tests' JVMs stop at the first tier
and use the serial collector (``JAVA_TOOL_OPTIONS``, which every JVM reads, the ones Spark starts
too): measured on a five-epoch batch job on ``local[2]``, 27-33 CPU seconds against 39-46,
nothing else changed. Benchmarks (``make bench``) keep the JVM's defaults; a
``JAVA_TOOL_OPTIONS`` of one's own is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

"""The JVMs the tests start: the JIT's first tier, the serial collector and an archive of
Spark's classes.

``make test`` is bound by the CPU of two cores, and much of it is JVMs that live a minute or less
(Spark drivers, executors, Connect servers; dozens per run) and spend a large part of it
compiling their own code with the JIT's optimizing tier. The tests' JVMs stop at the first tier
and use the serial collector (``JAVA_TOOL_OPTIONS``, which every JVM reads, the ones Spark starts
too): measured on a five-epoch batch job on ``local[2]``, 27-33 CPU seconds against 39-46,
nothing else changed. They also map the classes of Spark's jars from an archive made once
(tests/jvm_archive.py) instead of loading them one by one. Benchmarks (``make bench``) keep the
JVM's defaults; a ``JAVA_TOOL_OPTIONS`` of one's own is kept.

This runs in pytest's own process before it starts its workers, which inherit the options (and
so find them set, and make nothing).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyspark

from tests.jvm_archive import archive_options

JIT_AND_GC = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]

if "JAVA_TOOL_OPTIONS" not in os.environ:
    archive = archive_options(JIT_AND_GC, Path(pyspark.__file__).parent, Path(sys.prefix))
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join([*JIT_AND_GC, *archive])

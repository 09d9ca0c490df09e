"""A class-data archive of Spark's classes for the tests' JVMs (the JDK's dynamic AppCDS).

A Spark JVM that lives a minute or less spends seconds loading and verifying the same few
thousand classes from Spark's jars. A dynamic archive (``-XX:ArchiveClassesAtExit``, JDK 13+)
holds them parsed and verified: a JVM started with ``-XX:SharedArchiveFile`` maps it instead.
Measured on this project's 2-core machine (2026-11-30): a ``local[2]`` session running one
aggregation, 12.0 s -> 6.6 s wall; the same on ``local-cluster[2,1,1024]``, 17.9 s -> 10.0 s.

The archive is made once per Java and Spark installation (its name carries a digest of
``java -version`` and of the jars' names, sizes and times), in the virtual environment beside
them, by a small Spark job run with the tests' JVM options. The JDK uses it only in a JVM whose
class path starts with the one it was made with (Spark's drivers and executors); any other JVM
(Spark's launcher, a Connect server with extra jars) runs as before. Its notice of that is
switched off (``-Xlog:cds=off``): the JDK prints it on standard output, which Spark's launcher
hands to the shell as the command to run. Whatever fails here, the tests run without it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

QUIET = ["-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
DUMP_TIMEOUT_S = 300

# What the archive learns its classes from: a session, a shuffle, Arrow batches through a
# Python function, and a short streaming query with foreachBatch, as most tests run them.
DUMP_JOB = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
df = spark.range(2000, numPartitions=2).selectExpr("id % 7 as k", "id as v")
df.groupBy("k").count().collect()
df.mapInArrow(lambda batches: batches, df.schema).collect()
df.write.parquet(sys.argv[1] + "/in")
stream = spark.readStream.schema(df.schema).parquet(sys.argv[1] + "/in")
query = (stream.writeStream.trigger(availableNow=True)
         .option("checkpointLocation", sys.argv[1] + "/ckpt")
         .foreachBatch(lambda batch, _: batch.count()).start())
query.awaitTermination()
spark.stop()
"""


def _digest(spark_home: Path) -> str | None:
    """What the archive depends on: the Java runtime and Spark's jars. None: no Java."""
    try:
        java = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=60, check=True
        ).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    digest = hashlib.sha256(java.encode())
    for jar in sorted((spark_home / "jars").glob("*.jar")):
        stat = jar.stat()
        digest.update(f"{jar.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _dump(archive: Path, options: list[str], spark_home: Path) -> bool:
    """Run the dump job with ``options``; the archive appears at ``archive`` only if it ran."""
    with tempfile.TemporaryDirectory(prefix="statetier-jvm-archive-") as work:
        partial = Path(work) / "spark.jsa"
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home),
            "PYSPARK_PYTHON": sys.executable,
            "JAVA_TOOL_OPTIONS": " ".join([*options, f"-XX:ArchiveClassesAtExit={partial}"]),
        }
        try:
            done = subprocess.run(
                [sys.executable, "-c", DUMP_JOB, work],
                capture_output=True, text=True, timeout=DUMP_TIMEOUT_S, env=env, check=False,
            )  # fmt: skip
            failed = "" if done.returncode == 0 and partial.is_file() else done.stderr[-300:]
        except subprocess.TimeoutExpired:
            failed = f"the job took over {DUMP_TIMEOUT_S} s"
        if failed:
            print(f"tests: no JVM class archive ({failed!r})", file=sys.stderr)
            return False
        aside = archive.with_name(f".{archive.name}.{os.getpid()}")  # one per maker
        shutil.move(partial, aside)
        os.replace(aside, archive)  # whole or absent, never half
    return True


def archive_options(options: list[str], spark_home: Path, directory: Path) -> list[str]:
    """The JVM options that use the archive of Spark's classes under ``directory`` (made now if
    missing, with ``options``, the tests' other JVM options); [] when it cannot be made."""
    digest = _digest(spark_home)
    if digest is None or not (spark_home / "jars").is_dir():
        return []
    archive = directory / f"statetier-test-spark-{digest}.jsa"
    if not archive.is_file():
        for stale in directory.glob("statetier-test-spark-*.jsa"):
            stale.unlink()  # an archive of an earlier Java or Spark: ours, and useless now
        print("tests: making the JVM class archive of Spark's jars (once)", file=sys.stderr)
        if not _dump(archive, options, spark_home):
            return []
    return [f"-XX:SharedArchiveFile={archive}", *QUIET]

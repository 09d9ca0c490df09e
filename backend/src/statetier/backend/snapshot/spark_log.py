"""The part of a Spark streaming query's checkpoint that a savepoint carries.

A query's progress lives in two places: statetier's epoch (the state) and Spark's checkpoint
location (which input each micro-batch read, and which micro-batches finished). Epoch ``N`` is
the state after micro-batch ``N - 1`` (``StatefulPipeline``: epoch = batch id + 1), so a query
resumes exactly after a savepoint of epoch ``N`` when its Spark checkpoint says micro-batch
``N - 1`` is the last one done. Spark restarts from its offset log's latest batch and the one
before it, and from its commit log; a file source also keeps the files each batch read in its
own log (``sources/``). So a savepoint holds, under ``spark/``:

- ``offsets/<b>`` and ``commits/<b>`` for ``b`` = the batch and the one before it;
- every ``sources/`` entry of a batch up to the batch (a file source's log, ``<b>`` or
  ``<b>.compact``; others such as a Kafka source's initial offsets, batch 0).

Not the ``metadata`` file, which holds only the query id: the restored query is a new query, so
the restore writes a ``metadata`` with a new id (Spark refuses logs without one, and two running
queries with one id). Not Spark's own state stores (``state/``), which a statetier pipeline does
not use.
Hadoop's ``.crc`` side files are left out; Spark reads its logs without them.

Locations are fsspec URLs or absolute paths; ``s3a://`` (Spark's name for S3) is read as
``s3://`` with the same storage options as the savepoint.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import fsspec
from statetier.backend.snapshot.manifest import FileEntry
from statetier.backend.snapshot.retry import storage_options_for
from statetier.backend.snapshot.store import SnapshotStore, put_whole, read_whole

__all__ = ["SPARK_DIR", "SparkLogError", "restore_spark_log", "save_spark_log", "spark_location"]

SPARK_DIR = "spark"
COMMIT_WAIT_S = 30.0  # how long a commit entry may lag behind statetier's commit
_BATCH_NAME = re.compile(r"(\d+)(?:\.compact)?$")


class SparkLogError(ValueError):
    """A Spark checkpoint location lacks what a savepoint needs, or cannot take a restore."""


def spark_location(uri: str, options: dict[str, Any]) -> tuple[Any, str]:
    """The filesystem and root path of a Spark checkpoint location."""
    if uri.startswith("s3a://"):
        uri = "s3://" + uri.removeprefix("s3a://")
    fs, root = fsspec.core.url_to_fs(uri, **storage_options_for(uri, options))
    return fs, str(root).rstrip("/")


def save_spark_log(
    spark_uri: str, dest: SnapshotStore, batch: int, options: dict[str, Any]
) -> list[FileEntry]:
    """Copy micro-batch ``batch``'s log entries from ``spark_uri`` to ``spark/`` under
    ``dest``; their entries (names relative to ``dest``, sizes, checksums)."""
    fs, root = spark_location(spark_uri, options)
    names = _batch_names(fs, root, spark_uri, batch)
    return [dest.write(f"{SPARK_DIR}/{name}", read_whole(fs, f"{root}/{name}")) for name in names]


def _batch_names(fs: Any, root: str, uri: str, batch: int) -> list[str]:
    """The log entries of ``batch`` (names relative to the Spark checkpoint)."""
    if not fs.exists(f"{root}/offsets/{batch}"):
        raise SparkLogError(
            f"{uri} has no offset log entry for micro-batch {batch}: is it the query's "
            "checkpointLocation, and did the query reach that micro-batch?"
        )
    _wait_for(fs, f"{root}/commits/{batch}", uri, batch)
    names = [f"offsets/{batch}", f"commits/{batch}"]
    if batch > 0:
        for log in ("offsets", "commits"):
            if fs.exists(f"{root}/{log}/{batch - 1}"):
                names.append(f"{log}/{batch - 1}")
    return names + _source_names(fs, root, batch)


def _wait_for(fs: Any, path: str, uri: str, batch: int) -> None:
    """Spark writes a batch's commit entry just after the batch's sink returned, and statetier
    commits inside the sink: a savepoint taken at once may come before it."""
    deadline = time.monotonic() + COMMIT_WAIT_S
    while not fs.exists(path):
        if time.monotonic() > deadline:
            raise SparkLogError(
                f"{uri} has no commit log entry for micro-batch {batch} after "
                f"{COMMIT_WAIT_S:.0f} s: the batch did not finish in Spark; take an epoch "
                "whose micro-batch finished"
            )
        time.sleep(0.2)
        fs.invalidate_cache(path.rsplit("/", 1)[0])


def _source_names(fs: Any, root: str, batch: int) -> list[str]:
    """The sources' log entries of batches up to ``batch`` (a later one would tell a file
    source that files the restored query has not read were read)."""
    try:
        found = fs.find(f"{root}/sources")
    except FileNotFoundError:
        return []
    names = []
    for path in found:
        name = str(path)[len(root) + 1 :]
        base = name.rsplit("/", 1)[-1]
        match = _BATCH_NAME.fullmatch(base)
        if match and not base.startswith(".") and int(match.group(1)) <= batch:
            names.append(name)
    return sorted(names)


def restore_spark_log(
    savepoint: SnapshotStore, entries: list[FileEntry], spark_uri: str, options: dict[str, Any]
) -> int:
    """Write the savepoint's Spark log entries into the new query's empty checkpoint location
    ``spark_uri``, each checked against its recorded checksum first; how many."""
    fs, root = spark_location(spark_uri, options)
    for log in ("offsets", "commits"):
        if fs.exists(f"{root}/{log}") and fs.ls(f"{root}/{log}"):
            raise SparkLogError(
                f"{spark_uri} already holds a Spark checkpoint ({log}/ is not empty): give the "
                "restored query a new, empty checkpoint location"
            )
    datas = savepoint.read_many(entries)  # all checked before anything is written
    for entry, data in zip(entries, datas, strict=True):
        put_whole(fs, f"{root}/{entry.path.removeprefix(SPARK_DIR + '/')}", data)
    put_whole(fs, f"{root}/metadata", json.dumps({"id": str(uuid.uuid4())}).encode() + b"\n")
    return len(entries)

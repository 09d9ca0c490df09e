"""Compaction off the executors, on real Spark (``local[2]``), SeaweedFS and the compaction
service: the state hosts write only deltas, the driver has the gateway's workers merge them, and
the hosts name the compacted bases in their next snapshots. Also with the gateway killed
mid-stream (the job falls back to compacting in the driver) and with a worker killed while it
holds a job (another worker completes it)."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from statetier.backend.compaction_client import RemoteCompactor
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.snapshot.chain_compaction import CUT_FACTOR
from statetier.backend.spark import StatefulPipeline
from statetier.tools.bench.spark_functions import ArrowWordCount
from statetier.tools.bench.spark_wordcount import checkpoint_counts
from statetier.tools.compaction_launch import BUCKET, Processes, SeaweedFS

from tests.spark.spark_support import expected_counts, zipf_words

FAST = ("--lease-ttl", "1.5", "--heartbeat-interval", "0.3")
TRIGGER = 3  # compaction.delta-trigger
BATCHES = 16


def remote_compactor(pipeline: StatefulPipeline) -> RemoteCompactor:
    """The pipeline's compactor, which ``compaction.endpoints`` makes the service's client."""
    compactor = pipeline.upkeep.compactor
    assert isinstance(compactor, RemoteCompactor), compactor
    return compactor


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def procs(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Processes]:
    with Processes(tmp_path, env=seaweed.env) as processes:
        yield processes


@dataclasses.dataclass
class Cluster:
    """What a test of this module runs on: Spark, SeaweedFS, compaction service processes."""

    spark: SparkSession
    seaweed: SeaweedFS
    procs: Processes
    tmp_path: Path
    pipelines: list[StatefulPipeline]
    prefix: str = f"s3://{BUCKET}/"

    def service(self, workers: int) -> tuple[str, subprocess.Popen[str]]:
        """A gateway (its URL and process) with ``workers`` workers."""
        gateway, process = self.procs.gateway([self.prefix], *FAST)
        for _ in range(workers):
            self.worker(gateway)
        return gateway, process

    def worker(self, gateway: str, *extra: str) -> subprocess.Popen[str]:
        return self.procs.worker(gateway, [self.prefix], *extra)

    def stream(self, gateway: str, **config: Any) -> Stream:
        return Stream(self.spark, self.seaweed, self.tmp_path, gateway, self.pipelines, **config)


@pytest.fixture
def cluster(
    spark: SparkSession,
    seaweed: SeaweedFS,
    procs: Processes,
    tmp_path: Path,
    pipelines: list[StatefulPipeline],
) -> Cluster:
    return Cluster(spark, seaweed, procs, tmp_path, pipelines)


def write_batches(directory: Path) -> list[list[str]]:
    directory.mkdir()
    batches = [zipf_words(3000, 2000, seed=i) for i in range(BATCHES)]
    for i, words in enumerate(batches):
        pq.write_table(pa.table({"word": words}), directory / f"part-{i:04d}.parquet")
    return batches


class Stream:
    """A streaming word count over ``BATCHES`` files, one per micro-batch, compacted through
    ``gateway``; ``watch(epochs_done)`` runs every 0.2 s while it runs."""

    def __init__(
        self,
        spark: SparkSession,
        seaweed: SeaweedFS,
        tmp_path: Path,
        gateway: str,
        pipelines: list[StatefulPipeline],
        **config: Any,
    ) -> None:
        self.uri = f"s3://{BUCKET}/ckpt-{uuid.uuid4().hex[:10]}"
        self.spark, self.tmp_path = spark, tmp_path
        self.batches = write_batches(tmp_path / "input")
        self.pipeline = StatefulPipeline(
            ArrowWordCount,
            key="word",
            output_schema="word string, count bigint",
            parallelism=2,
            config={
                "checkpoint.uri": self.uri,
                "checkpoint.retained": 3,
                "compaction.endpoints": gateway,
                "compaction.delta-trigger": TRIGGER,
                "compaction.size-ratio": 100.0,
                "compaction.poll-interval": "100ms",
                **config,
            },
            storage_options=seaweed.options,
        )
        pipelines.append(self.pipeline)
        self.store = SnapshotStore(self.uri, **seaweed.options)
        self.longest_chain = 0
        self.compacted_bases: set[str] = set()

    def run(self, watch: Callable[[int], None] = lambda _: None) -> None:
        words = self.spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
        query = (
            self.pipeline.write_stream(words.parquet(str(self.tmp_path / "input")))
            .option("checkpointLocation", str(self.tmp_path / "spark-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        seen = 0
        while not query.awaitTermination(0.2):  # type: ignore[arg-type]  # seconds; stub: int
            if len(self.pipeline.reports) > seen:
                seen = len(self.pipeline.reports)
                self._look()
            watch(seen)
        assert query.exception() is None, query.exception()
        self.pipeline.drain()
        self._look()

    def _look(self) -> None:
        """Chain lengths and compacted bases of the latest committed manifest."""
        manifest = self.store.manifest()
        for chain in manifest.chains():
            self.longest_chain = max(self.longest_chain, len(chain.deltas))
            if "/compacted/" in chain.base.path:
                self.compacted_bases.add(chain.base.path)
            else:  # a base a state host wrote: only the first epoch's
                assert chain.base.epoch == 1, chain.base

    def counts(self, parallelism: int) -> dict[str, int]:
        """The checkpoint's counts, restored at ``parallelism``."""
        return checkpoint_counts(self.store, parallelism)


def metric(gateway: str, name: str, **labels: str) -> float:
    """A gateway metric's value (0 when the series is absent)."""
    with urllib.request.urlopen(f"{gateway}/metrics", timeout=5) as response:
        text = response.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0


@pytest.mark.slow
def test_the_service_compacts_the_jobs_chains_and_the_state_restores_at_another_parallelism(
    cluster: Cluster,
) -> None:
    gateway, _ = cluster.service(workers=2)
    stream = cluster.stream(gateway)
    stream.run()

    remote = remote_compactor(stream.pipeline)
    expected = expected_counts(stream.batches)
    assert stream.counts(2) == expected
    assert stream.counts(3) == expected  # a restore at another parallelism, from merged bases
    assert len(stream.compacted_bases) >= 4, stream.compacted_bases  # 2 ranges, 16 epochs
    assert remote.remote_jobs >= len(stream.compacted_bases) and remote.fallbacks == 0
    tenant_jobs = metric(
        gateway, "statetier_compaction_tenant_jobs_total", tenant=stream.uri, outcome="succeeded"
    )
    assert tenant_jobs == remote.remote_jobs
    # a chain grows while its compaction runs and until the next epoch's host names the base
    assert stream.longest_chain <= 2 * TRIGGER, stream.longest_chain


@pytest.mark.slow
def test_a_gateway_killed_mid_stream_falls_back_to_the_driver_and_nothing_is_lost(
    cluster: Cluster,
) -> None:
    gateway, gateway_process = cluster.service(workers=2)
    stream = cluster.stream(gateway, **{"compaction.timeout": "5s"})
    killed_at: list[int] = []

    def kill_gateway(epochs: int) -> None:
        remote = remote_compactor(stream.pipeline)
        if not killed_at and remote.remote_jobs >= 2:
            gateway_process.send_signal(signal.SIGKILL)
            gateway_process.wait()
            killed_at.append(epochs)

    stream.run(kill_gateway)
    remote = remote_compactor(stream.pipeline)
    assert killed_at and killed_at[0] < BATCHES - 4, killed_at
    assert remote.fallbacks >= 1  # compacted in the driver after the kill
    assert stream.counts(2) == expected_counts(stream.batches)
    # after the kill, the failure is found and a merge process starts in the driver (at a
    # lower priority: on a busy machine it can take a few epochs); backpressure bounds the chain
    assert stream.longest_chain <= CUT_FACTOR * TRIGGER, stream.longest_chain


@pytest.mark.slow
def test_a_worker_killed_while_holding_a_job_leaves_it_to_another(
    cluster: Cluster,
) -> None:
    gateway, _ = cluster.service(workers=0)
    # the first worker reads slowly, so it is still on its job when it is killed
    victim = cluster.worker(gateway, "--max-read-rate", "20000")
    stream = cluster.stream(gateway)
    killed: list[int] = []

    def kill_a_busy_worker(epochs: int) -> None:
        if not killed and metric(gateway, "statetier_compaction_jobs_running") >= 1:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed.append(epochs)
            cluster.worker(gateway)  # the Deployment's replacement

    stream.run(kill_a_busy_worker)
    remote = remote_compactor(stream.pipeline)
    assert killed, "no job was running on the slow worker"
    assert metric(gateway, "statetier_compaction_leases_lost_total") >= 1
    assert remote.fallbacks == 0  # the job completed on the service
    assert remote.remote_jobs >= 2
    assert stream.counts(2) == expected_counts(stream.batches)
    # the stream goes on while the job waits for its lease to expire, until a chain of
    # CUT_FACTOR x the trigger makes the driver wait for the compaction (backpressure)
    assert stream.longest_chain <= CUT_FACTOR * TRIGGER, stream.longest_chain
    # and once the job is done, the service compacts them again
    last = stream.store.manifest()
    assert max(len(c.deltas) for c in last.chains()) <= 2 * TRIGGER, last.chains()

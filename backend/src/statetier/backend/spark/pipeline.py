"""The driver side: a keyed function over Spark DataFrames, one committed epoch per run or batch.

``StatefulPipeline.run(df)`` processes a batch DataFrame as the next epoch;
``StatefulPipeline.foreach_batch(sink)`` is a ``writeStream.foreachBatch`` function whose epoch is
the micro-batch id + 1. Each epoch:

1. adds the key-group column (``pmod(xxhash64(keys), P)``, the backend's own hash); a function
   with a :class:`~statetier.backend.spark.functions.Combiner` is pre-aggregated per key on the
   way (see combining);
2. routes the rows to the state hosts that own their key-group ranges (``pipeline.exchange``):
   from the one task of a one-partition micro-batch (``direct``), from every task, each host
   gathering a range's pieces (``gathered``, see gathering), or after Spark's exchange, where
   ``repartitionById`` puts range i (``kg * p div P``) in partition i. Each task streams its
   rows to the owner's state host, which keeps the range warm between epochs and restores it
   from tier 2 only when it is not at the committed base (see host);
3. hands the output DataFrame to the sink (which runs the job);
4. after the sink returned, waits for every range's result (the hosts write their snapshots
   after the tasks returned, overlapping Spark's next tasks, and send the results over their
   registry links; see result_wait) and commits the epoch's manifest;
   an epoch that is already committed (a re-run after a driver restart) adopts the committed
   manifest instead of writing another. A range whose host failed to snapshot (an error file)
   or wrote nothing within ``host.result-timeout`` fails the epoch uncommitted.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.readwriter import DataStreamWriter
from pyspark.sql.types import StructType
from pyspark.sql.utils import is_remote
from statetier.backend import metrics as backend_metrics
from statetier.backend.config import SETTINGS, StatetierConfig, load_config, warn_if_spill_off
from statetier.backend.descriptors import StateDescriptor
from statetier.backend.keyed_backend import EVENT_TIMER_STATE, PROCESSING_TIMER_STATE
from statetier.backend.keygroups import (
    check_parallelism,
    compute_default_max_parallelism,
    spark_key_group_expr,
)
from statetier.backend.snapshot import (
    SnapshotStore,
    WriterLease,
    commit_snapshot,
)
from statetier.backend.snapshot.bootstrap import plan_epoch
from statetier.backend.snapshot.epoch_offset import EpochOffsets, pruned_offsets
from statetier.backend.snapshot.layout import results_dir
from statetier.backend.snapshot.location import default_location_notice, open_location
from statetier.backend.snapshot.process_compactor import stop_merge_process
from statetier.backend.snapshot.restore_from import seed_from_savepoint
from statetier.backend.snapshot.writer import epoch_clock
from statetier.backend.spark.arrow_batches import capped_by_rows_only
from statetier.backend.spark.channel import new_secret
from statetier.backend.spark.checks import check_key_columns
from statetier.backend.spark.combining import (
    aggregate_ranges,
    combine_map_side,
    combined_schema,
    combining,
)
from statetier.backend.spark.connect_writer import connect_stream_writer
from statetier.backend.spark.driver_secret import shared_secret
from statetier.backend.spark.epoch_time import has_watermark, micro_batch_time
from statetier.backend.spark.functions import KEY_GROUP_COLUMN as KG_COLUMN
from statetier.backend.spark.functions import Combiner
from statetier.backend.spark.host_roster import share_hosts
from statetier.backend.spark.messages import EpochSpec, EpochTime, PipelineSpec, StateSpec
from statetier.backend.spark.offset_log import offset_log_time
from statetier.backend.spark.plans import (
    estimated_bytes,
    key_grouped,
    opaque_empty,
    partition_count,
    runs_no_task,
    with_schema,
)
from statetier.backend.spark.protocol import epoch_property, process_alive
from statetier.backend.spark.refusals import refusal_at_driver
from statetier.backend.spark.registry import HostInfo, HostRegistry, registry_for
from statetier.backend.spark.result_wait import RangesLostError, ResultWait
from statetier.backend.spark.results import RangeStart
from statetier.backend.spark.session_kind import (
    client_address,
    executor_count,
    hosts_of,
    is_connect,
    master,
    on_connect_driver,
    session_conf,
)
from statetier.backend.spark.shipping import check_function_ships
from statetier.backend.spark.slots import hosts_per_executor
from statetier.backend.spark.state_writer import apply_initial_state, state_columns
from statetier.backend.spark.stopped_queries import stopped_queries
from statetier.backend.spark.task import (
    direct_function,
    gather_function,
    partition_function,
)
from statetier.backend.spark.upkeep import EpochUpkeep
from statetier.backend.spark.wakeups import WakeUps, emits_from_timers, wake_at, with_wake_ups
from statetier.backend.spark.writers import claim_location
from statetier.backend.ttl import Clock, SystemClock

__all__ = ["EpochReport", "RangesLostError", "StatefulPipeline"]

log = logging.getLogger("statetier.spark.pipeline")

Sink = Callable[[DataFrame, int], None]

REPORTS_KEPT = 1000  # epochs whose EpochReport a pipeline keeps (its reports_kept)
MAX_RERUNS = 2  # runs of an epoch's job again after state hosts were lost mid-epoch
# (Connect) the most bytes a micro-batch routed "direct" may have by the optimizer's estimate:
# Spark's default spark.sql.files.maxPartitionBytes, what a file source reads in one partition
DIRECT_BYTES = 128 * 1024 * 1024


@dataclasses.dataclass
class EpochReport:
    """How one epoch went (the driver's view)."""

    epoch: int
    adopted: bool  # already committed before: the committed manifest was kept
    records: int  # input records of the epoch
    # from the call of the micro-batch's function (or of run_epoch) to the commit. Spark's
    # work on a micro-batch before that call is not in it: its offsets, its planning and, for
    # a write_stream query with AQE, stages it runs before it hands the micro-batch over (a
    # query's progress, durationMs.triggerExecution, has the whole micro-batch)
    seconds: float
    ranges: int
    warm: int
    restored: int
    fresh: int
    spilled_key_groups: int
    upload_bytes: int
    host_seconds: float = 0.0  # time the state hosts spent on the ranges (summed)
    snapshot_seconds: float = 0.0  # of which writing the ranges' snapshots
    rows: int = 0  # rows the state hosts received (fewer than records with a combiner)
    process_seconds: float = 0.0  # of host_seconds: running the function
    restored_bytes: int = 0  # downloaded from tier 2 to restore ranges that were not warm
    reruns: int = 0  # times the epoch's job ran again because a state host was lost
    # how the records reached their ranges: "exchange" (Spark's, one task per range),
    # "direct" (one task cut the micro-batch into every range; pipeline.exchange) or
    # "gathered" (every task sent its piece of every range to the range's host; see gathering)
    routing: str = "exchange"
    spilled_by_range: list[int] = dataclasses.field(default_factory=list)  # key groups on disk
    # CPU the state hosts spent on the ranges' snapshots (their threads, not the I/O loop's)
    snapshot_cpu_seconds: float = 0.0
    # of which the snapshots that wrote a base in place of a compaction (compaction.mode=
    # executor's trigger, or a cut chain): the compaction CPU spent in the executors
    compaction_cpu_seconds: float = 0.0
    compaction_bases: int = 0  # ranges whose snapshot wrote such a base
    # results the hosts sent over their registry connections (the others were read from the
    # checkpoint store, see spark.result_wait: a host that could not reach the driver)
    results_told: int = 0
    # of seconds: from the epoch's job's end to its commit (the ranges' last snapshots and the
    # manifest): the part of an epoch no task overlaps
    commit_seconds: float = 0.0
    # the earliest timers of the epoch's ranges after it (None: none): when a streaming query
    # needs a micro-batch without input (see wakeups)
    next_event_timer: int | None = None
    next_processing_timer: int | None = None
    # ranges rebalancing moved to other hosts before the epoch (hosts joined, see rebalancing),
    # and ranges whose state came from their old host rather than tier 2 (see handoff)
    moved: list[int] = dataclasses.field(default_factory=list)
    handed_off: int = 0
    restored_bytes_by_range: list[int] = dataclasses.field(default_factory=list)
    hosts_by_range: list[str] = dataclasses.field(default_factory=list)  # owner host ids


class StatefulPipeline:
    """A keyed function with statetier state, applied to DataFrames epoch by epoch.

    ``function`` is a class (or zero-argument factory) of a
    :class:`~statetier.backend.functions.KeyedProcessFunction` or a
    :class:`~statetier.backend.spark.functions.KeyGroupFunction`; define it in an importable
    module, not ``__main__``, when it holds module-level state. ``key`` names the key columns
    (integers as bigint). ``output_schema`` is a ``StructType`` or DDL string. Settings come
    from the configuration schema: ``config`` (code) > Spark conf ``spark.statetier.*`` >
    ``STATETIER_*``; the checkpoint location is ``checkpoint.uri``. ``initial_state`` maps
    descriptors to DataFrames of their state (the key columns, then the columns of
    ``write_state``), written as the location's first epoch when it has none, as Spark's
    ``initialState``; a location with epochs ignores it (logged).

    ``reports`` holds the :class:`EpochReport` of the latest ``reports_kept`` epochs (1,000),
    so that a query that runs for months does not fill the driver with them.
    """

    def __init__(
        self,
        function: Callable[[], Any],
        *,
        key: str | Sequence[str],
        output_schema: StructType | str,
        parallelism: int,
        config: Mapping[str, Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        name: str | None = None,
        clock: Clock | None = None,
        initial_state: Mapping[StateDescriptor, DataFrame] | None = None,
    ) -> None:
        self.function_bytes = bytes(cloudpickle.dumps(function))  # type: ignore[no-untyped-call]
        combiner = getattr(function, "combiner", None)
        self.combiner: Combiner | None = combiner if isinstance(combiner, Combiner) else None
        self.emits_from_timers = emits_from_timers(function)  # (its queries need wake-ups)
        self.key_columns = [key] if isinstance(key, str) else list(key)
        self.output_schema = output_schema
        self.parallelism = parallelism
        self.overrides = dict(config or {})
        self.storage_options = dict(storage_options or {})
        self.name = name or uuid.uuid4().hex[:12]
        # processing time of batch runs; given, also of micro-batches (tests: a ManualClock)
        self.clock = clock
        self._wake_ups: WakeUps | None = None  # what write_stream's query asks Spark for
        # the state of each descriptor at the query's first epoch (see state_writer)
        self.initial_state = dict(initial_state or {})
        for descriptor, df in self.initial_state.items():  # a missing column fails here
            state_columns(df, descriptor, self.key_columns, where="initial_state")
        self._start_runtime()

    def _start_runtime(self) -> None:
        """What a pipeline learns and holds as it runs (none of it is declared)."""
        self.config: StatetierConfig | None = None
        self._store: SnapshotStore | None = None
        self._hosts = 1  # state hosts per executor, decided in _setup (see slots)
        # the application's master URL and whose hosts this coordinator uses, read in _setup:
        # fixed for the application's life, and a conf read is a gRPC round trip on Connect
        self._master = ""
        self._hosts_of = ""
        self._executors: int | None = None  # (Connect) from the master or conf, read once
        self._lease: WriterLease | None = None
        self._restored_from = 0  # the savepoint epoch this driver's location started from
        self._tokens: dict[str, str] = {}  # range index -> token of its committed files
        self._tokens_epoch = -1
        # what this driver knows of the location, so that a micro-batch costs no listing:
        self._latest: int | None = None  # latest committed epoch (None: list to find out)
        self._max_parallelism: int | None = None  # fixed by the first committed epoch
        self._committed_before: dict[int, bool] = {}  # planned epoch -> already committed?
        self._routing: dict[int, str] = {}  # planned epoch -> "exchange", "direct", "gathered"
        self._moved: dict[int, list[int]] = {}  # planned epoch -> ranges rebalanced before it
        self._schemas: tuple[StructType, str] | None = None
        # the latest epochs' reports (a long query's would grow without end: 24 KB an epoch at
        # parallelism 200, 2 GB a day at a micro-batch a second); totals over every epoch
        self.reports: list[EpochReport] = []
        self.reports_kept = REPORTS_KEPT
        self._warm_total = self._restored_total = 0
        self._upkeep: EpochUpkeep | None = None  # compaction and retention after commits
        self.hosts: dict[str, int] = {}  # host id -> pid of the state hosts that served us
        self._registry: HostRegistry | None = None
        # the epochs bootstraps wrote, which no micro-batch ran (snapshot.epoch_offset's marker)
        self._offsets = EpochOffsets()
        self._watermarked_query: bool | None = None  # (Connect) the query has a watermark
        # the executors load the function (asked once; on Connect the client that starts a
        # query asks, and its foreachBatch process, whose executors are the same, does not)
        self._function_ships = False

    def __getstate__(self) -> dict[str, Any]:
        """A pipeline pickled into another process carries its declaration only: Spark Connect
        runs a streaming query's ``foreachBatch`` function in a Python process on the driver's
        machine, which opens the checkpoint, takes the lease and runs its own host registry
        (the coordinator runs where the executors reach it; see docs/spark.md)."""
        if self.initial_state:
            raise ValueError(
                "initial_state cannot travel to the Spark Connect server's foreachBatch process "
                "(its DataFrames belong to the client): write it with write_state(df, "
                "checkpoint.uri, descriptor, key=...) before the query starts"
            )
        return {name: self.__dict__[name] for name in _DECLARED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        shipped = bool(state.pop("_function_ships", False))
        self.__dict__.update(state)
        self.initial_state = {}
        self._start_runtime()
        self._function_ships = shipped

    # ------------------------------------------------------------------ setup

    def _setup(self, spark: SparkSession) -> SnapshotStore:
        if self._store is None:
            conf = session_conf(spark)
            self.config = load_config(self.overrides, spark_conf=conf)
            self._master, self._hosts_of = master(spark), hosts_of(spark)
            # state hosts per executor (host.per-executor; 0: one per task slot, see slots):
            # the Spark conf is fixed for the application's life, so decided once
            self._hosts = hosts_per_executor(
                self.config.host_per_executor,
                self._master,
                conf,
                self.parallelism,
            )
            warn_if_spill_off(self.config, log)
            if not self._function_ships:  # (a Connect client that started the query asked)
                check_function_ships(spark, self.function_bytes)
                self._function_ships = True
            self._store = SnapshotStore(self.config.checkpoint_uri, **self.storage_options)
            opened = open_location(self._store)
            if self.config.source("checkpoint.uri") == "default":
                log.warning(default_location_notice(self._store, opened))
            backend_metrics.serve_metrics(self.config.metrics_port)
        return self._store

    @property
    def store(self) -> SnapshotStore:
        if self._store is None:
            raise RuntimeError("the pipeline has not run yet")
        return self._store

    def _host_config(self) -> dict[str, str]:
        """The settings given in code or Spark conf; executors add their own environment."""
        assert self.config is not None
        by_name = {s.name: s for s in SETTINGS}
        out: dict[str, str] = {}
        for name in self.config:
            if self.config.source(name) in ("code", "spark"):
                value = self.config[name]
                out[by_name[name].name] = (
                    ",".join(value)
                    if isinstance(value, tuple)
                    else str(value).lower()
                    if isinstance(value, bool)
                    else str(value)
                )
        return out

    # ------------------------------------------------------------------ epochs

    def run(
        self,
        df: DataFrame,
        sink: Sink | None = None,
        *,
        watermark: int | None = None,
        end_of_input: bool = False,
    ) -> EpochReport:
        """Process a batch DataFrame as the next epoch and commit it.

        Timers fire at ``watermark`` (ms; None: event time does not move) and the pipeline
        clock's processing time; ``end_of_input`` then fires every event-time timer.
        """
        store = self._setup(df.sparkSession)
        # the lease (and a start from checkpoint.restore-from) before listing the epochs
        self._take_lease(df.sparkSession, store)
        epochs = store.epochs()
        time_ = EpochTime(watermark, self._now_ms(), end_of_input)
        return self.run_epoch(df, (epochs[-1] if epochs else 0) + 1, sink, time=time_)

    def _now_ms(self) -> int:
        return (self.clock or SystemClock()).now_ms()

    def _batch_time(
        self, batch: DataFrame, batch_id: int, location: str | None = None
    ) -> EpochTime:
        """A micro-batch's time: the query's (its offset log), the clock's if one was given."""
        if is_connect(batch.sparkSession):
            assert location is not None
            spark_time = offset_log_time(location, batch_id, self._watermarked(batch))
        else:
            spark_time = micro_batch_time(batch, batch_id)
        if self.clock is None:
            return spark_time
        return dataclasses.replace(spark_time, processing_time=self.clock.now_ms())

    def foreach_batch(
        self, sink: Sink | None = None, *, checkpoint_location: str | None = None
    ) -> Callable[[DataFrame, int], None]:
        """A ``writeStream.foreachBatch`` function: micro-batch ``b`` is epoch ``b + 1``.

        On Spark Connect, pass the query's ``checkpoint_location`` too (the same as its
        ``checkpointLocation`` option): the function runs on the Connect server and reads each
        micro-batch's time from the query's offset log there."""
        if checkpoint_location is None and is_remote():
            raise ValueError(
                "statetier on Spark Connect: call foreach_batch(sink, checkpoint_location=...) "
                "with the query's checkpointLocation, or use pipeline.write_stream(df, sink)"
            )
        return self._batch_function(sink, checkpoint_location, None)

    def _batch_function(
        self, sink: Sink | None, location: str | None, watermarked: bool | None
    ) -> Callable[[DataFrame, int], None]:
        """Micro-batch ``b`` as epoch ``b + 1``, its time read from the offset log at
        ``location`` on Spark Connect; ``watermarked`` not None: then ask for the wake-ups its
        timers need (a query of :meth:`write_stream`)."""

        # (Connect) the schema of the query's micro-batches, analyzed on its first only
        known: list[StructType] = []

        def on_batch(batch: DataFrame, batch_id: int) -> None:
            started = _perf_counter()
            time_ = self._batch_time(batch, batch_id, location)
            epoch = self._micro_batch_epoch(batch.sparkSession, batch_id)
            out = self._transform(batch, epoch, time_, known[0] if known else None)
            if not known and is_connect(batch.sparkSession):
                known.append(batch.schema)  # (cached by the analysis above)
            report = self._run_and_commit(out, epoch, sink, started)
            if watermarked is not None:
                self._ask_wake_up(report, watermarked)

        return on_batch

    def write_stream(self, df: DataFrame, sink: Sink | None = None) -> DataStreamWriter:
        """A streaming query of the function over the streaming DataFrame ``df``: micro-batch
        ``b`` is epoch ``b + 1``, run through ``sink`` (default: ``noop``), then committed.

        Configure and start it like any ``DataStreamWriter`` (checkpoint location, trigger).
        Unlike ``df.writeStream.foreachBatch(foreach_batch(sink))``, the query is planned once:
        each micro-batch's epoch reaches the tasks as a job property instead of a new plan,
        which saves Spark's planning of three DataFrame steps per micro-batch. With
        ``pipeline.exchange`` ``auto`` or ``never``, or with a combiner, only the key groups are
        planned once; the last step (the exchange or not, the combiner's aggregation) is planned
        per micro-batch.
        """
        if is_connect(df.sparkSession):
            return cast(DataStreamWriter, self._connect_write_stream(df, sink))
        static = self._static_spec(df.sparkSession)
        watermarked = has_watermark(df)
        keyed = self._keyed(self._with_wake_ups(df), static)
        # A combiner's Spark SQL aggregation is planned per micro-batch too: in the streaming
        # plan itself it would be a streaming aggregation, which append mode refuses.
        per_batch = self._plans_per_batch() or self.combiner is not None
        planned = None if per_batch else self._route(keyed, static, None, "exchange")
        key = epoch_property(self.name)

        def on_batch(batch: DataFrame, batch_id: int) -> None:
            started = time.perf_counter()
            epoch = self._micro_batch_epoch(batch.sparkSession, batch_id)
            spec = self._begin_epoch(batch.sparkSession, epoch, self._batch_time(batch, batch_id))
            if self._max_parallelism != static.state.max_parallelism:
                raise ValueError(
                    f"the checkpoint at {self.store.uri} now has max parallelism "
                    f"{self._max_parallelism}, the query was planned for "
                    f"{static.state.max_parallelism}: restart the query"
                )
            if planned is None:  # the records of this micro-batch, routed as it needs
                routing = self._routing_of(batch, epoch, batch)
                out = self._route(batch, static, None, routing)
            else:
                out = batch
            context = batch.sparkSession.sparkContext
            context.setLocalProperty(key, json.dumps(spec.encode()))
            try:
                report = self._run_and_commit(out, epoch, sink, started)
            finally:
                context.setLocalProperty(key, None)  # type: ignore[arg-type]
            self._ask_wake_up(report, watermarked)

        return (keyed if planned is None else planned).writeStream.foreachBatch(on_batch)

    def _micro_batch_epoch(self, spark: SparkSession, batch_id: int) -> int:
        """Micro-batch ``b`` is epoch ``b + 1``, less the epochs bootstraps wrote (their marker:
        the first epoch, a repaired state written back between a stop and a restart)."""
        self._take_lease(spark, self._setup(spark))
        return self._offsets.epoch_of(batch_id)

    def _connect_write_stream(self, df: DataFrame, sink: Sink | None) -> Any:
        """:meth:`write_stream` on Spark Connect: the query's ``foreachBatch`` runs on the
        Connect server, each micro-batch planned with its epoch in its tasks' closure (Connect
        has no job properties), and the key groups added per micro-batch (as with
        ``pipeline.exchange`` ``auto``)."""
        store = self._setup(df.sparkSession)  # the client reads the location, commits nothing
        self._location(store, None)
        watermarked = has_watermark(df)
        self._watermarked_query = watermarked
        stream = self._with_wake_ups(df)
        return connect_stream_writer(
            stream, lambda location: self._batch_function(sink, location, watermarked)
        )

    def _watermarked(self, batch: DataFrame) -> bool:
        """Whether the query of a Connect micro-batch has a watermark (asked once)."""
        if self._watermarked_query is None:
            self._watermarked_query = has_watermark(batch)
        return self._watermarked_query

    def _with_wake_ups(self, df: DataFrame) -> DataFrame:
        """``df`` with the wake-up source of a new query, when the function can emit from its
        timers (see wakeups); else ``df``."""
        if not self.emits_from_timers:
            return df
        return with_wake_ups(df, self._wake_ups_of_new_query())

    def _wake_ups_of_new_query(self) -> WakeUps:
        """The wake-up request of a query about to start (see wakeups): a micro-batch at once
        when the checkpoint has timers, whose restored ranges may have some due already."""
        if self._wake_ups is None:
            self._wake_ups = WakeUps()
        latest = self._latest
        states = self.store.manifest(latest).states if latest else {}
        timers = EVENT_TIMER_STATE in states or PROCESSING_TIMER_STATE in states
        self._wake_ups.ask(_wall_ms() if timers else None)
        return self._wake_ups

    def _ask_wake_up(self, report: EpochReport, watermarked: bool) -> None:
        """After a micro-batch's commit: ask for the next one when its timers will be due
        (a query without the wake-up source asks nothing)."""
        if self._wake_ups is None:
            return
        wake = wake_at(
            records=report.records,
            has_watermark=watermarked,
            next_event_timer=report.next_event_timer,
            next_processing_timer=report.next_processing_timer,
            processing_time=self._now_ms(),
            now_ms=_wall_ms(),
        )
        self._wake_ups.ask(wake)

    def transform(self, df: DataFrame, epoch: int, time: EpochTime | None = None) -> DataFrame:
        """The output DataFrame of ``epoch`` (lazy); :meth:`commit` it after it ran. Its
        timers fire at ``time`` (default: no watermark, the clock's processing time)."""
        return self._transform(df, epoch, time, None)

    def _transform(
        self, df: DataFrame, epoch: int, time: EpochTime | None, known: StructType | None
    ) -> DataFrame:
        """:meth:`transform`; ``known``: ``df`` is a later micro-batch of a Connect query whose
        first had this schema, where each look at a plan is a gRPC round trip: its key columns
        were checked, its schema is not asked again, and it is a ``LogicalRDD`` (what a
        ``foreachBatch`` function gets), which the optimizer cannot prove empty."""
        epoch_spec = self._begin_epoch(df.sparkSession, epoch, time)
        spec = self._static_spec(df.sparkSession)
        keyed = self._keyed(df, spec, known)
        routing = self._routing_of(keyed, epoch, df)
        out = self._route(keyed, spec, epoch_spec, routing)
        if known is None and runs_no_task(out):
            # Spark proved the input empty and dropped the whole plan: no range would get a
            # task, snapshot or fire its timers. The same nothing, as partitions Spark cannot
            # see through, gives every range its (empty) task.
            self._routing[epoch] = "exchange"
            keyed = self._keyed(opaque_empty(df, self.parallelism), spec)
            out = self._route(keyed, spec, epoch_spec, "exchange")
        return out

    def _begin_epoch(self, spark: SparkSession, epoch: int, time: EpochTime | None) -> EpochSpec:
        """Check that ``epoch`` can run here; what its tasks need to know of it (read once:
        every attempt of its tasks gets the same time, and fires the same timers)."""
        store = self._setup(spark)
        lease = self._take_lease(spark, store)
        assert self.config is not None
        timeout = float(self.config.host_stopped_query_timeout)
        stopped_queries().epoch_begins(spark, self.name, self._release_ranges, timeout)
        self._check_after_savepoint(epoch)
        latest = self._location(store, epoch)[0]
        if epoch > latest + 1:
            raise ValueError(
                f"epoch {epoch} cannot run: the latest committed epoch at {store.uri} is {latest}"
            )
        self._committed_before[epoch] = epoch <= latest
        self._count_executors(spark)
        self._moved[epoch] = self._rebalance(spark)
        base = epoch - 1
        return EpochSpec(
            epoch=epoch,
            base_epoch=base,
            base_tokens=dict(self._tokens) if self._tokens_epoch == base else {},
            owner=lease.owner,
            time=time or EpochTime(None, self._now_ms()),
            chain_updates=self.upkeep.updates(),
        )

    def _rebalance(self, spark: SparkSession) -> list[int]:
        """Move ranges to hosts that joined, a few per epoch (``host.rebalance-moves``, see
        rebalancing): between epochs, so no task of this pipeline runs; the ranges moved."""
        assert self.config is not None
        limit = self.config.host_rebalance_moves
        moves = self.registry(spark).rebalance(self.name, self.parallelism, limit)
        return [move.index for move in moves]

    def _count_executors(self, spark: SparkSession) -> None:
        """Tell the registry how many executors there are, so that new ranges spread over all
        of them (one py4j call per epoch; on Connect, which cannot ask the scheduler, what the
        master or conf says, read once)."""
        if self._executors is None or not is_connect(spark):
            self._executors = executor_count(spark, self._master)
        self.registry(spark).executors = self._executors

    def _take_lease(self, spark: SparkSession, store: SnapshotStore) -> WriterLease:
        """The writer lease, taken by the first epoch (not when a query is planned: taking it
        fences the writer that had it, which may be another live query; see writers)."""
        if self._lease is None:
            claim_location(spark, store.uri, self.name)
            self._lease = store.acquire_writer()
            assert self.config is not None
            if self.config.checkpoint_restore_from:
                seeded = seed_from_savepoint(
                    store, self.config.checkpoint_restore_from, self._lease, **self.storage_options
                )
                self._restored_from = seeded.epoch if seeded is not None else 0
            self._apply_initial_state(store, self._lease)
            self._offsets = pruned_offsets(store)  # under the lease: see epoch_offset
            self._latest = None  # list the epochs again, now that nobody else commits
        return self._lease

    def _apply_initial_state(self, store: SnapshotStore, lease: WriterLease) -> None:
        """Write ``initial_state`` as the first epoch of a location without one; Spark too
        applies ``initialState`` to a query's first batch only (and ignores it later)."""
        if not self.initial_state:
            return
        epochs = store.epochs()
        if epochs:
            log.info(
                "%s has committed epochs (latest %d): initial_state is ignored",
                store.uri,
                epochs[-1],
            )
            return
        plan = plan_epoch(store, self._location(store, None)[1])
        apply_initial_state(
            self.initial_state, self.key_columns, plan, self.parallelism, self.storage_options,
            lease,
        )  # fmt: skip

    def _check_after_savepoint(self, epoch: int) -> None:
        """An epoch at or before the savepoint this driver started from is a query that did
        not restore its Spark checkpoint too: it would replay input the state holds."""
        if epoch <= self._restored_from:
            assert self.config is not None
            raise ValueError(
                f"epoch {epoch} (micro-batch {epoch - 1}) cannot follow the savepoint of epoch "
                f"{self._restored_from} this pipeline started from: restore the query's Spark "
                "checkpoint from the savepoint too (statetier checkpoint restore-spark "
                f"{self.config.checkpoint_restore_from} "
                "NEW_SPARK_CHECKPOINT) and start the query there"
            )

    def _static_spec(self, spark: SparkSession) -> PipelineSpec:
        """What every task of this pipeline needs, whatever the epoch."""
        store = self._setup(spark)
        assert self.config is not None
        max_parallelism = self._location(store, None)[1]
        check_parallelism(max_parallelism, self.parallelism)
        registry = self.registry(spark)
        registry.hosts_per_executor = self._hosts
        return PipelineSpec(
            app_id=self._hosts_of,
            idle_timeout=float(self.config.host_idle_timeout),
            registry=registry.endpoint,
            secret=registry.secret,
            host_bind=self._host_bind(spark),
            host_port=self.config.host_port,
            state=StateSpec(
                pipeline=self.name,
                parallelism=self.parallelism,
                max_parallelism=max_parallelism,
                checkpoint_uri=store.uri,
                key_columns=tuple(self.key_columns),
                schema=self._output_schemas()[1],
                storage_options=self.storage_options,
                config=self._host_config(),
            ),
            hosts=self._hosts,
        )

    def registry(self, spark: SparkSession) -> HostRegistry:
        """The application's host registry (started on first use, shared by its pipelines)."""
        assert self.config is not None
        if self._registry is None or self._registry.closed:
            self._registry = registry_for(
                self._hosts_of,
                _registry_bind(spark, self._master),
                self.config.host_registry_port,
                float(self.config.host_liveness_timeout),
                _secret_maker(self._hosts_of),
            )
            if on_connect_driver():  # the queries of this driver share hosts: invite them
                share_hosts(self._registry, self._hosts_of)
        return self._registry

    def _host_bind(self, spark: SparkSession) -> str:
        assert self.config is not None
        configured: str = self.config.host_bind_address
        if not configured and self._master.startswith("local"):
            return "127.0.0.1"
        return configured

    def _keyed(
        self, df: DataFrame, spec: PipelineSpec, known: StructType | None = None
    ) -> DataFrame:
        """``df`` with its key-group column (and pre-aggregated by a map-side combiner);
        ``known``: ``df``'s schema, whose key columns were checked (see :meth:`_transform`)."""
        if known is None:
            fields = [(f.name, f.dataType.simpleString()) for f in df.schema.fields]
            check_key_columns(fields, self.key_columns)  # a bad key type fails here, named
        expr = spark_key_group_expr(self.key_columns, spec.state.max_parallelism)
        keyed = df.withColumn(KG_COLUMN, sf.expr(expr))
        combiner = self.combiner
        if combiner is not None and combiner.map_side:
            return combine_map_side(keyed, combiner, self.key_columns)
        if known is not None:  # mapInArrow needs the columns: no analyze call for them
            keyed = with_schema(keyed, key_grouped(known))
        return keyed

    def _route(
        self,
        keyed: DataFrame,
        spec: PipelineSpec,
        epoch: EpochSpec | None,
        routing: str,
    ) -> DataFrame:
        """The tasks that stream ``keyed``'s ranges to their hosts (of ``epoch``; None: of
        whichever epoch the job says, see :meth:`write_stream`): after Spark's exchange into
        ranges; ``direct``, from one task that cuts its partition into every range; or
        ``gathered``, from every partition's task (see gathering), each of which tells the
        driver which ranges' outputs it returned (see deliveries)."""
        schema = self._output_schemas()[0]
        combiner = self.combiner
        if routing == "gathered":
            pieces = partition_count(keyed)
            run = gather_function(spec, epoch, self.function_bytes, pieces)
            return keyed.mapInArrow(run, schema)
        if routing == "direct":
            assert self.config is not None
            auto = self.config.pipeline_exchange == "auto" and not is_connect(keyed.sparkSession)
            one = keyed if auto else keyed.coalesce(1)  # (auto, classic: one partition)
            in_task = None
            if combiner is not None and not combiner.map_side:  # else the rows come combined
                in_task = combining(combined_schema(keyed, combiner, self.key_columns), combiner)
            run = direct_function(spec, epoch, self.function_bytes, in_task)
            return one.mapInArrow(run, schema)
        p, mp = self.parallelism, spec.state.max_parallelism
        owner_col = sf.expr(f"CAST((`{KG_COLUMN}` * {p}) div {mp} AS INT)")
        if combiner is not None and not combiner.map_side:
            ranged = aggregate_ranges(
                keyed, owner_col, combiner, self.key_columns, self.parallelism
            )
        else:
            ranged = keyed.repartitionById(p, owner_col)  # (keeps a schema it was told)
        return ranged.mapInArrow(partition_function(spec, epoch, self.function_bytes), schema)

    def _every_executor_hosts(self) -> bool:
        registry = self._registry
        if registry is None:
            return False
        return len(registry.live_hosts()) >= max(1, registry.expected_hosts())

    def _plans_per_batch(self) -> bool:
        """Whether :meth:`write_stream` plans each micro-batch's route (else the query is planned
        once, whole, with the exchange): ``auto`` and ``never`` do, ``always`` does not.

        Routing a micro-batch costs it a plan on top of the one Spark made for it: on
        ``local-cluster[2,1,3072]`` (20M words, every micro-batch through the exchange) the
        query planned once ran in 21.7 s against 23.3 s, medians of 4 alternated runs. A
        micro-batch that skips the exchange (``direct`` or ``gathered``) saves far more
        (docs/spark.md), so ``auto`` pays it to find out.
        """
        assert self.config is not None
        return bool(self.config.pipeline_exchange != "always")

    def _routing_of(self, keyed: DataFrame, epoch: int, records: DataFrame) -> str:
        """How ``epoch``'s records reach their ranges (``pipeline.exchange``), remembered for
        the epoch's report: ``always``, through Spark's exchange. ``auto`` and ``never`` skip
        it: a micro-batch of one partition goes from its one task to every range (``direct``),
        one of several partitions from all of them (``gathered``, see gathering), unless the
        function's combiner aggregates after the exchange (its rows must be final: ``never``
        then reads the micro-batch with one task, which aggregates it). ``auto`` waits for
        every executor to have its state host (the exchange's tasks, which run on every
        executor, start them; new ranges go to the hosts that exist). ``records``: the
        micro-batch as the query gave it, which Spark Connect's estimate reads."""
        assert self.config is not None
        mode = self.config.pipeline_exchange
        routing = "exchange"
        if is_connect(keyed.sparkSession):
            routing = self._connect_routing(records, mode)
        elif mode == "never" or (mode == "auto" and self._every_executor_hosts()):
            partitions = partition_count(keyed)
            if partitions > 1 and (self.combiner is None or self.combiner.map_side):
                routing = "gathered"
            elif partitions == 1 or (mode == "never" and partitions > 0):
                routing = "direct"  # (none: a wake-up's micro-batch, every range needs a task)
        self._routing[epoch] = routing
        return routing

    def _connect_routing(self, records: DataFrame, mode: str) -> str:
        """:meth:`_routing_of` on Spark Connect, which cannot count a plan's partitions without
        planning it: ``auto`` sends a micro-batch the optimizer estimates at one file
        partition's bytes at most (> 0: an empty one, every range needs a task) from one task
        (``direct``, coalesced: as classic's one-partition micro-batch, without an exchange);
        a bigger one, or one without an estimate, goes through the exchange.

        ``records`` is the micro-batch as the query gave it, without the key-group column: the
        server estimates that plan in 10-20 ms where the keyed one took 40-60 ms (medians of
        one query's micro-batches, 2026-12-01), and its estimate is the source's own (a file
        source's: its files' bytes), which the keyed one scaled by the column it adds."""
        if mode == "never":
            return "direct"
        if mode == "always" or not self._every_executor_hosts():
            return "exchange"
        size = estimated_bytes(records)
        return "direct" if size is not None and 0 < size <= DIRECT_BYTES else "exchange"

    def _output_schemas(self) -> tuple[StructType, str]:
        """The output schema, and its Arrow form for the hosts (parsed once: a DDL string
        costs a round trip to the JVM)."""
        if self._schemas is None:
            schema = self.output_schema
            if not isinstance(schema, StructType):
                parsed = StructType.fromDDL(schema)
                assert isinstance(parsed, StructType)
                schema = parsed
            self._schemas = schema, to_arrow_schema(schema).serialize().to_pybytes().hex()
        return self._schemas

    def _location(self, store: SnapshotStore, epoch: int | None) -> tuple[int, int]:
        """The latest committed epoch and the max parallelism, for planning ``epoch``.

        The location is listed only when this driver does not know it: the first time, and for
        any epoch but the one after its own last commit (a re-run). Under the writer lease
        nobody else commits; one who took the lease fences this driver's commit. ``epoch``
        None: the max parallelism of whatever is known or listed.
        """
        assert self.config is not None
        if self._latest is None or (epoch is not None and epoch != self._latest + 1):
            epochs = store.epochs()
            self._latest = epochs[-1] if epochs else 0
            if self._latest:
                self._max_parallelism = store.manifest(self._latest).max_parallelism
            if epoch is not None and 1 < epoch <= self._latest + 1 and epoch - 1 not in epochs:
                raise ValueError(f"epoch {epoch} needs epoch {epoch - 1}, which is not retained")
        if self._max_parallelism is None:
            self._max_parallelism = self.config.state_max_parallelism or (
                compute_default_max_parallelism(self.parallelism)
            )
        return self._latest, self._max_parallelism

    def run_epoch(
        self,
        df: DataFrame,
        epoch: int,
        sink: Sink | None = None,
        *,
        time: EpochTime | None = None,
    ) -> EpochReport:
        """Process ``df`` as ``epoch`` at ``time``: run the sink on the output, then commit."""
        started = _perf_counter()
        return self._run_and_commit(self.transform(df, epoch, time), epoch, sink, started)

    def _run_and_commit(
        self, out: DataFrame, epoch: int, sink: Sink | None, started: float
    ) -> EpochReport:
        """Run the epoch's job, then commit it; run it again if a state host died after its
        task returned but before its range's snapshot (the snapshot of that attempt is lost)."""
        for rerun in range(MAX_RERUNS + 1):
            try:
                self._run_job(out, epoch, sink)
                report = self.commit(epoch, started)
            except RangesLostError as e:
                if rerun == MAX_RERUNS:
                    raise
                log.warning("epoch %s runs again: %s", epoch, e)
                continue
            except Exception as e:
                refused = refusal_at_driver(e)  # the one line, not Spark's stacks around it
                if refused is not None:
                    raise refused from None
                raise
            report.reruns = rerun
            return report
        raise AssertionError("unreachable")

    def _run_job(self, out: DataFrame, epoch: int, sink: Sink | None) -> None:
        """Run the sink on ``out``. RangesLostError when a range of a gathered epoch cannot
        reach the sink (see deliveries): its pieces were lost with a state host, or its outputs
        with the executor of the task that got them. The sink's job then failed (cancelled at
        the first task that found a range lost) before it could commit the micro-batch without
        them, and the epoch must run again; so must one whose sink read only some partitions
        (``take``), which succeeds without them."""
        registry = self._registry
        if self._routing.get(epoch) != "gathered" or registry is None:
            self._run_sink(out, epoch, sink)
            return
        deliveries = registry.deliveries
        context = out.sparkSession.sparkContext
        tag = f"statetier-{self.name}-epoch-{epoch}"  # the jobs the sink runs in this thread
        deliveries.begin(self.name, epoch, lambda: context.cancelJobsWithTag(tag))
        context.addJobTag(tag)
        try:
            self._run_sink(out, epoch, sink)
        except Exception as e:
            refused = deliveries.refused(self.name, epoch)
            if refused:
                raise RangesLostError(
                    f"the outputs of ranges {list(refused)} of epoch {epoch} were lost with a "
                    "state host or executor: the sink's job failed without them"
                ) from e
            raise
        finally:
            context.removeJobTag(tag)
        lost = sorted(set(range(self.parallelism)) - deliveries.delivered(self.name, epoch))
        if lost:
            raise RangesLostError(
                f"no task returned the outputs of ranges {lost} of epoch {epoch}: the hosts "
                "gathered them from every task, and a task or host that held them was lost"
            )

    @staticmethod
    def _run_sink(out: DataFrame, epoch: int, sink: Sink | None) -> None:
        with capped_by_rows_only(out.sparkSession):
            if sink is not None:
                sink(out, epoch)
            else:
                out.write.format("noop").mode("overwrite").save()

    def commit(self, epoch: int, started: float | None = None) -> EpochReport:
        """Commit ``epoch`` from its ranges' results (after the job that ran it succeeded)."""
        store = self.store
        assert self._lease is not None
        commit_started = time.perf_counter()
        assert self.config is not None
        waiting = ResultWait(
            store,
            self._registry,
            self.name,
            self.parallelism,
            self._lease.owner,
            self.config.host_result_timeout,
        )
        told = [waiting.result(epoch, index) for index in range(self.parallelism)]
        results = [result for result, _ in told]
        if self._registry is not None:  # what earlier attempts of the epoch's tasks sent
            self._registry.discard_written(store.url(results_dir(epoch, self._lease.owner)) + "/")
        for r in results:
            self.hosts[r.host_id] = r.host_pid
        committed_before = self._committed_before.pop(epoch, None)
        routing = self._routing.pop(epoch, "exchange")
        if routing == "gathered" and self._registry is not None:
            self._registry.deliveries.forget(self.name, epoch)
        adopted = epoch in store.epochs() if committed_before is None else committed_before
        if adopted:
            self._tokens, self._tokens_epoch = {}, -1  # the committed files are not ours
        else:
            snapshots = [r.snapshot for r in results]
            try:
                manifest = commit_snapshot(store, epoch, snapshots, self._lease)
            except Exception:
                backend_metrics.checkpoint_failed()
                raise
            self._tokens = {str(r.index): r.token for r in results}
            self._tokens_epoch = epoch
            self._latest = max(self._latest or 0, epoch)
            self.upkeep.committed(manifest, self._lease.owner, epoch_clock(snapshots))
        report = EpochReport(
            epoch=epoch,
            adopted=adopted,
            records=sum(r.records for r in results),
            seconds=time.perf_counter() - started if started is not None else 0.0,
            ranges=len(results),
            warm=sum(r.state is RangeStart.WARM for r in results),
            restored=sum(r.state is RangeStart.RESTORED for r in results),
            fresh=sum(r.state is RangeStart.FRESH for r in results),
            spilled_key_groups=sum(r.spilled_key_groups for r in results),
            upload_bytes=sum(r.upload_bytes for r in results),
            host_seconds=sum(r.total_s for r in results),
            snapshot_seconds=sum(r.snapshot_s for r in results),
            rows=sum(r.rows for r in results),
            process_seconds=sum(r.process_s for r in results),
            restored_bytes=sum(r.restored_bytes for r in results),
            spilled_by_range=[r.spilled_key_groups for r in results],
            snapshot_cpu_seconds=sum(r.snapshot_cpu_s for r in results),
            compaction_cpu_seconds=sum(r.snapshot_cpu_s for r in results if r.compaction_base),
            compaction_bases=sum(r.compaction_base for r in results),
            routing=routing,
            results_told=sum(was_told for _, was_told in told),
            commit_seconds=time.perf_counter() - commit_started,
            next_event_timer=_earliest(r.next_event_timer for r in results),
            next_processing_timer=_earliest(r.next_processing_timer for r in results),
            moved=self._moved.pop(epoch, []),
            handed_off=sum(r.state is RangeStart.HANDED_OFF for r in results),
            restored_bytes_by_range=[r.restored_bytes for r in results],
            hosts_by_range=[r.host_id for r in results],
        )
        self._keep(report)
        # the driver's view of the epoch, for the state-tier dashboard (metrics.port)
        if not adopted:
            backend_metrics.checkpoint_committed(report.seconds, report.upload_bytes)
        backend_metrics.warm_hit(report.warm)
        backend_metrics.cold_restore(report.restored)
        return report

    @property
    def upkeep(self) -> EpochUpkeep:
        """Compaction and retention after this pipeline's commits (see spark.upkeep)."""
        if self._upkeep is None:
            assert self.config is not None
            self._upkeep = EpochUpkeep(self.store, self.config)
        return self._upkeep

    def drain(self) -> None:
        """Wait for background compaction and retention (tests and tools that list files)."""
        if self._upkeep is not None:
            self._upkeep.drain()

    # ------------------------------------------------------------------ hosts

    def _keep(self, report: EpochReport) -> None:
        """Add ``report`` to :attr:`reports`, which keeps the latest :attr:`reports_kept`."""
        self.reports.append(report)
        if len(self.reports) > self.reports_kept:
            del self.reports[: len(self.reports) - self.reports_kept]
        self._warm_total += report.warm + report.handed_off
        self._restored_total += report.restored

    def warm_hit_rate(self) -> float:
        """Ranges served warm (or handed off warm by their old host) / ranges that needed
        state (fresh starts not counted), over every epoch this driver committed."""
        needed = self._warm_total + self._restored_total
        return self._warm_total / needed if needed else 0.0

    def state_hosts(self) -> list[HostInfo]:
        """The application's live state hosts as the driver's registry sees them (endpoints,
        executor; RSS and keyed state bytes on heap and spilled from their last heartbeat)."""
        return self._registry.live_hosts() if self._registry is not None else []

    def release(self) -> None:
        """Free this pipeline's ranges in the state hosts (its query is over for good); the
        hosts stay for the application's other pipelines, and so does the driver's merge process
        (until it has been idle a while). Its checkpoints are kept."""
        self.drain()
        self._close_wake_ups()
        self._release_ranges()

    def _release_ranges(self) -> None:
        """Drop this pipeline's ranges in the state hosts: its query stopped for good (see
        stopped_queries). Its wake-ups stay, for a restart of the same writer."""
        if self._registry is not None:
            self._registry.release_pipeline(self.name)

    def _close_wake_ups(self) -> None:
        """Remove the wake-up request (its query is over: a new one asks again)."""
        if self._wake_ups is not None:
            self._wake_ups.close()
            self._wake_ups = None

    def stop_hosts(self, timeout: float = 10.0) -> None:
        """Stop the application's state hosts (shared by its pipelines) and the driver's
        registry, and the driver's merge process; they start again on the next epoch, restoring
        from the checkpoint."""
        self.drain()
        self._close_wake_ups()
        stop_merge_process()
        registry, self._registry = self._registry, None
        if registry is None:
            return
        stopped = registry.shutdown_hosts(timeout)
        registry.close()
        here = socket.gethostname()
        deadline = time.monotonic() + timeout
        for host in stopped:  # on this machine (local masters), wait for the processes too
            while host.node == here and process_alive(host.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.hosts.clear()


def _earliest(times: Iterable[int | None]) -> int | None:
    return min((t for t in times if t is not None), default=None)


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _perf_counter() -> float:
    return time.perf_counter()


def _registry_bind(spark: SparkSession, master_url: str) -> str:
    """Where the host registry listens: on the driver's address, in the classic driver and in
    the process a Connect server runs ``foreachBatch`` in; in a Connect client, on its address
    that routes to the server (a local master's executors reach 127.0.0.1 either way:
    ``local[...]`` and ``local-cluster[...]`` run every executor on the driver's machine)."""
    local = master_url.startswith("local")
    if local and (not is_connect(spark) or client_address(spark) == "127.0.0.1"):
        return "127.0.0.1"  # every executor runs on this machine
    if is_connect(spark) and not on_connect_driver():
        return client_address(spark)
    conf = session_conf(spark)
    return conf.get("spark.driver.bindAddress") or socket.gethostbyname(
        conf.get("spark.driver.host") or socket.gethostname()
    )


def _secret_maker(hosts_of: str) -> Callable[[], bytes]:
    """How this process's coordinator gets the secret of hosts ``hosts_of``: on a Connect
    server's ``foreachBatch`` process, the one every such process of the application shares
    (so that its queries share the executors' hosts, see driver_secret); else a new one."""
    if on_connect_driver():
        return functools.partial(shared_secret, hosts_of)
    return new_secret


# what a pipeline pickled into another process keeps (see StatefulPipeline.__getstate__)
_DECLARED = (
    "function_bytes",
    "combiner",
    "emits_from_timers",
    "key_columns",
    "output_schema",
    "parallelism",
    "overrides",
    "storage_options",
    "name",
    "clock",
    "_wake_ups",
    "_function_ships",
)

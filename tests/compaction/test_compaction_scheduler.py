"""Scheduler rules with a hand-driven clock: policies, leases, stalls, attempts, stale answers."""

from __future__ import annotations

import pytest
from statetier.backend.snapshot.compaction import (
    CompactionInput,
    CompactionOutput,
    CompactionRequest,
    CompactionResult,
)
from statetier.compaction.scheduler import (
    ErrorKind,
    JobState,
    LeaseLostError,
    QueueFullError,
    Scheduler,
    SchedulerSettings,
    UnknownWorkerError,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(job_id: str, size: int = 100, app: str = "a") -> CompactionRequest:
    return CompactionRequest(
        job_id=job_id,
        state="s",
        key_groups="0-7",
        inputs=[CompactionInput(f"s3://b/{app}/data/x/{job_id}", size, 0, "base", 1)],
        output_prefix=f"s3://b/{app}/data/epoch-1/w/compacted/s",
    )


def make(clock: Clock, **settings: object) -> Scheduler:
    return Scheduler(SchedulerSettings(**settings), clock=clock)  # type: ignore[arg-type]


def result(job_id: str) -> CompactionResult:
    return CompactionResult(job_id, [CompactionOutput(f"s3://b/out/{job_id}", 1, 2)])


def test_round_robin_cycles_through_free_workers() -> None:
    s = make(Clock(), worker_policy="round-robin")
    for w in ("w1", "w2", "w3"):
        s.register(w, 2)
    for i in range(6):
        s.submit(request(f"j{i}"))
    given = [w for w, _ in s.schedule()]
    assert given == ["w1", "w2", "w3", "w1", "w2", "w3"]


def test_least_loaded_takes_the_worker_with_fewest_bytes_left() -> None:
    s = make(Clock(), worker_policy="least-loaded")
    s.register("big", 2)
    s.register("small", 2)
    s.submit(request("huge", size=10_000))
    s.submit(request("tiny", size=10))
    assert [w for w, _ in s.schedule()] == ["big", "small"]
    s.heartbeat("small", {"tiny": 5})
    s.submit(request("next", size=50))
    assert [w for w, _ in s.schedule()] == ["small"]  # 5 bytes left there, 10 000 on big


def test_fair_policy_alternates_between_applications() -> None:
    s = make(Clock(), job_policy="fair")
    for i in range(4):
        s.submit(request(f"a{i}", app="one"))
    s.submit(request("b0", app="two"))
    s.register("w", 3)
    assert [j.job_id for _, j in s.schedule()] == ["a0", "b0", "a1"]
    fifo = make(Clock(), job_policy="fifo")
    for i in range(4):
        fifo.submit(request(f"a{i}", app="one"))
    fifo.submit(request("b0", app="two"))
    fifo.register("w", 3)
    assert [j.job_id for _, j in fifo.schedule()] == ["a0", "a1", "a2"]


def test_dead_worker_loses_its_lease_and_the_job_goes_to_another() -> None:
    clock = Clock()
    s = make(clock, lease_ttl=5.0)
    s.register("w1", 1)
    job, _ = s.submit(request("j"))
    s.schedule()
    s.register("w2", 1)
    clock.now += 3
    s.heartbeat("w2", {})
    assert s.expire() == []
    clock.now += 3  # w1 silent for 6 s
    assert s.expire() == ["worker w1 expired"]
    assert job.status.state is JobState.QUEUED
    assert [w for w, _ in s.schedule()] == ["w2"] and job.status.attempt == 2
    with pytest.raises(LeaseLostError):  # the old attempt's late answer
        s.complete("w1", "j", 1, result("j"))
    done = s.complete("w2", "j", 2, result("j"))
    assert done.status.state is JobState.SUCCEEDED and done.status.result == result("j")


def test_stalled_job_is_revoked_and_the_worker_told_to_drop_it() -> None:
    clock = Clock()
    s = make(clock, lease_ttl=5.0, stall_timeout=10.0)
    s.register("w", 1)
    job, _ = s.submit(request("j"))
    s.schedule()
    for _ in range(4):  # last progress at 104; at 116 it is 12 s old
        clock.now += 4
        s.heartbeat("w", {"j": 7})  # alive, but no progress after the first report
        s.expire()
    assert job.status.state is JobState.QUEUED and "no progress" in job.status.history[-1]
    clock.now += 1
    assert s.heartbeat("w", {"j": 7}) == ["j"]


def test_gives_up_after_max_attempts() -> None:
    clock = Clock()
    s = make(clock, max_attempts=2)
    s.register("w", 1)
    job, _ = s.submit(request("j"))
    for attempt in (1, 2):
        s.schedule()
        s.complete("w", "j", attempt, None, "disk full")
    assert job.status.state is JobState.FAILED and "gave up after 2 attempts" in (
        job.status.error or ""
    )


def test_request_errors_fail_at_once() -> None:
    s = make(Clock())
    s.register("w", 1)
    job, _ = s.submit(request("j"))
    s.schedule()
    s.complete("w", "j", 1, None, "corrupt input", error_kind=ErrorKind.REQUEST)
    assert (
        job.status.state is JobState.FAILED
        and job.status.attempt == 1
        and job.status.error_kind is ErrorKind.REQUEST
    )


def test_leave_requeues_at_once_and_join_takes_over() -> None:
    s = make(Clock())
    s.register("w1", 1)
    job, _ = s.submit(request("j"))
    s.schedule()
    s.leave("w1")
    assert job.status.state is JobState.QUEUED and s.running() == 0
    s.register("w2", 1)
    s.schedule()
    assert job.status.worker == "w2" and [j.job_id for j in s.take_assigned("w2")] == ["j"]
    with pytest.raises(UnknownWorkerError):
        s.heartbeat("w1", {})


def test_abort_queued_and_running() -> None:
    s = make(Clock())
    queued, _ = s.submit(request("q"))
    s.abort("q")
    assert queued.status.state is JobState.ABORTED and s.queued() == 0
    s.register("w", 1)
    running, _ = s.submit(request("r"))
    s.schedule()
    s.take_assigned("w")
    s.abort("r")
    assert running.status.state is JobState.ABORTED
    assert s.heartbeat("w", {"r": 3}) == ["r"]
    with pytest.raises(LeaseLostError):
        s.complete("w", "r", 1, result("r"))


def test_resubmitting_the_same_job_is_idempotent_and_conflicts_are_refused() -> None:
    s = make(Clock())
    first, created = s.submit(request("j"))
    again, created_again = s.submit(request("j"))
    assert created and not created_again and first is again
    with pytest.raises(ValueError, match="different request"):
        s.submit(request("j", size=5))


def test_finished_jobs_are_forgotten_after_the_retention() -> None:
    clock = Clock()
    s = make(clock, finished_retention=60.0)
    s.submit(request("j"))
    s.abort("j")
    clock.now += 61
    s.expire()
    assert "j" not in s.jobs


def test_finished_jobs_are_bounded_in_number_as_well_as_in_time() -> None:
    clock = Clock()
    s = make(clock, max_finished=3, finished_retention=3600.0)
    for i in range(5):
        s.submit(request(f"j{i}"))
        clock.now += 1
        s.abort(f"j{i}")
    s.expire()
    assert sorted(s.jobs) == ["j2", "j3", "j4"]  # the oldest finished ones went first
    clock.now += 3601
    s.expire()
    assert s.jobs == {}


def test_the_queue_bounds_are_checked_before_a_job_is_kept() -> None:
    s = make(Clock(), max_queued=2, max_queued_per_tenant=1, max_tenant_bytes=1 << 20)
    s.submit(request("a1", app="a"))
    with pytest.raises(QueueFullError, match="max-queued-per-tenant"):
        s.submit(request("a2", app="a"))
    with pytest.raises(QueueFullError, match="max-tenant-bytes"):
        s.submit(request("b1", size=(1 << 20) + 1, app="b"))
    s.submit(request("b2", app="b"))
    with pytest.raises(QueueFullError, match=r"\(max-queued\)"):
        s.submit(request("c1", app="c"))
    assert sorted(s.jobs) == ["a1", "b2"] and s.queued() == 2
    assert s.submit(request("a1", app="a"))[1] is False  # a retried submit is no new job


@pytest.mark.parametrize(
    "settings",
    [{"max_queued": 0}, {"max_tenant_bytes": 10}, {"lease_ttl": 0.0}, {"max_attempts": 0}],
)
def test_nonsense_bounds_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be"):
        SchedulerSettings(**settings)  # type: ignore[arg-type]

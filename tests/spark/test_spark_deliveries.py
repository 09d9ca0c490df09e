"""The driver's record of which gathered ranges' outputs tasks delivered: once every piece of a
stage has reported, a report that leaves a range undelivered fails its task, so that the sink's
job cannot succeed without the range. Through a real registry on 127.0.0.1, without Spark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from statetier.backend.spark.channel import new_secret
from statetier.backend.spark.deliveries import (
    Deliveries,
    DeliveryReport,
    UndeliveredError,
    report_delivered,
)
from statetier.backend.spark.registry import HostRegistry


@pytest.fixture
def registry() -> Iterator[HostRegistry]:
    made = HostRegistry(new_secret(), "127.0.0.1")
    yield made
    made.close()


def report(piece: int, *delivered: int, epoch: int = 5, stage: int = 9) -> DeliveryReport:
    """Piece ``piece`` of 3 of a stage of 4 ranges delivered ``delivered``."""
    return DeliveryReport("wordcount", epoch, stage, piece, 3, 4, delivered)


def tell(registry: HostRegistry, sent: DeliveryReport) -> None:
    report_delivered(registry.endpoint, registry.secret, sent)


def test_a_stage_whose_pieces_delivered_every_range_passes(registry: HostRegistry) -> None:
    for sent in (report(2, 1), report(0, 0, 3), report(1, 2)):
        tell(registry, sent)
    assert registry.deliveries.delivered("wordcount", 5) == {0, 1, 2, 3}
    assert registry.deliveries.refused("wordcount", 5) == ()


def test_the_last_piece_fails_when_a_range_can_no_longer_be_delivered(
    registry: HostRegistry,
) -> None:
    # range 2's pieces went to a host that died: its new owner never gets them all
    tell(registry, report(0, 0))
    tell(registry, report(1, 3))  # not every piece is in: range 2 may still come
    with pytest.raises(UndeliveredError) as info:
        tell(registry, report(2, 1))
    message = str(info.value)
    assert "ranges [2] of epoch 5" in message and "runs the epoch again" in message
    assert len(message.splitlines()) == 1
    # so does every retry of it (no piece can come but a retry's): Spark's job fails
    with pytest.raises(UndeliveredError):
        tell(registry, report(2, 1))
    assert registry.deliveries.refused("wordcount", 5) == (2,)
    assert registry.deliveries.refused("wordcount", 6) == ()  # another epoch


def test_a_range_counts_only_if_every_reported_attempt_of_its_piece_delivered_it() -> None:
    deliveries = Deliveries()
    assert deliveries.report(report(0, 0, 1)) is None
    assert deliveries.report(report(1, 2, 3)) is None
    assert deliveries.report(report(2)) is None
    # piece 0's task failed after it reported (its executor died, taking range 1's host with
    # it); its retry got range 0 again, not range 1, whose new host has one piece
    refusal = deliveries.report(report(0, 0))
    assert refusal is not None and "ranges [1]" in refusal
    assert deliveries.delivered("wordcount", 5) == {0, 2, 3}


def test_a_retry_that_delivers_what_its_first_attempt_did_passes() -> None:
    deliveries = Deliveries()
    for sent in (report(0, 0, 1), report(1, 2), report(2, 3), report(0, 0, 1)):
        assert deliveries.report(sent) is None
    assert deliveries.delivered("wordcount", 5) == {0, 1, 2, 3}


def test_a_new_run_of_the_epoch_forgets_the_stages_of_the_earlier_one() -> None:
    deliveries = Deliveries()
    deliveries.report(report(0, 0, 1))
    deliveries.report(report(1))
    assert deliveries.report(report(2, 3)) is not None
    deliveries.begin("wordcount", 5)
    assert deliveries.refused("wordcount", 5) == ()
    assert deliveries.delivered("wordcount", 5) == frozenset()
    # a task of the failed run that reports late fails; it does not count for the new run
    late = deliveries.report(report(1, 2))
    assert late is not None and "stage 9 belongs to a run of epoch 5 that failed" in late
    for piece, delivered in enumerate([(0,), (1, 2), (3,)]):
        assert deliveries.report(report(piece, *delivered, stage=12)) is None
    assert deliveries.delivered("wordcount", 5) == {0, 1, 2, 3}
    deliveries.forget("wordcount", 5)
    assert deliveries.delivered("wordcount", 5) == frozenset()


def test_the_first_refusal_of_a_run_cancels_its_jobs_once() -> None:
    deliveries = Deliveries()
    cancelled: list[int] = []
    deliveries.begin("wordcount", 5, lambda: cancelled.append(5))
    deliveries.report(report(0, 0))
    deliveries.report(report(1, 1))
    assert cancelled == []  # not every piece is in yet
    assert deliveries.report(report(2, 2)) is not None
    assert deliveries.report(report(2, 2)) is not None  # a retry of it, refused again
    assert cancelled == [5]

"""The pure parts of StateSnapshots: cron schedules, the Job's outcome, and the runbook links of
the snapshot alerts (each names a section of docs/state-lifecycle.md that exists)."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest
import yaml
from statetier.operator import cron, snapshot

REPO = Path(__file__).resolve().parents[2]
UTC = datetime.UTC


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("*/2 * * * * *", "2026-01-01T00:00:01", "2026-01-01T00:00:02"),
        ("0 0 * * * *", "2026-01-01T00:00:00", "2026-01-01T01:00:00"),
        ("0 30 2 * * *", "2026-01-01T03:00:00", "2026-01-02T02:30:00"),
        ("0 0 0 1 * *", "2026-01-15T00:00:00", "2026-02-01T00:00:00"),
        ("0 0 0 * * 0", "2026-01-01T00:00:00", "2026-01-04T00:00:00"),  # a Sunday
        ("0 0 0 * * 7", "2026-01-01T00:00:00", "2026-01-04T00:00:00"),  # 7 is Sunday too
        ("0 0 0 29 2 *", "2026-03-01T00:00:00", "2028-02-29T00:00:00"),
        ("0 0 12 13 * 5", "2026-01-01T00:00:00", "2026-01-02T12:00:00"),  # either day field
        ("0 0,30 8-9 * * 1-5", "2026-01-02T09:31:00", "2026-01-05T08:00:00"),
    ],
)
def test_next_after(schedule: str, after: str, expected: str) -> None:
    assert cron.parse(schedule).next_after(at(after)) == at(expected)


@pytest.mark.parametrize(
    ("schedule", "says"),
    [
        ("0 * * * *", "has 5 fields, not 6"),
        ("0 61 * * * *", "minute field '61': values must be within 0-59"),
        ("0 0 * * * mon", "use numbers"),
        ("*/0 * * * * *", "step '0' is not a positive number"),
    ],
)
def test_a_bad_schedule_is_named(schedule: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        cron.parse(schedule)


def _job(condition: str | None) -> dict[str, object]:
    conditions = [{"type": condition, "status": "True", "reason": "X", "message": "m"}]
    return {"status": {"conditions": conditions if condition else [], "active": 0}}


def _pods(message: str, code: int) -> list[dict[str, object]]:
    terminated = {"exitCode": code, "message": message}
    return [{"status": {"containerStatuses": [{"state": {"terminated": terminated}}]}}]


def test_the_outcome_is_read_from_the_termination_message() -> None:
    result = {"uri": "s3://b/p", "source": "s3://b/c", "epoch": 4, "bytes": 9, "files": 2}
    line = json.dumps({**result, "spark_batch": None})
    phase, fields = snapshot.job_outcome(_job("Complete"), _pods(line, 0))
    assert phase == "Succeeded"
    assert (fields["uri"], fields["epoch"], fields["bytes"], fields["files"]) == (
        "s3://b/p",
        4,
        9,
        2,
    )
    phase, fields = snapshot.job_outcome(_job("Complete"), _pods("", 0))
    assert (phase, fields["reason"]) == ("Failed", "UnreadableResult")
    phase, fields = snapshot.job_outcome(_job("Failed"), _pods("epoch 9 is not committed\n", 1))
    assert (phase, fields["message"]) == ("Failed", "exit code 1: epoch 9 is not committed")


def test_long_names_give_job_names_a_label_can_hold() -> None:
    name = snapshot.job_name("x" * 80, "savepoint")
    assert len(name) <= 63 and name != snapshot.job_name("x" * 81, "savepoint")


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", markdown, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


def test_the_snapshot_alerts_link_runbooks_that_exist() -> None:
    rules = yaml.safe_load((REPO / "charts/statetier/rules/statetier-alerts.yaml").read_text())
    urls = [
        rule["annotations"]["runbook_url"]
        for group in rules["groups"]
        if group["name"] == "statetier-snapshots"
        for rule in group["rules"]
    ]
    anchors = _anchors((REPO / "docs/runbooks.md").read_text())
    assert len(urls) == 2
    for url in urls:
        page, _, anchor = url.partition("#")
        assert page.endswith("/docs/runbooks") and anchor in anchors, url

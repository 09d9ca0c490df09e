"""The upgrade rules as pure functions: what the Spark Operator resubmits for, what each mode
changes at admission, and where a savepoint upgrade stands (the emulator tests run them whole
in tests/operator/test_operator_upgrades.py)."""

from __future__ import annotations

import json

from statetier.operator import annotations as ann
from statetier.operator import upgrade

OLD = {
    "statetier.io/enabled": "true",
    "statetier.io/checkpoint-uri": "s3://b/app",
    "statetier.io/spark-checkpoint-uri": "s3a://b/app-spark",
    "statetier.io/savepoint-destination": "s3://b/sp",
}


def test_only_a_change_beyond_suspend_and_ttl_is_a_resubmission() -> None:
    spec = {"image": "a", "suspend": False}
    assert not upgrade.spec_changed(spec, {"image": "a", "suspend": True})
    assert not upgrade.spec_changed(spec, {"image": "a", "timeToLiveSeconds": 60})
    assert upgrade.spec_changed(spec, {"image": "b", "suspend": True})


def test_a_new_location_is_a_sibling_that_replaces_an_earlier_upgrade_s_suffix() -> None:
    assert upgrade.next_location("s3://b/app/", 1) == "s3://b/app-upgrade-1"
    assert upgrade.next_location("s3://b/app-upgrade-1", 2) == "s3://b/app-upgrade-2"


def test_stateless_moves_the_kept_locations_and_drops_an_old_restore() -> None:
    old = {**OLD, "statetier.io/restore-from": "s3://b/old-sp"}
    new = {**old, "statetier.io/upgrade-mode": "stateless"}
    new["statetier.io/spark-checkpoint-uri"] = "s3a://b/mine"  # changed by the user: theirs
    plan = upgrade.admit(old, new, True, "app", "ns")
    assert not plan.suspend
    assert plan.annotations["statetier.io/checkpoint-uri"] == "s3://b/app-upgrade-1"
    assert "statetier.io/spark-checkpoint-uri" not in plan.annotations
    assert plan.annotations["statetier.io/restore-from"] is None
    record = json.loads(str(plan.annotations[ann.UPGRADE]))
    assert record["to"] == {
        "checkpointUri": "s3://b/app-upgrade-1",
        "sparkCheckpointUri": "s3a://b/mine",
    }
    again = {**new, ann.UPGRADE: str(plan.annotations[ann.UPGRADE])}
    second = upgrade.admit(again, again, True, "app", "ns")
    assert json.loads(str(second.annotations[ann.UPGRADE]))["number"] == 2


def test_savepoint_suspends_and_names_the_savepoint_to_be() -> None:
    new = {**OLD, "statetier.io/upgrade-mode": "savepoint"}
    plan = upgrade.admit(OLD, new, True, "app", "ns")
    assert plan.suspend
    uri = "s3://b/sp/ns/app-upgrade-1"
    assert plan.annotations["statetier.io/restore-from"] == uri
    record = json.loads(str(plan.annotations[ann.UPGRADE]))
    assert (record["phase"], record["snapshot"], record["savepoint"]) == (
        "Suspending",
        "app-upgrade-1",
        uri,
    )
    assert record["from"] == {
        "checkpointUri": "s3://b/app",
        "sparkCheckpointUri": "s3a://b/app-spark",
    }


def test_nothing_moves_without_a_resubmission_and_an_upgrade_under_way_keeps_suspend() -> None:
    new = {**OLD, "statetier.io/upgrade-mode": "savepoint"}
    assert upgrade.admit(OLD, new, False, "app", "ns") == upgrade.Plan({})
    holding = {**new, ann.UPGRADE: json.dumps({"phase": "Failed"})}
    assert upgrade.admit(holding, holding, False, "app", "ns") == upgrade.Plan({}, suspend=True)
    last = {**OLD, "statetier.io/upgrade-mode": "last-state"}
    assert upgrade.admit(OLD, last, True, "app", "ns") == upgrade.Plan({})


def test_last_state_refuses_moving_a_location_and_names_the_fix() -> None:
    new = {
        **OLD,
        "statetier.io/upgrade-mode": "last-state",
        "statetier.io/checkpoint-uri": "s3://b/x",
    }
    (problem,) = upgrade.last_state_problems(OLD, new)
    assert "statetier.io/checkpoint-uri changed from 's3://b/app' to 's3://b/x'" in problem
    assert "keep 's3://b/app'" in problem
    assert upgrade.last_state_problems(OLD, {**new, "statetier.io/upgrade-mode": "stateless"}) == []


def test_modes_that_move_state_require_both_locations() -> None:
    found = ann.problems({"statetier.io/enabled": "true", "statetier.io/upgrade-mode": "savepoint"})
    assert len(found) == 3 and all(
        "required when statetier.io/upgrade-mode is savepoint" in p for p in found
    )
    assert "statetier.io/spark-checkpoint-uri" in found[1]


def _app(state: str | None) -> dict[str, object]:
    record = {"phase": "Snapshotting", "snapshot": "app-upgrade-1"}
    return {
        "metadata": {"annotations": {ann.UPGRADE: json.dumps(record)}},
        "status": {"applicationState": {"state": state}} if state else {},
    }


def test_the_steps_of_a_savepoint_upgrade() -> None:
    assert upgrade.next_step(_app("RUNNING"), None, None).phase == "Suspending"
    assert upgrade.next_step(_app(None), None, None).action is None
    suspended = _app("SUSPENDED")
    assert upgrade.next_step(suspended, None, None).action == "snapshot"
    failed = {
        "status": {"phase": "Failed", "reason": "SavepointFailed", "message": "exit code 1: x"}
    }
    step = upgrade.next_step(suspended, failed, None)
    assert step.phase == "Failed" and "kubectl delete statesnapshot app-upgrade-1" in step.message
    done = {"status": {"phase": "Succeeded", "epoch": 4, "uri": "s3://b/sp/ns/app-upgrade-1"}}
    assert upgrade.next_step(suspended, done, None).action == "restore"
    running = {"status": {"active": 1}}
    assert upgrade.next_step(suspended, done, running) == upgrade.Step(
        "RestoringSpark", None, "Job app-upgrade-1-restore-spark restores the Spark part"
    )
    bad = {"status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    step = upgrade.next_step(suspended, done, bad, "exit code 1: not empty")
    assert step.phase == "Failed" and "not empty" in step.message
    ok = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    step = upgrade.next_step(suspended, done, ok)
    assert (step.phase, step.action) == ("Done", "resume") and "epoch 4" in step.message

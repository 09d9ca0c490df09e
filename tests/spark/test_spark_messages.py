"""The messages between driver, tasks and state hosts: each decodes what it encodes, and a
malformed one fails with an error that names the message and the field (no Spark needed)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot import FileEntry, SubtaskSnapshot
from statetier.backend.snapshot.chain_update import ChainUpdate
from statetier.backend.spark.channel import Endpoint
from statetier.backend.spark.messages import (
    EpochSpec,
    EpochTime,
    PipelineSpec,
    StateSpec,
    TaskHeader,
)
from statetier.backend.spark.results import RangeResult, RangeStart
from statetier.backend.wire import MessageError

MAX_PARALLELISM = 8  # two ranges at parallelism 2: 0-3 and 4-7


def update(key_groups: str, base: bool = True) -> ChainUpdate:
    inputs = (FileEntry(f"d/{key_groups}-1", 10, 1, "s", key_groups, None, "base", 1),)
    merged = FileEntry(f"c/{key_groups}", 9, 2, "s", key_groups, None, "base", 1)
    return ChainUpdate("s", key_groups, inputs, merged if base else None)


def pipeline_spec() -> PipelineSpec:
    return PipelineSpec(
        app_id="app-1",
        idle_timeout=600.0,
        registry=Endpoint("tcp", "127.0.0.1", 4000),
        secret=b"s" * 32,
        host_bind="127.0.0.1",
        host_port=0,
        state=StateSpec(
            pipeline="wc",
            parallelism=2,
            max_parallelism=MAX_PARALLELISM,
            checkpoint_uri="file:///tmp/ckpt",
            key_columns=("word",),
            schema="ff",
            config={"spill.enabled": "true"},
        ),
    )


def epoch_spec() -> EpochSpec:
    return EpochSpec(
        epoch=3,
        base_epoch=2,
        base_tokens={"0": "driver-t7", "1": "driver-t8"},
        owner="driver",
        time=EpochTime(watermark=None, processing_time=1_000, end_of_input=True),
        chain_updates=(update("0-3"), update("4-7", base=False)),
    )


def over_json(data: Any) -> Any:
    return json.loads(json.dumps(data))


def test_an_epoch_spec_decodes_what_it_encodes() -> None:
    spec = epoch_spec()
    assert EpochSpec.decode(over_json(spec.encode())) == spec


def test_a_task_header_is_its_ranges_part_of_the_epoch_and_decodes_what_it_encodes() -> None:
    header = TaskHeader.for_task(
        pipeline_spec(), epoch_spec(), index=1, attempt_number=2, task_attempt_id=42,
        owner_host="h1",
    )  # fmt: skip
    assert header.base_token == "driver-t8" and header.token == "driver-t42"
    assert header.chain_updates == (update("4-7", base=False),)  # range 1's only
    assert header.time.end_of_input and header.state.config == {"spill.enabled": "true"}
    wire = over_json(header.encode())
    assert wire["op"] == "task" and "secret" not in wire and "base_tokens" not in wire
    assert TaskHeader.decode(wire) == header


def test_a_range_result_decodes_what_it_encodes_and_an_older_ones_fields_default() -> None:
    snapshot = SubtaskSnapshot(
        KeyGroupRange(0, 3), MAX_PARALLELISM, "str", {}, [FileEntry("d/x", 1, 2)], None, 5
    )
    result = RangeResult(
        index=0, parallelism=2, epoch=3, token="driver-t1", state=RangeStart.WARM, records=10,
        spilled_key_groups=1, key_groups=4, restore_s=0.0, snapshot_s=0.5, total_s=1.0,
        upload_bytes=100, snapshot=snapshot, host_pid=7, host_socket="/s", rows=5,
    )  # fmt: skip
    assert RangeResult.decode(result.encode()) == result
    older = json.loads(result.encode())
    for name in ("process_s", "rows", "host_id", "restored_bytes", "snapshot_cpu_s"):
        del older[name]
    del older["compaction_base"]
    assert RangeResult.decode(json.dumps(older).encode()) == dataclasses.replace(result, rows=0)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"epoch": None}, "statetier epoch spec: field 'epoch' is missing"),
        ({"base_epoch": True}, "field 'base_epoch' must be an integer, got True"),
        ({"owner": 7}, "field 'owner' must be a string, got 7"),
        ({"base_tokens": {"0": 1}}, "field 'base_tokens' must be an object of strings"),
        ({"watermark": "soon"}, "field 'watermark' must be an integer, got 'soon'"),
        ({"end_of_input": 1}, "field 'end_of_input' must be true or false, got 1"),
        ({"chain_updates": {}}, "field 'chain_updates' must be a list, got {}"),
    ],
)
def test_a_malformed_epoch_spec_names_its_field(change: dict[str, Any], error: str) -> None:
    data = over_json(epoch_spec().encode())
    for name, value in change.items():
        if value is None:
            del data[name]
        else:
            data[name] = value
    with pytest.raises(MessageError) as raised:
        EpochSpec.decode(data)
    assert error in str(raised.value)


def test_a_malformed_chain_update_is_named_by_its_place() -> None:
    data = over_json(epoch_spec().encode())
    del data["chain_updates"][1]["inputs"]
    with pytest.raises(MessageError, match=r"field 'chain_updates\[1\]' is not a chain update"):
        EpochSpec.decode(data)


def test_a_task_header_that_is_no_object_or_lacks_a_field_says_so() -> None:
    with pytest.raises(MessageError, match=r"statetier task header: expected a JSON object"):
        TaskHeader.decode(["task"])
    header = TaskHeader.for_task(
        pipeline_spec(), epoch_spec(), index=0, attempt_number=0, task_attempt_id=1,
        owner_host="h1",
    )  # fmt: skip
    data = over_json(header.encode())
    del data["owner_host"]
    with pytest.raises(MessageError, match=r"field 'owner_host' is missing"):
        TaskHeader.decode(data)
    data = over_json(header.encode()) | {"key_columns": "word"}
    with pytest.raises(MessageError, match=r"field 'key_columns' must be a list of strings"):
        TaskHeader.decode(data)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"{", "statetier range result r.json: not JSON"),
        (  # read in the class's order: the fields before the state are there
            b'{"index": 0, "parallelism": 2, "epoch": 3, "token": "t", "state": "tepid"}',
            "field 'state' must be warm, restored, handed-off or fresh, got 'tepid'",
        ),
        (b'{"state": "warm"}', "field 'index' is missing"),
    ],
)
def test_a_malformed_range_result_names_its_file_and_field(raw: bytes, error: str) -> None:
    with pytest.raises(MessageError) as raised:
        RangeResult.decode(raw, "r.json")
    assert error in str(raised.value)

"""What a range's task reports to the driver: its snapshot for the epoch, and how it ran.

The state host writes it as JSON to a deterministic name in the checkpoint location, after the
range's data files: ``data/epoch-N/<driver owner>/results/<index>-of-<parallelism>.json``. A retried
or speculative attempt overwrites it with an equally valid result (its own data files, which are
never overwritten: they are named by the attempt's token). The host writes it after the task has
returned its outputs (the snapshot overlaps Spark's next tasks), so the driver waits for one per
range after the job succeeded; a host that failed to snapshot writes an error file beside it
instead. Retention deletes them with the epoch's other files.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot import FileEntry, SubtaskSnapshot
from statetier.backend.wire import Fields, MessageError

__all__ = ["RangeResult", "RangeStart"]


class RangeStart(str, enum.Enum):
    """Where a range's state came from when its task started."""

    WARM = "warm"  # the host held the range at the task's base
    RESTORED = "restored"  # restored from the checkpoint at the base
    FRESH = "fresh"  # no state yet (the first epoch)


@dataclasses.dataclass(frozen=True)
class RangeResult:
    """A range's snapshot for the epoch and how its task ran (one JSON file per range)."""

    index: int
    parallelism: int
    epoch: int
    token: str
    state: RangeStart
    records: int
    spilled_key_groups: int
    key_groups: int
    restore_s: float
    snapshot_s: float
    total_s: float
    upload_bytes: int
    snapshot: SubtaskSnapshot
    host_pid: int
    host_socket: str
    process_s: float = 0.0  # of total_s: handing the records to the function
    rows: int = 0  # rows received (a combiner's rows stand for several records)
    host_id: str = ""  # the state host that owns the range
    restored_bytes: int = 0  # downloaded to restore the range (0 when warm or fresh)
    snapshot_cpu_s: float = 0.0  # CPU of the snapshot: its thread and its upload threads
    compaction_base: bool = False  # the snapshot wrote a base in place of a compaction

    def encode(self) -> bytes:
        """The result file's bytes."""
        data = dataclasses.asdict(self)
        data["state"] = self.state.value
        data["snapshot"] = _snapshot_to_dict(self.snapshot)
        return json.dumps(data).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str = "") -> RangeResult:
        """A result file's content; ``where`` (its name) goes into the error of a bad one.
        The fields with defaults are absent from older hosts' results."""
        message = f"statetier range result {where}".rstrip()
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise MessageError(f"{message}: not JSON: {e}") from None
        fields = Fields(message, data)
        state = fields.text("state")
        try:
            start = RangeStart(state)
        except ValueError:
            fields.fail("state", "warm, restored or fresh", state)
        return cls(
            index=fields.integer("index"),
            parallelism=fields.integer("parallelism"),
            epoch=fields.integer("epoch"),
            token=fields.text("token"),
            state=start,
            records=fields.integer("records"),
            spilled_key_groups=fields.integer("spilled_key_groups"),
            key_groups=fields.integer("key_groups"),
            restore_s=fields.number("restore_s"),
            snapshot_s=fields.number("snapshot_s"),
            total_s=fields.number("total_s"),
            upload_bytes=fields.integer("upload_bytes"),
            snapshot=_snapshot(fields),
            host_pid=fields.integer("host_pid"),
            host_socket=fields.text("host_socket"),
            process_s=fields.number("process_s", 0.0),
            rows=fields.integer("rows", 0),
            host_id=fields.text("host_id", ""),
            restored_bytes=fields.integer("restored_bytes", 0),
            snapshot_cpu_s=fields.number("snapshot_cpu_s", 0.0),
            compaction_base=fields.flag("compaction_base", False),
        )


def _snapshot(fields: Fields) -> SubtaskSnapshot:
    data = fields.mapping("snapshot")
    try:
        return _snapshot_from_dict(data)
    except (KeyError, TypeError, ValueError) as e:
        raise MessageError(f"{fields.message}: field 'snapshot' is malformed: {e!r}") from None


def _snapshot_to_dict(snapshot: SubtaskSnapshot) -> dict[str, Any]:
    return {
        "key_groups": str(snapshot.key_groups) if snapshot.key_groups is not None else None,
        "max_parallelism": snapshot.max_parallelism,
        "key_serializer": snapshot.key_serializer,
        "states": snapshot.states,
        "keyed_files": [dataclasses.asdict(f) for f in snapshot.keyed_files],
        "operator_file": (
            dataclasses.asdict(snapshot.operator_file) if snapshot.operator_file else None
        ),
        "processing_time": snapshot.processing_time,
    }


def _snapshot_from_dict(data: dict[str, Any]) -> SubtaskSnapshot:
    kg = data["key_groups"]
    op = data["operator_file"]
    return SubtaskSnapshot(
        key_groups=KeyGroupRange.parse(kg) if kg is not None else None,
        max_parallelism=data["max_parallelism"],
        key_serializer=data["key_serializer"],
        states=data["states"],
        keyed_files=[FileEntry(**f) for f in data["keyed_files"]],
        operator_file=FileEntry(**op) if op is not None else None,
        processing_time=data.get("processing_time"),  # older hosts' results have none
    )

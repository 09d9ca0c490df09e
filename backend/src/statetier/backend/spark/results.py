"""What a range's task reports to the driver: its snapshot for the epoch, and how it ran.

The state host sends it as JSON over its registry link, after the range's data files are
uploaded, and writes it to a deterministic name in the checkpoint location only when the driver
does not acknowledge it (a link that broke, a driver too busy to answer in time):
``data/epoch-N/<driver owner>/results/<index>-of-<parallelism>.json``. A retried or speculative
attempt replaces it with an equally valid result (its own data files, which are never
overwritten: they are named by the attempt's token). The host sends it after the task has
returned its outputs (the snapshot overlaps Spark's next tasks), so the driver waits for one per
range after the job succeeded; a host that failed to snapshot writes an error file instead, and
tells it. Retention deletes these files with the epoch's other files.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot import FileEntry, SubtaskSnapshot
from statetier.backend.wire import Fields, MessageError, decode_fields, encode_fields

__all__ = ["RangeResult", "RangeStart", "snapshot_from_dict", "snapshot_to_dict"]


class RangeStart(str, enum.Enum):
    """Where a range's state came from when its task started."""

    WARM = "warm"  # the host held the range at the task's base
    RESTORED = "restored"  # restored from the checkpoint at the base
    HANDED_OFF = "handed-off"  # taken from its old host, alive after rebalancing moved it
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
    # the range's earliest timers after the epoch (None: none), so that the driver of a
    # streaming query can ask Spark for a micro-batch when they are due (see wakeups)
    next_event_timer: int | None = None
    next_processing_timer: int | None = None

    def encode(self) -> bytes:
        """The result file's bytes."""
        return json.dumps(encode_fields(self, snapshot=snapshot_to_dict)).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str = "") -> RangeResult:
        """A result file's content; ``where`` (its name) goes into the error of a bad one.
        The fields with defaults are absent from older hosts' results."""
        fields = Fields.parse(f"statetier range result {where}".rstrip(), raw)
        return decode_fields(cls, fields, snapshot=_snapshot)


def _snapshot(fields: Fields) -> SubtaskSnapshot:
    data = fields.mapping("snapshot")
    try:
        return snapshot_from_dict(data)
    except (KeyError, TypeError, ValueError) as e:
        raise MessageError(f"{fields.message}: field 'snapshot' is malformed: {e!r}") from None


def snapshot_to_dict(snapshot: SubtaskSnapshot) -> dict[str, Any]:
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


def snapshot_from_dict(data: dict[str, Any]) -> SubtaskSnapshot:
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

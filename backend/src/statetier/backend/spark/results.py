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
from typing import Any

from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot import FileEntry, SubtaskSnapshot

__all__ = [
    "RangeResult",
    "snapshot_from_dict",
    "snapshot_to_dict",
]


@dataclasses.dataclass
class RangeResult:
    index: int
    parallelism: int
    epoch: int
    token: str
    state: str  # warm | restored | fresh
    records: int
    spilled_key_groups: int
    key_groups: int
    restore_s: float
    snapshot_s: float
    total_s: float
    upload_bytes: int
    snapshot: dict[str, Any]
    host_pid: int
    host_socket: str
    process_s: float = 0.0  # of total_s: handing the records to the function
    rows: int = 0  # rows received (a combiner's rows stand for several records)
    host_id: str = ""  # the state host that owns the range
    restored_bytes: int = 0  # downloaded to restore the range (0 when warm or fresh)
    snapshot_cpu_s: float = 0.0  # CPU of the snapshot: its thread and its upload threads
    compaction_base: bool = False  # the snapshot wrote a base in place of a compaction


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

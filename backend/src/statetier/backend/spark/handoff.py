"""A warm hand-off between state hosts: a moved range's committed state, host to host.

When rebalancing moves a range (see rebalancing) its old host is alive and holds the range's
committed state, heap and spilled key groups. The new host, about to restore the range for its
first task, asks the driver's registry for the old owner and then asks the old owner for the
range at the task's base (epoch and the token of the attempt that committed it) over an
authenticated connection (the application's secret, as every host connection). The old host
answers only when it holds exactly that version (never uncommitted state): ``R`` + the snapshot's
manifest part as JSON, one frame per file (the checkpoint's encoding, see snapshot.handoff),
an empty frame; then it drops the range. Anything else (the old host gone, dead mid-way, not at
the base, a damaged file, no answer within ``HANDOFF_TIMEOUT_S``) leaves the new host to restore
the range from tier 2, as it always could.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from multiprocessing.connection import Connection
from typing import Any

from statetier.backend.runtime import FunctionInstance
from statetier.backend.snapshot import Manifest, SnapshotStore
from statetier.backend.snapshot.handoff import HandOff, prepare_handoff
from statetier.backend.spark import protocol
from statetier.backend.spark.channel import connect
from statetier.backend.spark.registry import HostInfo, RangeKey
from statetier.backend.spark.results import snapshot_from_dict, snapshot_to_dict
from statetier.backend.wire import Fields, MessageError

__all__ = ["HANDOFF_TIMEOUT_S", "HandOffRequest", "fetch_handoff", "send_handoff"]

log = logging.getLogger("statetier.spark.host")

HANDOFF_TIMEOUT_S = 30.0  # the longest wait for the old host's next frame


@dataclasses.dataclass(frozen=True)
class HandOffRequest:
    """A new owner's request for range ``key`` at its committed ``epoch`` written by ``token``."""

    key: RangeKey
    epoch: int
    token: str

    def encode(self) -> bytes:
        pipeline, parallelism, index = self.key
        return json.dumps(
            {
                "op": "handoff",
                "pipeline": pipeline,
                "parallelism": parallelism,
                "index": index,
                "epoch": self.epoch,
                "token": self.token,
            }
        ).encode()

    @classmethod
    def decode(cls, fields: Fields) -> HandOffRequest:
        key = (fields.text("pipeline"), fields.integer("parallelism"), fields.integer("index"))
        return cls(key, fields.integer("epoch"), fields.text("token"))


def send_handoff(
    conn: Connection, instance: FunctionInstance, store: SnapshotStore, epoch: int
) -> int:
    """The old host's side: ``instance``'s state (at committed ``epoch``, locked by the
    caller) as a full snapshot in frames; the bytes sent."""
    prepared = prepare_handoff(
        instance.keyed, instance.operator_state, store, epoch, instance.writer.codec
    )
    header = {"snapshot": snapshot_to_dict(prepared.snapshot)}
    conn.send_bytes(protocol.RESULT + json.dumps(header).encode())
    for prepared_file in prepared.uploads:
        conn.send_bytes(prepared_file.data)
    conn.send_bytes(b"")
    return prepared.upload_bytes


def fetch_handoff(
    previous: HostInfo, secret: bytes, request: HandOffRequest, committed: Manifest
) -> HandOff | None:
    """The new host's side: the range's state from its ``previous`` owner, or None (logged:
    the caller restores from tier 2)."""
    tcp = previous.tcp()
    if tcp is None:
        return None
    try:
        with contextlib.closing(connect(tcp, secret)) as conn:
            conn.send_bytes(request.encode())
            return _receive(conn, committed)
    except (OSError, EOFError, MessageError, ValueError, KeyError, TypeError) as e:
        log.warning(
            "range %s: no hand-off from state host %s (%s); restoring it from the checkpoint",
            request.key[2],
            previous.host_id,
            e,
        )
        return None


def _receive(conn: Connection, committed: Manifest) -> HandOff:
    first = _frame(conn)
    if not first.startswith(protocol.RESULT):
        raise MessageError(bytes(first[1:]).decode(errors="replace"))
    header: Any = json.loads(first[1:])
    snapshot = snapshot_from_dict(header["snapshot"])
    names = [f.path for f in snapshot.keyed_files]
    if snapshot.operator_file is not None:
        names.append(snapshot.operator_file.path)
    files = {name: _frame(conn) for name in names}
    if _frame(conn):
        raise MessageError("the hand-off has more files than its snapshot names")
    return HandOff(snapshot, files, committed)


def _frame(conn: Connection) -> bytes:
    if not conn.poll(HANDOFF_TIMEOUT_S):
        raise TimeoutError(f"the old host sent nothing for {HANDOFF_TIMEOUT_S:.0f}s")
    return conn.recv_bytes()

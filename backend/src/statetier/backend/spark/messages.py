"""What the driver tells a range's task, and the task its state host, for one epoch.

Three messages, each typed, each with one encoding:

- :class:`PipelineSpec`: what every task of a pipeline needs whatever the epoch (where the
  registry is, how to start a state host, and the :class:`StateSpec` the hosts need: where the
  checkpoints are, the settings, the schema). It travels pickled inside the task closure,
  Spark's own channel, since it carries the application's secret.
- :class:`EpochSpec`: what the tasks of one epoch need (its base, the writer, its time, the
  chain updates of the driver's compactions). In the closure for a DataFrame planned per
  epoch; as JSON in a Spark job property for a query planned once (``write_stream``).
- :class:`TaskHeader`: what the task sends its range's state host, as JSON, first on the
  connection: the pipeline's :class:`StateSpec` and the epoch's spec cut down to the range,
  plus the task attempt.

The host is started by a task from the same installation, so the header needs no compatibility
across versions; its fields keep their names all the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from statetier.backend.keygroups import key_group_range_for_instance
from statetier.backend.snapshot.chain_update import ChainUpdate
from statetier.backend.spark.channel import Endpoint
from statetier.backend.wire import FLAT, Fields, MessageError, decode_fields, encode_fields

__all__ = ["EpochSpec", "EpochTime", "PipelineSpec", "StateSpec", "TaskHeader"]


@dataclasses.dataclass(frozen=True)
class EpochTime:
    """What the state hosts move time to in one epoch (ms since the Unix epoch)."""

    watermark: int | None  # None: the query has no watermark (event time does not move)
    processing_time: int
    end_of_input: bool = False  # fire every event-time timer after the records


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """What a state host needs of a pipeline, whatever the epoch: its ranges, checkpoints,
    settings, keys and output schema (in the pipeline's spec, and inline in each task header)."""

    pipeline: str
    parallelism: int
    max_parallelism: int  # the plan's key groups (fixed by the first committed epoch)
    checkpoint_uri: str
    key_columns: tuple[str, ...]
    schema: str  # the output schema, Arrow IPC, hex
    storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    config: dict[str, str] = dataclasses.field(default_factory=dict)  # given in code or conf


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """What every task of a pipeline needs, whatever the epoch (pickled with the task)."""

    app_id: str
    idle_timeout: float  # of a state host the task starts
    registry: Endpoint  # the driver's host registry
    secret: bytes = dataclasses.field(repr=False)  # the application's secret
    host_bind: str  # where a host the task starts listens for other executors' tasks
    host_port: int
    state: StateSpec  # what its state hosts need
    hosts: int = 1  # state hosts per executor (see slots); a task uses slot partition mod hosts


@dataclasses.dataclass(frozen=True)
class EpochSpec:
    """What the tasks of one epoch need to know of it; the same for every attempt."""

    epoch: int
    base_epoch: int
    base_tokens: dict[str, str]  # range index -> token of its committed files at the base
    owner: str  # the writer's lease owner: names the epoch's files and results
    time: EpochTime = dataclasses.field(metadata=FLAT)
    chain_updates: tuple[ChainUpdate, ...] = ()  # the driver's compactions, for every range

    def encode(self) -> dict[str, Any]:
        return encode_fields(self, chain_updates=encode_updates)

    @classmethod
    def decode(cls, data: Any) -> EpochSpec:
        fields = Fields("statetier epoch spec", data)
        return decode_fields(cls, fields, chain_updates=decode_updates)


@dataclasses.dataclass(frozen=True)
class TaskHeader:
    """What a task tells its range's state host before its records."""

    state: StateSpec = dataclasses.field(metadata=FLAT)
    index: int  # the range
    epoch: int
    base_epoch: int
    base_token: str | None  # the token of the range's files at the base (None: none known)
    owner: str
    token: str  # this attempt's: names its snapshot files
    attempt_number: int
    task_attempt_id: int
    owner_host: str  # the host the driver routed the range to (another one refuses it)
    time: EpochTime = dataclasses.field(metadata=FLAT)
    chain_updates: tuple[ChainUpdate, ...] = ()  # of this range only
    # a range gathered from several tasks (see gathering): this task's piece of it, how many
    # pieces make it, and the stage attempt they all belong to ("": one task sends it all)
    piece: int = 0
    pieces: int = 1
    gather_attempt: str = ""
    # the registry of the coordinator that routed the task, which hears the range's result (a
    # host can serve several: on a Connect server each query's coordinator has its own; None,
    # a header made by hand: no registry hears it, the host writes the result file)
    registry: Endpoint | None = None

    @classmethod
    def for_task(
        cls,
        pipeline: PipelineSpec,
        epoch: EpochSpec,
        *,
        index: int,
        attempt_number: int,
        task_attempt_id: int,
        owner_host: str,
        piece: int = 0,
        pieces: int = 1,
        gather_attempt: str = "",
    ) -> TaskHeader:
        """The header of task attempt ``task_attempt_id`` of range ``index`` (of its piece
        ``piece`` of ``pieces``, for a gathered range)."""
        state = pipeline.state
        mine = str(key_group_range_for_instance(state.max_parallelism, state.parallelism, index))
        return cls(
            state=state,
            index=index,
            epoch=epoch.epoch,
            base_epoch=epoch.base_epoch,
            base_token=epoch.base_tokens.get(str(index)),
            owner=epoch.owner,
            token=f"{epoch.owner}-t{task_attempt_id}",
            attempt_number=attempt_number,
            task_attempt_id=task_attempt_id,
            owner_host=owner_host,
            time=epoch.time,
            chain_updates=tuple(u for u in epoch.chain_updates if u.key_groups == mine),
            piece=piece,
            pieces=pieces,
            gather_attempt=gather_attempt,
            registry=pipeline.registry,
        )

    def encode(self) -> dict[str, Any]:
        """The header's JSON object, with the request's ``op``."""
        fields = encode_fields(self, chain_updates=encode_updates, registry=_endpoint_json)
        return {"op": "task", **fields}

    @classmethod
    def decode(cls, data: Any) -> TaskHeader:
        fields = Fields("statetier task header", data)
        return decode_fields(cls, fields, chain_updates=decode_updates, registry=_read_registry)


def _endpoint_json(endpoint: Endpoint | None) -> list[Any] | None:
    return endpoint.to_json() if endpoint is not None else None


def _read_registry(fields: Fields) -> Endpoint | None:
    """The header's ``registry`` (absent or null: none named)."""
    if fields.data.get("registry") is None:
        return None
    try:
        return Endpoint.from_json(fields.items("registry"))
    except (TypeError, ValueError) as e:
        raise MessageError(
            f"{fields.message}: field 'registry' is not an endpoint: {e!r}"
        ) from None


def encode_updates(updates: tuple[ChainUpdate, ...]) -> list[dict[str, Any]]:
    """The ``chain_updates`` of a message, JSON-ready."""
    return [u.to_dict() for u in updates]


def decode_updates(fields: Fields) -> tuple[ChainUpdate, ...]:
    """The ``chain_updates`` of a message (none when absent)."""
    updates = []
    for i, item in enumerate(fields.items("chain_updates", [])):
        try:
            updates.append(ChainUpdate.from_dict(item))
        except (KeyError, TypeError, ValueError) as e:
            raise MessageError(
                f"{fields.message}: field 'chain_updates[{i}]' is not a chain update: {e!r}"
            ) from None
    return tuple(updates)

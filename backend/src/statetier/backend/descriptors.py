"""State descriptors: the name, kind, serializers and TTL of a state, declared by the user.

A descriptor is passed to ``get_state`` (keyed state) or ``get_list_state`` (operator state)
and returns a handle. Names are unique per function: registering the same name again with a
descriptor of the same kind returns the same handle; another kind is an error.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from statetier.backend.serializers import DEFAULT_SERIALIZER, Serializer
from statetier.backend.ttl import StateTtlConfig
from statetier.backend.typed.schema import ValueType

__all__ = [
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "StateKind",
    "ValueStateDescriptor",
]

IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")
IN_contra = TypeVar("IN_contra", contravariant=True)
OUT_co = TypeVar("OUT_co", covariant=True)
V = TypeVar("V")


class StateKind(enum.Enum):
    VALUE = "value"
    LIST = "list"
    REDUCING = "reducing"
    AGGREGATING = "aggregating"
    MAP = "map"


class AggregateFunction(Protocol[IN_contra, ACC, OUT_co]):
    """Aggregates inputs into an accumulator whose type may differ from input and output."""

    def create_accumulator(self) -> ACC: ...

    def add(self, value: IN_contra, accumulator: ACC) -> ACC: ...

    def get_result(self, accumulator: ACC) -> OUT_co: ...

    def merge(self, a: ACC, b: ACC) -> ACC: ...


def _check_name(name: object) -> None:
    """A state name is any string: Flink only asks for a name (not null), unique per function.

    Checkpoint file names encode it (``snapshot.store.state_dir``), so no character is special.
    """
    if not isinstance(name, str):
        raise TypeError(f"a state name must be a str, got {type(name).__name__} {name!r}")


@dataclasses.dataclass(eq=False)
class StateDescriptor:
    """What every descriptor has: a name, a kind, a value serializer and optional TTL."""

    name: str
    serializer: Serializer = dataclasses.field(default=DEFAULT_SERIALIZER, kw_only=True)
    ttl: StateTtlConfig | None = dataclasses.field(default=None, kw_only=True)
    kind = StateKind.VALUE

    def __post_init__(self) -> None:
        _check_name(self.name)

    def enable_time_to_live(self, ttl: StateTtlConfig) -> None:
        """Flink-style switch; the same as passing ``ttl=`` to the constructor."""
        self.ttl = ttl

    def serializer_ids(self) -> dict[str, str]:
        """Serializer ids recorded in checkpoints, so a restore can detect a change."""
        return {"value": self.serializer.id}

    def value_schemas(self) -> dict[str, ValueType]:
        """The schemas of the typed serializers among :meth:`serializer_ids`' (a typed state's
        values, recorded in checkpoints so a restore can check a change of type)."""
        schema = _schema(self.serializer)
        return {} if schema is None else {"value": schema}


@dataclasses.dataclass(eq=False)
class ValueStateDescriptor(StateDescriptor, Generic[V]):
    """A single value per key."""

    kind = StateKind.VALUE


@dataclasses.dataclass(eq=False)
class ListStateDescriptor(StateDescriptor, Generic[V]):
    """A list of elements per key; with TTL each element expires on its own."""

    kind = StateKind.LIST


@dataclasses.dataclass(eq=False)
class ReducingStateDescriptor(StateDescriptor, Generic[V]):
    """One value per key, folded with ``reduce_function(old, new)`` on every add."""

    reduce_function: Callable[[Any, Any], Any] = dataclasses.field(kw_only=True)
    kind = StateKind.REDUCING


@dataclasses.dataclass(eq=False)
class AggregatingStateDescriptor(StateDescriptor, Generic[IN, ACC, OUT]):
    """An accumulator per key, fed by ``add`` and read through ``get_result``."""

    aggregate_function: AggregateFunction[IN, ACC, OUT] = dataclasses.field(kw_only=True)
    kind = StateKind.AGGREGATING


@dataclasses.dataclass(eq=False)
class MapStateDescriptor(StateDescriptor):
    """A map per key; with TTL each entry expires on its own."""

    key_serializer: Serializer = dataclasses.field(default=DEFAULT_SERIALIZER, kw_only=True)
    kind = StateKind.MAP

    def serializer_ids(self) -> dict[str, str]:
        return {"value": self.serializer.id, "user_key": self.key_serializer.id}

    def value_schemas(self) -> dict[str, ValueType]:
        schemas = super().value_schemas()
        key_schema = _schema(self.key_serializer)
        if key_schema is not None:
            schemas["user_key"] = key_schema
        return schemas


def _schema(serializer: Serializer) -> ValueType | None:
    """The schema ``serializer`` declares for its values (a TypedSerializer with a type)."""
    schema = getattr(serializer, "schema", None)
    return schema if isinstance(schema, ValueType) else None

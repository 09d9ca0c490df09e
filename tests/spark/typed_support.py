"""The functions of tests/spark/test_spark_typed_state.py, in a module the executors import
(a test module is imported by pytest under a name they do not know): a word count whose value
is a dataclass in a TypedSerializer ValueState, in three versions of the dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from statetier.backend import TypedSerializer, ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext


@dataclasses.dataclass
class Tally:
    """The first deployment's value."""

    count: int


@dataclasses.dataclass
class TallyWider:
    """The next deployment's: ``count`` widened to float, ``origin`` added with a default."""

    count: float
    origin: str = "before"


@dataclasses.dataclass
class TallyRefused:
    """A change stored values do not survive: ``count`` becomes a str."""

    count: str


def counting(value_type: type, make: Callable[[Any], Any]) -> type:
    """A function counting each word in a ``value_type`` value: ``make(old)`` is the next."""

    class Count(KeyedProcessFunction[str, None, tuple[Any, ...]]):
        def open(self, context: RuntimeContext) -> None:
            descriptor = ValueStateDescriptor[Any]("tally", serializer=TypedSerializer(value_type))
            self.tally = context.get_state(descriptor)

        def process(self, key: str, value: None, context: RuntimeContext) -> Any:
            tally = make(self.tally.value())
            self.tally.update(tally)
            return [(key, *dataclasses.astuple(tally))]

    return Count


def first(old: Tally | None) -> Tally:
    return Tally((old.count if old else 0) + 1)


def wider(old: TallyWider | None) -> TallyWider:
    if old is None:
        return TallyWider(1.0, "after")
    assert isinstance(old.count, float), "an old int read in the new shape is a float"
    return TallyWider(old.count + 1, old.origin)


def refused(old: TallyRefused | None) -> TallyRefused:
    return TallyRefused("never")

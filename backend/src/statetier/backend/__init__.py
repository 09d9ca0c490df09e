"""statetier.backend: Flink-grade keyed state for Python, in heap, spill and checkpoint tiers.

This package exports what a user writes against, and nothing else (``__all__``; the test
``tests/test_public_api.py`` holds it to that list):

- functions: :class:`KeyedProcessFunction`, :class:`CheckpointListener`,
  :class:`CheckpointedFunction` and its contexts, :class:`AggregateFunction`;
- their context: :class:`RuntimeContext` and its timers (:class:`TimerService`,
  :class:`TimeDomain`);
- state: descriptors, handles, time-to-live settings, serializers, the errors state use raises;
- :class:`LocalRunner`, which runs a function in one process, and the configuration
  (:func:`load_config`).

Two more modules are public: :mod:`statetier.backend.spark` (the pipeline on Spark) and
:mod:`statetier.backend.testing` (a manual clock and a test harness for functions). Every other
module is the runtime's: importable by its path for statetier's own components and tools, not
an API (docs/architecture.md, "Public API").
"""

from typing import TYPE_CHECKING, Any

from statetier.backend.config import ConfigError, StatetierConfig, load_config
from statetier.backend.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from statetier.backend.functions import (
    CheckpointListener,
    KeyedProcessFunction,
    RuntimeContext,
    TimeDomain,
)
from statetier.backend.keyed_backend import StateRegistrationError
from statetier.backend.keygroups import NullKeyError
from statetier.backend.operator_state import (
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
)
from statetier.backend.serializers import (
    MsgpackSerializer,
    PickleSerializer,
    RawBytesSerializer,
    SerializationError,
    Serializer,
    register_serializer,
)
from statetier.backend.state import (
    AggregatingState,
    KeyBatch,
    ListState,
    MapState,
    ReducingState,
    State,
    ValueState,
)
from statetier.backend.state.context import NoCurrentKeyError
from statetier.backend.timers import TimerService
from statetier.backend.ttl import StateTtlConfig, StateVisibility, TtlMismatchError, UpdateType
from statetier.backend.typed.schema import SchemaField, ValueType, record_type
from statetier.backend.typed.serializer import TypedSerializer

if TYPE_CHECKING:
    from statetier.backend.local_runner import LocalRunner

__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "CheckpointListener",
    "CheckpointedFunction",
    "ConfigError",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "KeyBatch",
    "KeyedProcessFunction",
    "ListState",
    "ListStateDescriptor",
    "LocalRunner",
    "MapState",
    "MapStateDescriptor",
    "MsgpackSerializer",
    "NoCurrentKeyError",
    "NullKeyError",
    "PickleSerializer",
    "RawBytesSerializer",
    "ReducingState",
    "ReducingStateDescriptor",
    "RuntimeContext",
    "SchemaField",
    "SerializationError",
    "Serializer",
    "State",
    "StateDescriptor",
    "StateRegistrationError",
    "StateTtlConfig",
    "StateVisibility",
    "StatetierConfig",
    "TimeDomain",
    "TimerService",
    "TtlMismatchError",
    "TypedSerializer",
    "UpdateType",
    "ValueState",
    "ValueStateDescriptor",
    "ValueType",
    "load_config",
    "record_type",
    "register_serializer",
]


def __getattr__(name: str) -> Any:
    """``LocalRunner`` on first use: it brings the checkpoint tier (fsspec), which the
    components that only read the settings schema (the operator) do not need."""
    if name == "LocalRunner":
        from statetier.backend.local_runner import LocalRunner

        return LocalRunner
    raise AttributeError(f"module 'statetier.backend' has no attribute {name!r}")

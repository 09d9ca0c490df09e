"""statetier.backend: Flink-grade keyed state for Python, in heap, spill and checkpoint tiers.

The public surface is re-exported here; modules beside it hold one concept each:

- :mod:`~statetier.backend.keygroups`: key -> key group -> operator, as in Flink and Spark SQL.
- :mod:`~statetier.backend.descriptors` and :mod:`~statetier.backend.state`: what users declare
  and the handles they get.
- :mod:`~statetier.backend.keyed_backend`: the state of one key-group range and the current key.
- :mod:`~statetier.backend.operator_state`: non-keyed list state and its redistribution.
- :mod:`~statetier.backend.ttl`: time-to-live settings and clocks.
- :mod:`~statetier.backend.snapshot`: files, manifests and restore at any parallelism.
- :mod:`~statetier.backend.config`: the one configuration schema.
"""

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
from statetier.backend.keyed_backend import (
    KeyedStateBackend,
    KeyGroupOutOfRangeError,
    StateRegistrationError,
)
from statetier.backend.keygroups import (
    KeyGroupRange,
    NullKeyError,
    assign_to_key_group,
    compute_default_max_parallelism,
    key_group_range_for_operator,
    operator_index_for_key_group,
    spark_key_group_expr,
)
from statetier.backend.operator_state import (
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    OperatorStateBackend,
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
    ListState,
    MapState,
    ReducingState,
    State,
    ValueState,
)
from statetier.backend.state.context import NoCurrentKeyError
from statetier.backend.ttl import (
    ManualClock,
    StateTtlConfig,
    StateVisibility,
    SystemClock,
    TtlMismatchError,
    UpdateType,
)

__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "CheckpointedFunction",
    "ConfigError",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "KeyGroupOutOfRangeError",
    "KeyGroupRange",
    "KeyedStateBackend",
    "ListState",
    "ListStateDescriptor",
    "ManualClock",
    "MapState",
    "MapStateDescriptor",
    "MsgpackSerializer",
    "NoCurrentKeyError",
    "NullKeyError",
    "OperatorStateBackend",
    "PickleSerializer",
    "RawBytesSerializer",
    "ReducingState",
    "ReducingStateDescriptor",
    "SerializationError",
    "Serializer",
    "State",
    "StateDescriptor",
    "StateRegistrationError",
    "StateTtlConfig",
    "StateVisibility",
    "StatetierConfig",
    "SystemClock",
    "TtlMismatchError",
    "UpdateType",
    "ValueState",
    "ValueStateDescriptor",
    "assign_to_key_group",
    "compute_default_max_parallelism",
    "key_group_range_for_operator",
    "load_config",
    "operator_index_for_key_group",
    "register_serializer",
    "spark_key_group_expr",
]

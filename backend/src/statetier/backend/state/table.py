"""A state table: all key groups of one registered state in one backend.

As in Flink's heap backend (StateTable -> StateMap), the table holds one mapping per key group of
the backend's range, key -> stored value. Per-key-group mappings are what lets the spill tier move
a key group to disk, and checkpoints write and restore a key group, on its own.

``maps`` has one extra slot at the end: a mapping that raises NoCurrentKeyError. The key context
starts at index -1, so using state before a key is set fails clearly at no cost per access.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, MutableMapping
from itertools import islice
from typing import Any, NoReturn

from statetier.backend.descriptors import StateDescriptor
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.state.codec import StateCodec
from statetier.backend.state.context import NoCurrentKeyError

SIZE_SAMPLE = 16  # entries measured per key group for its size estimate


class _NoCurrentKey(dict[Any, Any]):
    """The sentinel mapping in the last slot: every use means no key was set."""

    def _fail(self, *_: Any, **__: Any) -> NoReturn:
        raise NoCurrentKeyError(
            "keyed state accessed without a current key: call set_current_key(key) first "
            "(the runtime does this before each record)"
        )

    get = __getitem__ = __setitem__ = __delitem__ = pop = setdefault = __contains__ = _fail


class StateTable:
    """One state's per-key-group mappings, its descriptor and its codec."""

    def __init__(self, descriptor: StateDescriptor, key_groups: KeyGroupRange) -> None:
        self.descriptor = descriptor
        self.key_groups = key_groups
        self.codec = StateCodec(descriptor)
        self.maps: list[MutableMapping[Any, Any]] = [{} for _ in key_groups]
        self.maps.append(_NoCurrentKey())

    @property
    def name(self) -> str:
        return self.descriptor.name

    def slot(self, key_group: int) -> int:
        return key_group - self.key_groups.start

    def map_for(self, key_group: int) -> MutableMapping[Any, Any]:
        """The mapping of ``key_group`` (which must be in the table's range)."""
        if key_group not in self.key_groups:
            raise KeyError(f"key group {key_group} is outside {self.key_groups}")
        return self.maps[self.slot(key_group)]

    def entries(self, key_group: int) -> Iterator[tuple[Any, Any]]:
        return iter(list(self.map_for(key_group).items()))

    def keys(self) -> Iterator[Any]:
        for slot in range(len(self.key_groups)):
            yield from list(self.maps[slot].keys())

    def entry_count(self) -> int:
        return sum(len(self.maps[slot]) for slot in range(len(self.key_groups)))

    def estimate_size(self, key_group: int) -> int:
        """Approximate heap bytes of one key group: entry count x a sampled entry size."""
        kg_map = self.map_for(key_group)
        count = len(kg_map)
        if not count:
            return 0
        sample = list(islice(kg_map.items(), SIZE_SAMPLE))
        sampled = sum(deep_sizeof(k) + deep_sizeof(v) for k, v in sample)
        # dict slot overhead: about 3 words per entry plus the load-factor slack
        return count * (sampled // len(sample) + 40)


def deep_sizeof(value: Any, _depth: int = 0) -> int:
    """Bytes of ``value`` and what it holds, for the common containers; bounded depth."""
    size = sys.getsizeof(value)
    if _depth > 4:
        return size
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(islice(value, SIZE_SAMPLE))
        if items:
            size += len(value) * sum(deep_sizeof(v, _depth + 1) for v in items) // len(items)
    elif isinstance(value, dict):
        pairs = list(islice(value.items(), SIZE_SAMPLE))
        if pairs:
            per = sum(deep_sizeof(k, _depth + 1) + deep_sizeof(v, _depth + 1) for k, v in pairs)
            size += len(value) * per // len(pairs)
    return size

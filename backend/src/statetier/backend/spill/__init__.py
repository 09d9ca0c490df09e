"""The spill tier: cold key groups move from the heap to mmap'd files on local SSD, and back.

FLIP-50's spillable heap backend, in Python. State lives on the heap as Python objects for speed;
when memory or gen-2 GC pressure rises, the monitor asks for a spill, the policy picks large and
cold key groups, and the manager swaps their per-key-group dicts for :class:`SpilledMap` objects
that keep the same entries serialized in mmap'd chunk files. When pressure falls, hot small key
groups come back. One concept per module:

- :mod:`.accounting` sizes and request rates per key group,
- :mod:`.monitor` budget, RSS and GC pauses -> spill/load verdicts with hysteresis,
- :mod:`.policy` which key groups (weighted score of size and rate),
- :mod:`.decision` a chosen move and its record,
- :mod:`.governor` one per process: weighs every backend's key groups and chooses the moves,
- :mod:`.storage` chunk files, space allocator, compaction,
- :mod:`.spilled_map` the layout of a spilled key group, with copy-on-write versions,
- :mod:`.lifecycle` owner identity of files, stale-file removal, clean exit,
- :mod:`.metrics` Prometheus metrics,
- :mod:`.manager` the one object that ties them to a backend.

See docs/spill.md.
"""

from statetier.backend.process_memory import resolve_budget
from statetier.backend.spill.decision import Decision
from statetier.backend.spill.manager import SpillManager
from statetier.backend.spill.monitor import MemoryMonitor, MonitorSettings
from statetier.backend.spill.spilled_map import FrozenView, SpilledMap
from statetier.backend.spill.storage import SpaceUnavailableError, SpillStorage, default_spill_dirs

__all__ = [
    "Decision",
    "FrozenView",
    "MemoryMonitor",
    "MonitorSettings",
    "SpaceUnavailableError",
    "SpillManager",
    "SpillStorage",
    "SpilledMap",
    "default_spill_dirs",
    "resolve_budget",
]

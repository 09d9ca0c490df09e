"""Routing a process's records to its function instances, by the key group of each key.

A record goes to the instance whose range holds its key's key group. The router remembers each
key's *route* (the instance, and the key's slot in that instance's range) until a checkpoint
drains the instances' change logs, as each backend's change log remembers its key's slot: a key
is hashed once for all the epochs in between.

While every instance makes a key current plainly (``KeyedStateBackend.plain_change_log``: no
spill counting, no per-record hooks), the router makes it current itself, in one pass over the
records in their order: a key enters the memo only once it is in its instance's change log, so
a remembered key needs two stores (``context.index``, ``context.key``) and its record goes
straight to the function. Partitioning first, then letting each instance look the key up in its
change log, cost a second dict lookup and a list append per record (``bench timers``' sessions on
the LocalRunner: 23,781 instructions per click that way, 23,405 in one pass). Otherwise the
records are partitioned per instance, and each instance makes their keys current through
``set_current_key``, which counts them or runs the hooks.

The memo must never hold a key its instance has not logged: an incremental checkpoint writes
only logged keys. So it is dropped when a change log was drained (a checkpoint, a restore:
``KeyContext.drains`` moved), when partitioned records were not all processed (a function
raised), and after a call that leaves it above ``ROUTE_MEMO_KEYS`` (a memo of every key would
keep the keys of spilled key groups in memory, outside the budget: the spill governor's
eight-ranges test measured 30 MB past it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from statetier.backend.keygroups import (
    assign_str_to_key_group,
    assign_to_key_group,
    check_key,
    instance_for_key_group,
    raise_if_unhashable,
    unhashable_key_error,
)
from statetier.backend.runtime import FunctionInstance

__all__ = ["ROUTE_MEMO_KEYS", "KeyRouter"]

# Keys whose route the router remembers between checkpoints: enough for the hot keys of a
# local run, little memory (a few MB) where its keys are many and spilled.
ROUTE_MEMO_KEYS = 1 << 17
# a route is ``instance << _SLOT_BITS | slot``: a slot is below the max parallelism (2**15)
_SLOT_BITS = 16
_SLOT_MASK = (1 << _SLOT_BITS) - 1


class KeyRouter:
    """Hands records to the ``instances`` of one process (instance ``i`` of
    ``len(instances)``, under ``max_parallelism`` key groups) and remembers each key's route."""

    def __init__(self, instances: list[FunctionInstance], max_parallelism: int) -> None:
        self._instances = instances
        self._max_parallelism = max_parallelism
        parallelism = len(instances)
        self._owners = [  # the instance of each key group
            instance_for_key_group(max_parallelism, parallelism, key_group)
            for key_group in range(max_parallelism)
        ]
        self._starts = [instance.keyed.key_groups.start for instance in instances]
        self._memo: dict[Any, int] = {}
        self._drains = self._drain_count()

    def forget(self) -> None:
        """Drop the memo: the change logs are about to be drained (a checkpoint)."""
        self._memo = {}

    def process(self, records: Iterable[tuple[Any, Any]]) -> list[Any]:
        """Run each instance's function over its records; their output (in the records' order
        while keys are made current plainly, else instance by instance)."""
        drains = self._drain_count()
        if drains != self._drains:  # a change log was drained: its keys are no longer logged
            self._memo = {}
            self._drains = drains
        out: list[Any] = []
        rest = iter(records)
        if not self._process_plain(rest, out):
            try:
                for instance, part in zip(self._instances, self._partition(rest), strict=True):
                    out.extend(instance.process(part))
            except BaseException:
                self._memo = {}  # the keys of records not processed were never logged
                raise
        if len(self._memo) > ROUTE_MEMO_KEYS:  # as the memo of one call was, no longer
            self._memo = {}
        return out

    def _partition(self, records: Iterable[tuple[Any, Any]]) -> list[list[tuple[Any, Any]]]:
        """Records per instance, by the owner of each record's key group, for the instances to
        process at once (they log the keys as they make them current: see :meth:`process`)."""
        parts: list[list[tuple[Any, Any]]] = [[] for _ in self._instances]
        memo = self._memo
        for record in records:
            key = record[0]
            try:
                route = memo.get(key)
            except TypeError:
                raise unhashable_key_error(key) from None
            if route is None:
                route = memo[key] = self._route_of(key)
            parts[route >> _SLOT_BITS].append(record)
        return parts

    def _process_plain(self, records: Iterator[tuple[Any, Any]], out: list[Any]) -> bool:
        """The one pass (module docstring) over ``records``; False, with the records not yet
        processed left in the iterator, if an instance does not make keys current plainly, or
        once the function just called added a per-record hook (a state with TTL cleanup per
        record, made in ``process``)."""
        instances = self._instances
        logs = [log for i in instances if (log := i.keyed.plain_change_log()) is not None]
        if len(logs) < len(instances):  # one makes keys current through set_current_key
            return False
        key_contexts = [instance.keyed.context for instance in instances]
        functions = [instance.function.process for instance in instances]
        contexts = [instance.context for instance in instances]
        memo = self._memo
        key: Any = None
        try:  # around the loop, not in it: a try in the loop runs a bytecode per record
            for key, value in records:
                route = memo.get(key)
                if route is None:  # first seen since the last drain: hashed, logged, remembered
                    route = self._log(key, logs)
                # _SLOT_BITS and _SLOT_MASK written out: a global is a lookup per record
                index = route >> 16
                ctx = key_contexts[index]
                ctx.index = route & 0xFFFF
                ctx.key = key
                result = functions[index](key, value, contexts[index])
                if result:  # None, or an empty list or tuple: nothing to add (a generator is)
                    out.extend(result)
                if ctx.per_record_work:  # a hook was added: the rest need set_current_key
                    return False
        except TypeError:
            raise_if_unhashable(key)  # else the function's own error
            raise
        return True

    def _log(self, key: Any, logs: list[dict[Any, int]]) -> int:
        """``key``'s route, with the key logged in its instance's change log, then remembered."""
        route = self._route_of(key)
        logs[route >> _SLOT_BITS][key] = route & _SLOT_MASK
        self._memo[key] = route
        return route

    def _route_of(self, key: Any) -> int:
        """``key``'s route, hashed (a key of a type keys cannot have is refused)."""
        if type(key) is str:  # most keys: hashed without assign_to_key_group's checks
            key_group = assign_str_to_key_group(key, self._max_parallelism)
        else:
            check_key(key)
            key_group = assign_to_key_group(key, self._max_parallelism)
        index = self._owners[key_group]
        return index << _SLOT_BITS | key_group - self._starts[index]

    def _drain_count(self) -> int:
        """How many times the instances' change logs were drained, all told (only grows)."""
        return sum(instance.keyed.context.drains for instance in self._instances)

"""The spill manager: moves whole key groups of one backend between heap and the spill tier.

This is the one place that touches the backend: a key group is spilled by replacing, in every
state table, its slot ``table.maps[slot]`` (a dict) with a :class:`SpilledMap` holding the same
entries, and loaded by the reverse. Handles look the slot up on every access, so they follow the
move without knowing about it; snapshots iterate ``map_for(kg).items()`` and read spilled key
groups through the same interface. A key group's state is on heap or on disk, never both.

The backend counts one hit per record for its key group (``count_hits``: one list increment on
the per-record path, no call), and at every 64th record of a key group the manager asks the
process's :class:`~statetier.backend.spill.governor.MemoryGovernor` whether a check is due (the
check interval has passed, or a full GC just happened). The governor weighs every backend of the
process; this manager keeps the accounting of its own key groups and carries out the moves the
governor chose for them, each said in one log line and the metrics. Moves happen on the thread
that holds the backend (``in_use``), between records, so no handle is ever mid-access.

I/O failures (disk full, unwritable dir) never lose state: a spill that cannot get space is
abandoned before any slot is swapped, and a write to a spilled key group that needs space it
cannot get first moves the key group back to heap, then writes there.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from statetier.backend import metrics as backend_metrics
from statetier.backend.config import StatetierConfig
from statetier.backend.descriptors import StateKind
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.serializers import MsgpackSerializer, SerializationError
from statetier.backend.spill import metrics
from statetier.backend.spill.accounting import KeyGroupAccounting
from statetier.backend.spill.decision import Decision, Order
from statetier.backend.spill.governor import MemoryGovernor
from statetier.backend.spill.monitor import MemoryMonitor, Move, Trigger
from statetier.backend.spill.policy import Candidate
from statetier.backend.spill.spilled_map import MapCodec, SpilledMap
from statetier.backend.spill.storage import (
    SpaceUnavailableError,
    SpillStorage,
    default_spill_dirs,
)
from statetier.backend.state.table import StateTable

__all__ = ["SpillManager"]

log = logging.getLogger("statetier.spill")


def _codec_functions(table: StateTable) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """Encode/decode of a table's stored values, without a per-call dispatch where possible.

    For value-like states without TTL the stored value *is* the user value, and StateCodec
    encodes it with the descriptor's serializer: use that directly on the per-record path (for
    the default serializer, its packer itself; see
    :meth:`~statetier.backend.serializers.MsgpackSerializer.direct_codec`). One packer per
    table of a backend is safe: a backend's state is used by one thread at a time (its key
    context is shared by every handle).
    """
    descriptor = table.descriptor
    if descriptor.ttl is None and descriptor.kind in (
        StateKind.VALUE,
        StateKind.REDUCING,
        StateKind.AGGREGATING,
    ):
        serializer = descriptor.serializer
        if type(serializer) is MsgpackSerializer:
            return serializer.direct_codec()
        return serializer.dumps, serializer.loads
    return table.codec.encode, table.codec.decode


def _mib(value: float) -> str:
    return f"{value / (1 << 20):.1f}MiB"


class SpillManager:
    """Spills and loads the key groups of ``backend``, as the process's governor decides.

    ``governor``: the process's (see :meth:`from_config`); without one, the manager has a
    governor of its own over ``storage`` and ``monitor`` (``monitor`` None: manual moves only).
    ``in_use`` is held by whoever uses the backend (the runtime), so that the governor moves its
    key groups only between uses.
    """

    def __init__(
        self,
        backend: KeyedStateBackend,
        storage: SpillStorage | None = None,
        monitor: MemoryMonitor | None = None,
        *,
        size_weight: float = 0.5,
        governor: MemoryGovernor | None = None,
        in_use: threading.RLock | None = None,
    ) -> None:
        if governor is None:
            if storage is None:
                raise ValueError("a spill manager needs a governor or a storage")
            governor = MemoryGovernor(storage, monitor, size_weight=size_weight)
        self.governor = governor
        self.backend = backend
        self.storage = governor.storage
        self.monitor = governor.monitor
        self.in_use: threading.RLock = in_use if in_use is not None else threading.RLock()
        self._first = backend.key_groups.start
        self.accounting = KeyGroupAccounting(len(backend.key_groups), time.monotonic())
        self.spilled: dict[int, dict[str, SpilledMap]] = {}  # slot -> state name -> map
        self.decisions: collections.deque[Decision] = collections.deque(maxlen=1000)
        self.spill_failures = 0
        self._sampled: dict[int, tuple[int, float]] = {}  # slot -> (entries, bytes per entry)
        self._reported = {"heap": 0, "spilled": 0, "disk": 0, "kg_heap": 0, "kg_disk": 0}
        self._failure_logged: set[str] = set()
        # moves the governor chose while another thread held this backend (done at next poll)
        self._posted: list[Order] = []
        self._posted_slots: set[int] = set()
        # records counted so far, and those whose key group was on disk when they came
        self.records_counted = 0
        self.records_on_disk = 0
        self._tallied = [0] * len(backend.key_groups)  # hits already in the two figures
        self._codecs: dict[str, tuple[StateTable, MapCodec]] = {}
        self.closed = False
        backend.count_hits(self.accounting.hits, self.poll)
        governor.register(self)
        self._update_metrics()

    @property
    def size_weight(self) -> float:
        return self.governor.size_weight

    @classmethod
    def from_config(
        cls,
        backend: KeyedStateBackend,
        config: StatetierConfig,
        in_use: threading.RLock | None = None,
    ) -> SpillManager:
        """A manager under the process's governor for these settings. It starts no metrics
        endpoint: the process's entry point does (``serve_metrics``)."""
        governor = MemoryGovernor.for_config(config)
        backend_metrics.watch_spill_dirs(list(config.spill_dirs) or default_spill_dirs())
        return cls(backend, governor=governor, in_use=in_use)

    def _codec(self, table: StateTable) -> MapCodec:
        """A table's key and value encode/decode, made once per table: every spilled map of the
        table shares them (a packer holds a buffer of its own)."""
        known = self._codecs.get(table.name)
        if known is None or known[0] is not table:
            keys = self.backend.key_serializer
            known = (table, MapCodec(keys.dumps, keys.loads, *_codec_functions(table)))
            self._codecs[table.name] = known
        return known[1]

    # ------------------------------------------------------------------ per record

    def poll(self) -> None:
        """On the thread that holds the backend, between records (the backend calls it every
        64th record of a key group; a runtime also after a batch): carry out posted moves, and
        run the process's check when it is due."""
        if self._posted:
            self._apply_posted()
        if self.governor.due():
            self.governor.check(self)

    def settle(self) -> None:
        """:meth:`poll` and a check, whether due or not, when the backend's user is done with it
        for a while (the Spark host, once per range and epoch, after the range's snapshot).
        Checks otherwise run when due at a poll during processing, and may all fall before the
        epoch's last records (the ranges of an epoch processed at once, in a short epoch); this
        one sees the range's whole epoch."""
        if self._posted:
            self._apply_posted()
        self.governor.check(self, wait=True)

    # ------------------------------------------------------------------ tiers

    def is_spilled(self, key_group: int) -> bool:
        return key_group - self._first in self.spilled

    def tier(self, key_group: int) -> str:
        return "disk" if self.is_spilled(key_group) else "heap"

    def spilled_key_groups(self) -> list[int]:
        return sorted(self._first + slot for slot in self.spilled)

    def _slot(self, key_group: int) -> int:
        if key_group not in self.backend.key_groups:
            raise KeyError(f"key group {key_group} is outside {self.backend.key_groups}")
        return key_group - self._first

    def _tally(self) -> None:
        """Credit the records counted since the last tally to the tier of their key group.

        Done before every move and fold, so each record is credited to the tier its key group
        was in when the record came: the share of records served from disk.
        """
        hits, tallied, spilled = self.accounting.hits, self._tallied, self.spilled
        for slot in range(self.accounting.slots):
            new = hits[slot] - tallied[slot]
            if new:
                self.records_counted += new
                if slot in spilled:
                    self.records_on_disk += new
                tallied[slot] = hits[slot]

    def spill_key_group(self, key_group: int, trigger: Trigger = Trigger.FORCED) -> bool:
        """Move ``key_group`` (all its states) to disk; False if no space (it stays on heap)."""
        if self.closed:
            raise RuntimeError("the spill manager is closed")
        slot = self._slot(key_group)
        if slot in self.spilled:
            return True
        self._tally()
        started = time.perf_counter()
        backend = self.backend
        heap_bytes = backend.estimate_size(key_group)
        maps: dict[str, SpilledMap] = {}
        try:
            for name, table in backend.tables.items():
                maps[name] = SpilledMap(
                    self.storage,
                    self._codec(table),
                    table.maps[slot].items(),
                    fallback=functools.partial(self._evacuate, slot, name),
                )
        except SpaceUnavailableError as exc:
            for spilled in maps.values():
                spilled.release()
            self._spill_failed(key_group, exc)
            return False
        except SerializationError as exc:
            # the heap holds a value the state's serializer cannot write: it stays there
            for spilled in maps.values():
                spilled.release()
            log.warning("spill: key group %d stays on heap: %s", key_group, exc)
            return False
        for name, spilled in maps.items():
            backend.tables[name].maps[slot] = spilled
        self.spilled[slot] = maps
        self.accounting.record_spill(slot, heap_bytes, sum(m.live_bytes for m in maps.values()))
        metrics.SPILLS.labels(trigger.value).inc()
        metrics.SPILL_SECONDS.observe(time.perf_counter() - started)
        return True

    def load_key_group(self, key_group: int, trigger: Trigger = Trigger.FORCED) -> bool:
        """Move ``key_group`` back to heap; False if it was not spilled."""
        slot = self._slot(key_group)
        if slot not in self.spilled:
            return False
        self._tally()
        maps = self.spilled.pop(slot)
        started = time.perf_counter()
        for name, spilled in maps.items():
            self.backend.tables[name].maps[slot] = dict(spilled.iter_items())
            spilled.release()
        self.accounting.record_load(slot, self.backend.estimate_size(key_group))
        metrics.LOADS.labels(trigger.value).inc()
        metrics.LOAD_SECONDS.observe(time.perf_counter() - started)
        return True

    def _evacuate(self, slot: int, name: str, exc: Exception) -> MutableMapping[Any, Any]:
        """A write to a spilled key group failed (no space, or a value the serializer cannot
        write): bring the key group back to heap to take the write."""
        key_group = self._first + slot
        if isinstance(exc, OSError):
            self._spill_failed(key_group, exc)
        self.load_key_group(
            key_group, Trigger.DISK_FULL if isinstance(exc, OSError) else Trigger.ERROR
        )
        log.warning("spill: key group %d moved back to heap: %s", key_group, exc)
        return self.backend.tables[name].maps[slot]

    def _spill_failed(self, key_group: int, exc: OSError) -> None:
        reason = errno.errorcode.get(exc.errno or 0, "EIO")
        self.spill_failures += 1
        metrics.SPILL_ERRORS.labels(reason).inc()
        if reason not in self._failure_logged:
            self._failure_logged.add(reason)
            log.error(
                "spill: key group %d stays on heap: %s (logged once per error kind; counted in "
                "statetier_spill_errors_total)",
                key_group,
                exc,
            )

    def _sync_tables(self) -> None:
        """States registered after a key group was spilled follow it to disk."""
        for slot, maps in list(self.spilled.items()):
            if len(maps) == len(self.backend.tables):
                continue
            key_group = self._first + slot
            for name, table in self.backend.tables.items():
                if name in maps:
                    continue
                try:
                    spilled = SpilledMap(
                        self.storage,
                        self._codec(table),
                        table.maps[slot].items(),
                        fallback=functools.partial(self._evacuate, slot, name),
                    )
                except (SpaceUnavailableError, SerializationError) as exc:
                    if isinstance(exc, OSError):
                        self._spill_failed(key_group, exc)
                    self.load_key_group(key_group, Trigger.ERROR)
                    break
                table.maps[slot] = spilled
                maps[name] = spilled

    # ------------------------------------------------------------------ the check

    def refresh_accounting(self) -> None:
        """Fold hits into rates, refresh heap sizes, re-read exact spilled sizes.

        A heap size is entry count x bytes per entry; the count is read every time (``len``),
        the bytes per entry are re-sampled only when the count moved by a quarter since the last
        sample: sampling every key group at every check would cost more than the check.
        """
        acc = self.accounting
        self._tally()
        acc.fold(time.monotonic())
        self._tallied = [0] * acc.slots
        backend = self.backend
        tables = list(backend.tables.values())
        sampled = self._sampled
        for slot in range(acc.slots):
            maps = self.spilled.get(slot)
            if maps is None:
                count = sum(len(table.maps[slot]) for table in tables)
                then, per_entry = sampled.get(slot, (0, 0.0))
                if not count or abs(count - then) * 4 > then:
                    size = backend.estimate_size(self._first + slot)
                    sampled[slot] = (count, size / count if count else 0.0)
                    acc.heap_bytes[slot] = size
                else:
                    acc.heap_bytes[slot] = int(count * per_entry)
            else:
                sampled.pop(slot, None)
                acc.spilled_bytes[slot] = sum(m.live_bytes for m in maps.values())
        self._update_metrics()

    def check(self) -> Decision | None:
        """Run the process's check now (from the thread that holds this backend); this
        backend's move, if it made one."""
        if self.closed:
            return None
        decisions = self.governor.check(self)
        return decisions[0] if decisions and decisions[0].manager is self else None

    def prepare_check(self) -> None:
        """Before the governor weighs this backend (the caller holds it): catch up."""
        if self._posted:
            self._apply_posted()
        self._sync_tables()
        self.refresh_accounting()

    def candidates(self, spill: bool, owner: int) -> list[Candidate]:
        """This backend's key groups the governor may move: those on heap for a spill, those on
        disk for a load (none with a move already posted)."""
        acc, first, posted = self.accounting, self._first, self._posted_slots
        if spill:
            return [
                Candidate(first + slot, acc.heap_bytes[slot], acc.rates[slot], owner)
                for slot in range(acc.slots)
                if slot not in self.spilled and slot not in posted
            ]
        return [
            Candidate(first + slot, acc.heap_if_loaded(slot), acc.rates[slot], owner)
            for slot in self.spilled
            if slot not in posted
        ]

    def post(self, order: Order) -> None:
        """A move chosen while another thread uses this backend: done at its next poll. The
        monitor counts it now, so the next check does not choose the same bytes again."""
        self._posted.append(order)
        self._posted_slots.update(c.key_group - self._first for c, _ in order.choice)
        self._note(order.action, sum(c.size for c, _ in order.choice))

    def pending_heap(self) -> int:
        """Heap bytes that posted moves will free (spills) less those they will take (loads)."""
        return sum(order.heap_bytes for order in self._posted)

    def _apply_posted(self) -> None:
        posted, self._posted = self._posted, []
        self._posted_slots = set()
        for order in posted:
            self.move(order, noted=True)

    def _note(self, action: Move, heap_bytes: int) -> None:
        monitor = self.governor.monitor
        if monitor is not None:
            if action is Move.SPILL:
                monitor.note_spill(heap_bytes)
            else:
                monitor.note_load(heap_bytes)

    def move(self, order: Order, *, noted: bool = False) -> Decision | None:
        """Carry out the governor's order for this backend (the caller holds it)."""
        if not order.choice or self.closed:
            return None
        spill = order.action is Move.SPILL
        started = time.perf_counter()
        moved, failed, scores, heap_bytes = [], [], [], 0
        for candidate, score in order.choice:
            ok = (
                self.spill_key_group(candidate.key_group, order.trigger)
                if spill
                else self.load_key_group(candidate.key_group, order.trigger)
            )
            if ok:
                moved.append(candidate.key_group)
                scores.append(round(score, 3))
                heap_bytes += candidate.size
            elif spill:
                failed.append(candidate.key_group)
                break  # no space now: the next ones would fail the same way
        seconds = time.perf_counter() - started
        if not noted:
            self._note(order.action, heap_bytes)
        decision = Decision(
            order.action, order.reason, moved, scores, heap_bytes, seconds, failed,
            trigger=order.trigger, manager=self,
        )  # fmt: skip
        self.decisions.append(decision)
        self._update_metrics()
        self._log(decision, {c.key_group: c for c, _ in order.choice})
        return decision

    def _log(self, decision: Decision, candidates: dict[int, Candidate]) -> None:
        spill = decision.action is Move.SPILL
        arrow = "heap -> disk" if spill else "disk -> heap"
        shown = ", ".join(
            f"{kg}(score={score:.2f} size={_mib(candidates[kg].size)} "
            f"rate={candidates[kg].rate:.1f}/s)"
            for kg, score in list(zip(decision.key_groups, decision.scores, strict=True))[:8]
        )
        more = len(decision.key_groups) - 8
        if more > 0:
            shown += f", ... {more} more"
        spilled = len(self.spilled)
        log.info(
            "spill: %s %d key groups %s [%s] because %s; %s ~%s heap in %.1f ms; "
            "key groups now heap=%d disk=%d%s",
            decision.action.value,
            len(decision.key_groups),
            arrow,
            shown,
            decision.reason,
            "freed" if spill else "took",
            _mib(decision.heap_bytes),
            decision.seconds * 1000,
            self.accounting.slots - spilled,
            spilled,
            f"; failed (no space): {decision.failed}" if decision.failed else "",
        )

    # ------------------------------------------------------------------ metrics and end

    def _update_metrics(self) -> None:
        acc = self.accounting
        now = {
            "heap": acc.total_heap(),
            "spilled": acc.total_spilled(),
            "disk": self.storage.disk_bytes(),
            "kg_disk": len(self.spilled),
            "kg_heap": acc.slots - len(self.spilled),
        }
        old = self._reported
        metrics.HEAP_BYTES.inc(now["heap"] - old["heap"])
        metrics.SPILLED_BYTES.inc(now["spilled"] - old["spilled"])
        metrics.SPILL_DISK_BYTES.inc(now["disk"] - old["disk"])
        metrics.KEY_GROUPS.labels("disk").inc(now["kg_disk"] - old["kg_disk"])
        metrics.KEY_GROUPS.labels("heap").inc(now["kg_heap"] - old["kg_heap"])
        self._reported = now

    def close(self, *, load_back: bool = True) -> None:
        """Stop managing: load spilled key groups back (unless the backend is being dropped),
        then free this backend's spill space and leave the governor (and its accounting)."""
        if self.closed:
            return
        with self.in_use:
            if load_back:
                for slot in list(self.spilled):
                    self.load_key_group(self._first + slot, Trigger.CLOSE)
            for maps in self.spilled.values():
                for spilled in maps.values():
                    spilled.release()
            self.closed = True
            self._posted, self._posted_slots = [], set()
            self.backend.count_hits(None)
            self.accounting.heap_bytes = [0] * self.accounting.slots
            self.accounting.spilled_bytes = [0] * self.accounting.slots
            self.spilled = {}
            self.accounting.slots = 0
            self._update_metrics()
        self.governor.unregister(self)

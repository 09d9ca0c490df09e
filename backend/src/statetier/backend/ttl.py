"""State time-to-live, with Flink's semantics.

A state with TTL stores each value (each list element, each map entry) together with the time it
was last written (or, with ``UpdateType.ON_READ_AND_WRITE``, also read). A value older than the
TTL is expired: it is hidden from reads (``NEVER_RETURN_EXPIRED``) or still returned until it is
cleaned up (``RETURN_EXPIRED_IF_NOT_CLEANED_UP``). Cleanup happens on read, incrementally (a few
entries per state access, optionally per record) and when a full snapshot is written.

Only processing time is supported, as in Flink. Time comes from a :class:`Clock` so tests can
move it by hand instead of sleeping.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any, Protocol

__all__ = [
    "Clock",
    "ManualClock",
    "StateTtlConfig",
    "StateVisibility",
    "SystemClock",
    "TtlMismatchError",
    "UpdateType",
]


class Clock(Protocol):
    """Processing time in milliseconds."""

    def now_ms(self) -> int: ...


class SystemClock:
    """The wall clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to; for tests and deterministic replays."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("time only moves forward")
        self._now += ms

    def set(self, now_ms: int) -> None:
        self._now = now_ms


class UpdateType(enum.Enum):
    """When a value's timestamp is renewed."""

    ON_CREATE_AND_WRITE = "OnCreateAndWrite"
    ON_READ_AND_WRITE = "OnReadAndWrite"


class StateVisibility(enum.Enum):
    """Whether an expired value that is still stored may be returned."""

    NEVER_RETURN_EXPIRED = "NeverReturnExpired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "ReturnExpiredIfNotCleanedUp"


class TtlMismatchError(ValueError):
    """A state is restored with TTL switched on or off relative to its checkpoint."""


@dataclasses.dataclass(frozen=True)
class StateTtlConfig:
    """TTL settings for one state descriptor.

    ``incremental_cleanup_size`` entries are checked for expiry on every access of the state
    (and on every record when ``cleanup_per_record``); 0 turns incremental cleanup off.
    ``cleanup_full_snapshot`` drops expired entries from full snapshots.
    ``cleanup_in_compaction`` drops them when compaction merges a chain into a new base, judged
    at the clock of the chain's epoch (Flink's ``cleanupInRocksdbCompactFilter``); off by
    default, like the snapshot cleanup, so a checkpoint keeps what the state holds unless asked.
    """

    ttl_ms: int
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED
    incremental_cleanup_size: int = 5
    cleanup_per_record: bool = False
    cleanup_full_snapshot: bool = False
    cleanup_in_compaction: bool = False

    def __post_init__(self) -> None:
        if self.ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be positive, got {self.ttl_ms}")
        if self.incremental_cleanup_size < 0:
            raise ValueError(
                f"incremental_cleanup_size must be >= 0, got {self.incremental_cleanup_size}"
            )

    @classmethod
    def of_seconds(cls, seconds: float, **options: Any) -> StateTtlConfig:
        return cls(ttl_ms=round(seconds * 1000), **options)

    def expired(self, timestamp_ms: int, now_ms: int) -> bool:
        """Whether a value last stamped at ``timestamp_ms`` has expired at ``now_ms``."""
        return timestamp_ms + self.ttl_ms <= now_ms

    def to_json(self) -> dict[str, Any]:
        """The settings a checkpoint records, for people and tools (a restore may change
        them: only switching TTL on or off is refused), and for compaction, which drops
        expired entries only when ``cleanup_in_compaction`` says so."""
        return {
            "ttl_ms": self.ttl_ms,
            "update_type": self.update_type.value,
            "visibility": self.visibility.value,
            "incremental_cleanup_size": self.incremental_cleanup_size,
            "cleanup_per_record": self.cleanup_per_record,
            "cleanup_full_snapshot": self.cleanup_full_snapshot,
            "cleanup_in_compaction": self.cleanup_in_compaction,
        }

    @classmethod
    def from_json(cls, recorded: dict[str, Any]) -> StateTtlConfig:
        """The settings :meth:`to_json` recorded; what older checkpoints did not record (the
        cleanup settings) takes its default. Raises ValueError or KeyError on bad input."""
        return cls(
            ttl_ms=recorded["ttl_ms"],
            update_type=UpdateType(
                recorded.get("update_type", UpdateType.ON_CREATE_AND_WRITE.value)
            ),
            visibility=StateVisibility(
                recorded.get("visibility", StateVisibility.NEVER_RETURN_EXPIRED.value)
            ),
            incremental_cleanup_size=recorded.get("incremental_cleanup_size", 5),
            cleanup_per_record=recorded.get("cleanup_per_record", False),
            cleanup_full_snapshot=recorded.get("cleanup_full_snapshot", False),
            cleanup_in_compaction=recorded.get("cleanup_in_compaction", False),
        )


def check_ttl_compatible(
    state_name: str, stored: dict[str, Any] | None, requested: StateTtlConfig | None
) -> None:
    """Refuse a restore that switches TTL on or off (names both settings).

    As in Flink, the TTL configuration "is not part of check- or savepoints": a restore may
    change the duration, the update type or the visibility, and the restored timestamps are
    judged by the new settings. Only switching TTL on or off is incompatible, because stored
    values carry timestamps only when TTL is on.
    """
    if (stored is None) != (requested is None):
        wanted = requested.to_json() if requested else None
        raise TtlMismatchError(
            f"state {state_name!r} was checkpointed with TTL {stored or 'disabled'} but is "
            f"registered with TTL {wanted or 'disabled'}; TTL cannot be switched on or off on "
            "restore (stored values carry timestamps only when TTL is on)"
        )

"""The options of the ``statetier`` and ``statetier-metadata`` data sources, read once.

Spark hands a data source its options as strings (keys in any case). They are parsed here into
one frozen dataclass, on the driver, before anything is read, so that a wrong one fails with a
line naming the option, the value given and what it takes, instead of deep in a task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from statetier.backend.config import ConfigError
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot.reading import StateReadError
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["ReadOptions", "StateOptionError", "open_store"]

STORAGE_PREFIX = "storage."  # storage.endpoint_url=... -> fsspec's endpoint_url
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no", "")


class StateOptionError(StateReadError):
    """An option of a state data source that cannot be used as given."""


def _bool(options: Mapping[str, str], name: str) -> bool:
    text = str(options.get(name.lower(), "false")).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise StateOptionError(f"option {name}={text!r}: give true or false")


def _int(options: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    text = options.get(name.lower())
    if text is None or str(text).strip() == "":
        return None
    try:
        value = int(str(text))
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise StateOptionError(f"option {name}={text!r}: give an integer >= {minimum}")
    return value


def _range(options: Mapping[str, str]) -> KeyGroupRange | None:
    text = options.get("key_groups")
    if text is None:
        return None
    start, dash, end = str(text).partition("-")
    try:
        found = KeyGroupRange(int(start), int(end if dash else start))
    except ValueError:
        found = KeyGroupRange(1, 0)
    if not len(found) or found.start < 0:
        raise StateOptionError(
            f"option key_groups={text!r}: give a range START-END of key groups (0-31), or one"
        )
    return found


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """What a read of state asks for (see docs/state-as-data.md, "Read")."""

    path: str
    state: str | None
    epoch: int | None
    include_expired: bool
    processing_time: int | None
    timers: bool
    operator_state: bool
    change_feed: bool
    change_start: int | None
    change_end: int | None
    key_groups: KeyGroupRange | None
    partitions: int | None
    key_format: str
    storage_options: dict[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, needs_state: bool = True) -> ReadOptions:
        options = {str(k).lower(): v for k, v in raw.items()}
        path = options.get("path")
        if not path:
            raise StateOptionError(
                'option path is missing: .option("path", CHECKPOINT_URI) (a job\'s '
                "checkpoint.uri or a savepoint's location)"
            )
        found = cls(
            path=str(path),
            state=options.get("state"),
            epoch=_int(options, "epoch", 1),
            include_expired=_bool(options, "include_expired"),
            processing_time=_int(options, "processing_time", -(1 << 62)),
            timers=_bool(options, "readRegisteredTimers"),
            operator_state=_bool(options, "operatorState"),
            change_feed=_bool(options, "readChangeFeed"),
            change_start=_int(options, "changeStartEpoch", 1),
            change_end=_int(options, "changeEndEpoch", 1),
            key_groups=_range(options),
            partitions=_int(options, "partitions", 1),
            key_format=str(options.get("key_format", "typed")).lower(),
            storage_options={
                k[len(STORAGE_PREFIX) :]: v
                for k, v in options.items()
                if k.startswith(STORAGE_PREFIX)
            },
        )
        found.check(needs_state)
        return found

    def check(self, needs_state: bool) -> None:
        if self.key_format not in ("typed", "json"):
            raise StateOptionError(f"option key_format={self.key_format!r}: give typed or json")
        if needs_state and not self.timers and not self.state:
            raise StateOptionError(
                'option state is missing: .option("state", NAME) (statetier-metadata lists '
                'the states), or .option("readRegisteredTimers", True) for timers'
            )
        if self.change_feed and self.change_start is None:
            raise StateOptionError(
                "option changeStartEpoch is missing: readChangeFeed reads the changes of "
                "epochs changeStartEpoch..changeEndEpoch (default: the latest)"
            )
        if self.change_feed and (self.timers or self.operator_state):
            raise StateOptionError(
                "readChangeFeed reads a keyed state's changes; leave out readRegisteredTimers "
                "and operatorState"
            )


def open_store(options: ReadOptions) -> SnapshotStore:
    """The store at ``options.path``, or a StateOptionError naming the URI and the fix."""
    try:
        return SnapshotStore(options.path, **options.storage_options)
    except (ConfigError, ValueError, ImportError, TypeError) as exc:
        raise StateOptionError(
            f"option path={options.path!r} is not a usable location ({exc}); give a checkpoint "
            "URI such as file:///abs/dir or s3://bucket/prefix"
        ) from None

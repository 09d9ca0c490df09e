"""Cron schedules with seconds, the six-field form CloudNativePG's ScheduledBackup takes.

``second minute hour day-of-month month day-of-week``; each field ``*``, a number, a range
``a-b``, a list ``a,b`` and steps ``*/n`` or ``a-b/n``; day-of-week 0-6 from Sunday (7 is
Sunday too). As in classic cron, when both day fields are restricted a day matching either one
matches. Times are UTC. Written here rather than taken from a library because the operator needs
only "the next time after t", and a schedule a user mistyped must fail with a message naming it.
"""

from __future__ import annotations

import dataclasses
import datetime

__all__ = ["Schedule", "parse"]

_FIELDS = (
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
)
_HORIZON = datetime.timedelta(days=366 * 5)


def _values(text: str, name: str, low: int, high: int) -> frozenset[int]:
    found: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if step_text and step is None:
            raise ValueError(f"{name} field {text!r}: step {step_text!r} is not a positive number")
        if span == "*":
            start, end = low, high
        elif "-" in span:
            a, _, b = span.partition("-")
            start, end = int(a), int(b)
        else:
            start = int(span)
            end = high if step else start
        if not low <= start <= end <= high:
            raise ValueError(f"{name} field {text!r}: values must be within {low}-{high}")
        found.update(range(start, end + 1, step or 1))
    return frozenset(found)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A parsed schedule: the allowed values of each field."""

    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    def _day_matches(self, moment: datetime.datetime) -> bool:
        day = moment.day in self.days
        weekday = (moment.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return day and weekday
        return day or weekday

    def next_after(self, moment: datetime.datetime) -> datetime.datetime:
        """The first matching second strictly after ``moment`` (aware, UTC)."""
        t = moment.astimezone(datetime.UTC).replace(microsecond=0) + datetime.timedelta(seconds=1)
        limit = t + _HORIZON
        while t < limit:
            if t.month not in self.months:
                t = (t.replace(day=1) + datetime.timedelta(days=32)).replace(
                    day=1, hour=0, minute=0, second=0
                )
            elif not self._day_matches(t):
                t = (t + datetime.timedelta(days=1)).replace(hour=0, minute=0, second=0)
            elif t.hour not in self.hours:
                t = (t + datetime.timedelta(hours=1)).replace(minute=0, second=0)
            elif t.minute not in self.minutes:
                t = (t + datetime.timedelta(minutes=1)).replace(second=0)
            elif t.second not in self.seconds:
                t += datetime.timedelta(seconds=1)
            else:
                return t
        raise ValueError("the schedule matches no time in the next five years")


def parse(text: str) -> Schedule:
    """Parse a six-field schedule; ValueError names the bad field and what it accepts."""
    parts = text.split()
    if len(parts) != 6:
        raise ValueError(
            f"schedule {text!r} has {len(parts)} fields, not 6: "
            "second minute hour day-of-month month day-of-week, e.g. '0 0 * * * *'"
        )
    try:
        sets = [_values(p, n, lo, hi) for p, (n, lo, hi) in zip(parts, _FIELDS, strict=True)]
    except ValueError as exc:
        if "field" in str(exc):
            raise ValueError(f"schedule {text!r}: {exc}") from None
        raise ValueError(f"schedule {text!r}: {exc}: use numbers, *, a-b, a,b, */n") from None
    weekdays = frozenset(d % 7 for d in sets[5])
    seconds, minutes, hours, days, months = sets[:5]
    any_day, any_weekday = parts[3] == "*", parts[5] == "*"
    return Schedule(seconds, minutes, hours, days, months, weekdays, any_day, any_weekday)

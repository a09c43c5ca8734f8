"""Timer schedules: 6-field NCRONTAB (seconds first) or a TimeSpan interval ``hh:mm:ss``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from croniter import croniter

from sas_local.devhost.config import DevHostError

_INTERVAL = re.compile(r"^(\d{1,2}):(\d{2}):(\d{2})$")


class Schedule(Protocol):
    def next_after(self, moment: datetime) -> datetime:
        """The first occurrence strictly after ``moment`` (tz-aware UTC)."""
        ...


@dataclass(frozen=True)
class CronSchedule:
    expression: str

    def next_after(self, moment: datetime) -> datetime:
        # croniter wants seconds as the 6th field; second_at_beginning reads NCRONTAB order.
        nxt: datetime = croniter(self.expression, moment, second_at_beginning=True).get_next(
            datetime
        )
        return nxt


@dataclass(frozen=True)
class IntervalSchedule:
    interval: timedelta

    def next_after(self, moment: datetime) -> datetime:
        return moment + self.interval


def parse_schedule(expression: str, function_name: str) -> Schedule:
    text = expression.strip()
    interval = _INTERVAL.match(text)
    if interval is not None:
        hours, minutes, seconds = (int(part) for part in interval.groups())
        span = timedelta(hours=hours, minutes=minutes, seconds=seconds)
        if span <= timedelta(0):
            raise DevHostError(f"function {function_name!r}: timer interval must be positive")
        return IntervalSchedule(span)
    fields = text.split()
    if len(fields) != 6:
        raise DevHostError(
            f"function {function_name!r}: schedule {expression!r} is not a 6-field NCRONTAB "
            "expression ('{second} {minute} {hour} {day} {month} {day-of-week}')"
        )
    if not croniter.is_valid(text, second_at_beginning=True):
        raise DevHostError(f"function {function_name!r}: invalid NCRONTAB schedule {expression!r}")
    return CronSchedule(text)

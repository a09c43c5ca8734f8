"""Time as an injected dependency: services never call datetime.now() themselves."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current time, timezone-aware UTC."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


def require_utc(value: datetime, name: str) -> datetime:
    """Reject naive datetimes: Table Storage would silently store them as UTC."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware")
    return value.astimezone(UTC)


DATE_RESOLUTION = 1.0
"""Seconds: an HTTP ``Date`` header is the server's time cut to the second."""


@dataclass(frozen=True)
class Offset:
    """Bounds of (the store's clock - this host's clock), in seconds."""

    low: float
    high: float

    @property
    def seconds(self) -> float:
        return (self.low + self.high) / 2

    @property
    def error(self) -> float:
        """How far the true offset may be from ``seconds``."""
        return (self.high - self.low) / 2


class ClockOffset:
    """This host's clock against the store's, narrowed from the ``Date`` of each response.

    The store stamped a response between the request's sending and its answer, to the second,
    so each response bounds the offset to an interval about a second and a round trip wide;
    the intersection of recent intervals narrows it to about a round trip. An empty
    intersection means a clock moved (stepped or drifted): the estimate starts again from
    the newest response."""

    KEEP = 64
    """Responses whose bounds are intersected: recent enough to follow a drifting clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bounds: deque[Offset] = deque(maxlen=self.KEEP)
        self._current: Offset | None = None

    @property
    def current(self) -> Offset | None:
        return self._current

    def observe(self, sent: datetime, received: datetime, store_date: datetime) -> Offset:
        """One response: sent and received by this host's clock, dated by the store's."""
        bounds = Offset(
            (store_date - received).total_seconds(),
            (store_date - sent).total_seconds() + DATE_RESOLUTION,
        )
        with self._lock:
            self._bounds.append(bounds)
            narrowed = Offset(max(b.low for b in self._bounds), min(b.high for b in self._bounds))
            if narrowed.low > narrowed.high:
                self._bounds.clear()
                self._bounds.append(bounds)
                narrowed = bounds
            self._current = narrowed
        return narrowed

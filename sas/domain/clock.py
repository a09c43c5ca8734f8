"""Time as an injected dependency: services never call datetime.now() themselves."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current time, timezone-aware UTC."""
        ...


def require_utc(value: datetime, name: str) -> datetime:
    """Reject naive datetimes: Table Storage would silently store them as UTC."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware")
    return value.astimezone(UTC)


def readable(at: datetime) -> str:
    """An instant in text a person reads (history details, errors): UTC to the millisecond,
    saying so, as the dashboard and the CLI show times (to the second)."""
    return require_utc(at, "at").strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"

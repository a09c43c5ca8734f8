"""Command-line values: durations (90s, 15m, 2h, 7d), instants (ISO 8601, UTC unless said)
and JSON given inline or as @file."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sas.services.operator import EARLIEST, LATEST


class UsageError(Exception):
    """Bad input on the command line: exit code 2, nothing changed."""


_DURATION = re.compile(r"(\d{1,9})([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
LONGEST = timedelta(days=3660)
"""Ten years: older or newer than that filters nothing more (the HTTP API's bound too), and
now minus it stays a datetime."""


def duration(text: str) -> timedelta:
    """A whole number and a unit: ``90s``, ``15m``, ``2h``, ``7d``."""
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise UsageError(f"{text!r} is not a duration: a whole number and s, m, h or d (like 7d)")
    number, unit = found.groups()
    value = timedelta(**{_UNITS[unit]: int(number)})
    if value > LONGEST:
        raise UsageError(f"{text!r} is too long a duration: at most {LONGEST.days}d")
    return value


def instant(text: str) -> datetime:
    """An ISO 8601 date or time: ``2026-11-26``, ``2026-11-26T10:00``, ``...Z``, ``...+01:00``;
    without a zone it is UTC, as every time the CLI prints is."""
    try:
        value = datetime.fromisoformat(text.strip())
        found = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except ValueError:
        raise UsageError(f"{text!r} is not a time: ISO 8601, like 2026-11-26T10:00Z") from None
    except OverflowError:
        found = None
    if found is None or not EARLIEST <= found <= LATEST:
        raise UsageError(f"{text!r} is out of range: from {EARLIEST.year} to {LATEST.year}")
    return found


def json_object(text: str, what: str) -> dict[str, Any]:
    """A JSON object given inline, or read from a file when ``text`` is ``@path``."""
    source = text
    if text.startswith("@"):
        try:
            source = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{what}: cannot read {text[1:]}: {exc.strerror}") from None
    try:
        value = json.loads(source)
    except ValueError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError(f"{what} is nested too deeply to read") from None
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object")
    return value

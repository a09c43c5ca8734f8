"""The order state a step request carries to its agent and the agent's reply carries back.

A reply is taken by whichever Scheduler instance dequeues it, usually not the one that claimed
the step once there are several. Without the state that instance must read the row before it
can write it: a point read per step, per order, at any scale-out. So the Scheduler that claims
a step puts the state it just wrote, with the ETag that write returned, in the step request;
the agent hands it back unchanged in its reply (it never reads it, and the remote service
never sees it). The Scheduler that takes the reply starts from it as it would from a state it
remembers itself (sas/services/recent.py): its write is conditional on the carried ETag, so it
succeeds only if the row is still exactly the state carried; otherwise it reads and decides
again, and a fence that does not let the reply through on a carried state is decided again on
a read.

Untrusted like the rest of a message: a carried state that does not decode, is not of the
reply's order or is larger than :data:`MAX_CARRIED_BYTES` is ignored (the Scheduler reads), and
never makes the reply invalid.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from datetime import UTC, datetime
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from sas.domain.model import OrderState, Versioned

VERSION = 1
"""Of the carried form; a reply with another is read instead (a rolling upgrade may change it)."""

MAX_CARRIED_BYTES = 16 * 1024
"""As compact JSON. The largest valid order's state is about 11 KiB (100 lines, all at their
longest: tests/unit/test_carried.py), so every state is carried; a request then stays well
under the message limit (``messages.MAX_MESSAGE_BYTES``) with its payload beside it."""


@cache
def _states() -> TypeAdapter[OrderState]:
    return TypeAdapter(OrderState)


def carry(state: OrderState, etag: str) -> dict[str, Any] | None:
    """What a step request carries for ``state`` as written at ``etag`` (None: too large)."""
    written = _states().dump_python(state, mode="json", exclude_defaults=True)
    carried = {"v": VERSION, "etag": etag, "state": written}
    return carried if size_of(carried) <= MAX_CARRIED_BYTES else None


def carried_state(carried: dict[str, Any] | None, order_id: str) -> Versioned[OrderState] | None:
    """The state and ETag a reply carries back for ``order_id``; None if there is none it can
    start from (absent, another version or order, or not a state)."""
    if not carried or carried.get("v") != VERSION:
        return None
    etag = carried.get("etag")
    if not isinstance(etag, str) or not etag:
        return None
    try:
        state = _states().validate_python(carried.get("state"))
    except (ValidationError, TypeError, ValueError):
        return None
    if state.order_id != order_id:
        return None
    in_utc = _in_utc(state)
    return None if in_utc is None else Versioned(in_utc, etag)


def size_of(carried: dict[str, Any]) -> int:
    """Bytes of ``carried`` as compact JSON (what the bound counts); above the bound for
    anything that is not JSON data."""
    try:
        text = json.dumps(carried, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        return len(text.encode("utf-8"))
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return MAX_CARRIED_BYTES + 1


def _in_utc(state: OrderState) -> OrderState | None:
    """Every datetime as a read gives it, a plain datetime in UTC (None: one has no zone)."""
    changes: dict[str, Any] = {}
    for field in fields(state):
        value = getattr(state, field.name)
        if isinstance(value, datetime):
            if value.tzinfo is None or value.utcoffset() is None:
                return None
            changes[field.name] = value.astimezone(UTC)
    return replace(state, **changes)

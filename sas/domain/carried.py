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

Signed, because the ETag alone proves nothing about the state beside it: anyone who can read
an agent's queue sees the current ETag, and could otherwise send a reply whose carried state
rewrites the order (skips its steps, changes its details or ``reply_to``) under that ETag.
The signature is an HMAC-SHA256 under a key the app makes for itself and keeps in its own
table (``StateStore.carry_key``, read once per process): a principal that may use the queues
but not read the table cannot sign. (A shared connection string or account key grants both;
the protection holds where queues and table are granted apart, as with role assignments.) It
protects the carried state, not the reply: a writer of the replies queue can still answer the
current attempt, as before. A carried state whose signature does not verify, that does not
decode, is another order's or names an unknown workflow is ignored (the Scheduler reads), and
never makes the reply invalid.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import fields, replace
from datetime import UTC, datetime
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from sas.domain.model import OrderState, Versioned
from sas.domain.workflow import workflow_named

VERSION = 2
"""Of the carried form; a reply with another is read instead. 2: signed (1 was not, and an
instance that still trusts it must not be handed a signed one)."""

_SIGNATURE = re.compile(r"[0-9a-f]{64}")

MAX_CARRIED_BYTES = 20 * 1024
"""As compact JSON. The largest valid order's state, every text at its longest in 4-byte
characters, is under 15 KiB signed (tests/unit/test_carried.py), so every state is carried; a
request then stays under the message limit (``messages.MAX_MESSAGE_BYTES``) with its payload
and an undo's original result beside it."""


@cache
def _states() -> TypeAdapter[OrderState]:
    return TypeAdapter(OrderState)


def carry(state: OrderState, etag: str, key: bytes) -> dict[str, Any] | None:
    """What a step request carries for ``state`` as written at ``etag``, signed with ``key``
    (None: too large, or not a state a read could give: a time without a zone)."""
    in_utc = _in_utc(state)
    if in_utc is None:
        return None
    signed = {
        "v": VERSION,
        "etag": etag,
        "state": _states().dump_python(in_utc, mode="json", exclude_defaults=True),
    }
    signature = _signature(signed, key)
    if signature is None:
        return None
    carried = {**signed, "sig": signature}
    return carried if size_of(carried) <= MAX_CARRIED_BYTES else None


def carried_state(
    carried: dict[str, Any] | None, order_id: str, key: bytes
) -> Versioned[OrderState] | None:
    """The state and ETag a reply carries back for ``order_id``; None if there is none it can
    start from (absent, not signed with ``key``, another version or order, not a state)."""
    if not carried or carried.get("v") != VERSION:
        return None
    signature, etag = carried.get("sig"), carried.get("etag")
    if not isinstance(signature, str) or not isinstance(etag, str) or not etag:
        return None
    signed = {name: carried.get(name) for name in ("v", "etag", "state")}
    expected = _signature(signed, key)
    if (
        expected is None
        or not _SIGNATURE.fullmatch(signature)
        or not hmac.compare_digest(signature, expected)
    ):
        return None
    try:
        state = _states().validate_python(carried.get("state"))
        workflow_named(state.workflow)
    except (ValidationError, TypeError, ValueError, KeyError):
        return None
    if state.order_id != order_id:
        return None
    in_utc = _in_utc(state)
    return None if in_utc is None else Versioned(in_utc, etag)


def _signature(signed: dict[str, Any], key: bytes) -> str | None:
    """Over the canonical JSON of what is signed (a queue may reorder nothing, but a decoder
    need not keep the key order either)."""
    try:
        text = json.dumps(
            signed, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False
        )
    except (TypeError, ValueError):
        return None
    return hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


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

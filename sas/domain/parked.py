"""Parked messages: what never got processed and waits for an operator, of two kinds.

- Parked by the app (``parked_by="app"``): bad input the app recognised itself (malformed, an
  unknown order, an order id already taken), settled, and kept as a row of the table's
  ``~rejected`` partition with the reason and the original body (``StateStore.park_message``).
  Its id is the row key (``wire.rejected_row_key``).
- Parked by the host (``parked_by="host"``): what the Functions host gave up on. A message the
  host failed to process ``maxDequeueCount`` times (host.json), or a Storage queue body that is
  not valid Base64, is moved to ``<queue>-poison`` (Storage Queues) or dead-lettered to
  ``<queue>/$DeadLetterQueue`` (Service Bus) (``PoisonStore``). Its id is a ``p1.`` id
  (``wire.poison_id``).

Both are one value, ``ParkedMessage``: listed together, replayed and discarded by id; the id's
spelling says which store holds the message.

Pure: adapters read the table and the queues, this module names, bounds and explains what they
found.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from sas.domain.wire import POISON_SUFFIX, PRIORITIES, Priority, lane_function_name
from sas.domain.wire import is_rejected_row_key as is_rejected_row_key
from sas.domain.wire import parse_poison_id as parse_poison_id
from sas.domain.wire import poison_id as poison_id
from sas.domain.wire import rejected_row_key as rejected_row_key

STORAGE_PEEK_MAX = 32
"""A Storage queue shows at most its first 32 messages to a peek: a poison queue that lists
that many may hold more, unseen until some are replayed or discarded."""
ParkedBy = Literal["app", "host"]
"""``app``: the app refused it as bad input; ``host``: the Functions host gave up on it."""
PoisonTransport = Literal["storage", "servicebus"]

BODY_DISPLAY_LIMIT = 64 * 1024
"""At most this many body bytes of a host-parked message are kept for display (a Storage
message is at most 64 KiB)."""

_LONG_AGO = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ParkedMessage:
    id: str
    """Opaque, stable and URL-safe: a rejected row key (parked by the app) or a ``p1.`` poison
    id (parked by the host), so replay and discard know which store holds it."""
    parked_by: ParkedBy
    queue: str
    """The queue the message was meant for (not the poison / dead-letter queue)."""
    function: str | None
    """The function triggered by that queue, when known."""
    reason: str
    body: bytes
    """The message body as the function would have seen it (or the start of it)."""
    body_truncated: bool
    """Only the start of the body is here: the app keeps at most what a table row holds, the
    host's is cut to BODY_DISPLAY_LIMIT for display."""
    parked_at: datetime | None
    """When it was parked: by the app, when it refused it; by the host, when it was moved to the
    poison queue or, lacking that (Service Bus), when it was first enqueued."""
    delivery_count: int | None = None
    """How often delivery was attempted, when the transport keeps it (Service Bus)."""
    transport: PoisonTransport | None = None
    """Parked by the host: the transport whose poison / dead-letter queue holds it."""

    def age(self, now: datetime) -> timedelta | None:
        """How long it has been parked, never negative; None if nobody knows since when."""
        if self.parked_at is None:
            return None
        return max(now - self.parked_at, timedelta(0))


def parked_by(parked_id: str) -> ParkedBy | None:
    """Which store holds the message of id ``parked_id`` (only an id in the one spelling its
    store makes); None for anything else, which then reaches no store at all."""
    if is_rejected_row_key(parked_id):
        return "app"
    if parse_poison_id(parked_id) is not None:
        return "host"
    return None


def poison_queue(parked_id: str) -> str | None:
    """The queue a message parked by the host was meant for, as its id says; None if the id is
    not a host-parked message's."""
    parsed = parse_poison_id(parked_id)
    return None if parsed is None else parsed[0]


def oldest_first(messages: Iterable[ParkedMessage]) -> list[ParkedMessage]:
    """Oldest first; one whose time is unknown counts as the oldest (then by id, stable)."""
    return sorted(messages, key=lambda m: (m.parked_at or _LONG_AGO, m.id))


def bounded(body: bytes, limit: int = BODY_DISPLAY_LIMIT) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of ``body`` and whether anything was cut."""
    return body[:limit], len(body) > limit


def consumed_queues(
    *,
    orders: str,
    scheduler: str,
    replies: str,
    agents: Mapping[str, str],
    lanes: Mapping[str, Mapping[Priority, str]] | None = None,
) -> dict[str, str]:
    """Every queue the app is triggered by, every priority lane of it, with the function it
    triggers (sas/entrypoints/queues.py); ``agents`` maps an agent's name to its queue,
    ``lanes`` each queue (its normal lane) to its lane per priority."""
    functions = {orders: "submit", scheduler: "schedule", replies: "on_reply"}
    functions.update({queue: f"agent_{agent}" for agent, queue in agents.items()})
    consumed: dict[str, str] = {}
    for queue, function in functions.items():
        by_priority = (lanes or {}).get(queue, {})
        for priority in PRIORITIES:
            lane = by_priority.get(priority, queue)
            consumed.setdefault(lane, lane_function_name(function, priority))
    return consumed


def storage_body(content: str) -> tuple[bytes, bool]:
    """What a Storage poison message held: (body bytes, whether its text was valid Base64).

    The host moves the raw message text, Base64 for this app (host.json messageEncoding);
    a body that is not Base64 is shown as its text."""
    compact = "".join(content.split())
    try:
        return base64.b64decode(compact, validate=True), True
    except (binascii.Error, ValueError):
        return content.encode("utf-8"), False


def storage_reason(queue: str, *, decodable: bool) -> str:
    """Why a message is in ``<queue>-poison``: the host keeps no reason and no dequeue count,
    but a body that is not Base64 text can only have been moved for that."""
    poison = f"{queue}{POISON_SUFFIX}"
    if not decodable:
        return f"moved to {poison} by the Functions host: the body is not valid Base64"
    return f"moved to {poison} by the Functions host after maxDequeueCount failed attempts"


def servicebus_reason(reason: str | None, description: str | None) -> str:
    """Service Bus's DeadLetterReason and DeadLetterErrorDescription, bounded."""
    text = reason or "dead-lettered (no reason given)"
    if description:
        text = f"{text}: {description}"
    return text[:1000]


def more_unlisted(listed: Iterable[ParkedMessage]) -> bool:
    """Whether a Storage poison queue listed as many as a peek shows: it may hold more."""
    counts: dict[str, int] = {}
    for message in listed:
        if message.parked_by == "host" and message.transport == "storage":
            counts[message.queue] = counts.get(message.queue, 0) + 1
    return any(count >= STORAGE_PEEK_MAX for count in counts.values())

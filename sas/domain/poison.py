"""Poison and dead-lettered messages: what the Functions host gave up on, for an operator.

A message the host failed to process ``maxDequeueCount`` times (host.json), or a Storage queue
body that is not valid Base64, is moved by the host to ``<queue>-poison`` (Storage Queues) or
dead-lettered to ``<queue>/$DeadLetterQueue`` (Service Bus). Messages the app itself recognises
as malformed are parked in the table instead (``park_message``); these are the others.

Pure: adapters read the queues, this module names, bounds and explains what they found.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sas.domain.wire import POISON_SUFFIX, PRIORITIES, Priority, lane_function_name
from sas.domain.wire import parse_poison_id as parse_poison_id
from sas.domain.wire import poison_id as poison_id

PoisonTransport = Literal["storage", "servicebus"]

BODY_DISPLAY_LIMIT = 64 * 1024
"""At most this many body bytes are kept for display (a Storage message is at most 64 KiB)."""


@dataclass(frozen=True)
class PoisonedMessage:
    id: str
    """Opaque, stable and URL-safe: the source queue and the transport's message id."""
    queue: str
    """The queue the message was meant for (not the poison / dead-letter queue)."""
    function: str | None
    """The function triggered by that queue, when known."""
    transport: PoisonTransport
    reason: str
    body: bytes
    """The message body as the function would have seen it, at most BODY_DISPLAY_LIMIT bytes."""
    body_truncated: bool
    delivery_count: int | None
    """How often delivery was attempted, when the transport keeps it (Service Bus)."""
    enqueued_at: datetime | None
    """When the message was first enqueued on its source queue, when the transport keeps it."""
    moved_at: datetime | None
    """When it was moved to the poison queue, when the transport says so (Storage)."""

    def age(self, now: datetime) -> timedelta | None:
        """How long it has been poisoned (or, lacking that, enqueued), never negative."""
        since = self.moved_at or self.enqueued_at
        if since is None:
            return None
        return max(now - since, timedelta(0))


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

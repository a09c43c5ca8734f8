"""Decoding inbound queue messages, and parking the ones that can never be processed.

A malformed or hostile message is recorded with its reason and original body, and the
function returns normally so the message is settled: no retry storm, no partial write.
Infrastructure failures (store or queue unavailable) still raise, so the host retries them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from sas import bootstrap
from sas.domain.errors import InvalidMessage
from sas.domain.messages import Message, decode
from sas.services import telemetry

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)


class InboundMessage(Protocol):
    """What Storage Queue and Service Bus trigger messages have in common."""

    def get_body(self) -> bytes: ...


def _properties(message: InboundMessage) -> Mapping[str | bytes, object] | None:
    """A Service Bus message's application properties (None for a Storage Queue message)."""
    found = getattr(message, "application_properties", None) or getattr(
        message, "user_properties", None
    )
    return found if isinstance(found, Mapping) else None


def handle(
    message: InboundMessage,
    *,
    function: str,
    queue_setting: str,
    model: type[M],
    handler: Callable[[M], object],
) -> object:
    body = message.get_body()
    try:
        decoded = decode(model, body)
        with telemetry.continued(telemetry.carrier_from(decoded, _properties(message))):
            return handler(decoded)
    except InvalidMessage as exc:
        queue = bootstrap.settings().queues.get(queue_setting, queue_setting)
        parked_id = bootstrap.store().park_message(queue, exc.reason, body, bootstrap.clock().now())
        log.warning(
            "sas.message_parked function=%s reason=%s",
            function,
            exc.reason,
            extra={"function": function, "queue": queue, "parked_id": parked_id},
        )
        return None

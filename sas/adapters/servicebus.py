"""Transport over Azure Service Bus queues (the production default; docs/architecture.md,
"Transports").

One ``ServiceBusClient`` per worker process, created on first send, and one sender per queue,
created on first use and reused. Creation is guarded by a lock (the Functions worker runs
synchronous functions on a thread pool) and each send holds its sender's lock: the SDK does
not promise that a sender is thread-safe.

What goes on the wire: body = ``encode(message)`` (JSON bytes), ``content_type``
application/json, ``message_id`` (duplicate detection key), ``correlation_id`` (the OrderID),
``subject`` (the message type) and, when an OpenTelemetry span is active, its W3C
``traceparent``/``tracestate`` as application properties and in the body's envelope (the
receiving side reads either: sas/entrypoints/queues.py). A delay becomes
``scheduled_enqueue_time_utc`` = injected clock now + delay.

Errors: a missing queue (``MessagingEntityNotFoundError``) becomes ``NotFound``; every other
``ServiceBusError`` propagates unchanged (the SDK already retried; the Functions host retries
the invocation). Nothing here logs message bodies or connection strings.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from azure.servicebus import ServiceBusMessage, ServiceBusMessageState
from azure.servicebus.exceptions import MessagingEntityNotFoundError, ServiceBusAuthorizationError

from sas.adapters.clients import servicebus_clients
from sas.domain.clock import Clock, require_utc
from sas.domain.errors import ConfigurationError, NotFound
from sas.domain.messages import Message, encode
from sas.domain.priority import Waiting
from sas.domain.wire import TRACEPARENT_PROPERTY, TRACESTATE_PROPERTY
from sas.services.telemetry import current_carrier, stamped
from sas.settings import Connection

_ACTIVE = ServiceBusMessageState.ACTIVE
log = logging.getLogger(__name__)

CONTENT_TYPE = "application/json"
TRACEPARENT = TRACEPARENT_PROPERTY
TRACESTATE = TRACESTATE_PROPERTY
DEFAULT_SEND_TIMEOUT = 10.0
"""Seconds for one send including the SDK's retries. Below the shortest step complete-by budget
(15 s, sas/domain/workflow.py): a send that hangs must fail while the step can still be retried
in time, not outlive the budget it is part of (tests/unit/test_infra_consistency.py checks it)."""


class SenderLike(Protocol):
    """The part of ``azure.servicebus.ServiceBusSender`` this adapter uses."""

    def send_messages(
        self, message: ServiceBusMessage, *, timeout: float | None = None
    ) -> None: ...

    def close(self) -> None: ...


class PeekedLike(Protocol):
    @property
    def enqueued_time_utc(self) -> datetime | None: ...
    @property
    def body(self) -> Any: ...


class ReceiverLike(Protocol):
    """The part of ``azure.servicebus.ServiceBusReceiver`` this adapter uses (peek only)."""

    def peek_messages(self, max_message_count: int = 1) -> Sequence[PeekedLike]: ...

    def close(self) -> None: ...


class ClientLike(Protocol):
    """The part of ``azure.servicebus.ServiceBusClient`` this adapter uses."""

    def get_queue_sender(self, queue_name: str) -> SenderLike: ...

    def get_queue_receiver(self, queue_name: str) -> ReceiverLike: ...

    def close(self) -> None: ...


ClientFactory = Callable[[], ClientLike]
PropertyValue = int | float | bytes | bool | str | UUID


class ServiceBusTransport:
    """Implements ``sas.services.ports.Transport`` over Service Bus queues."""

    def __init__(
        self,
        client_factory: ClientFactory,
        clock: Clock,
        *,
        endpoint: str = "servicebus",
        send_timeout: float | None = DEFAULT_SEND_TIMEOUT,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """``client_factory`` is called once, on the first send; ``endpoint`` only labels logs.

        ``on_close`` runs after the client is closed (e.g. to close a credential)."""
        self._client_factory = client_factory
        self._clock = clock
        self._endpoint = endpoint
        self._send_timeout = send_timeout
        self._on_close = on_close
        self._lock = threading.Lock()
        self._client: ClientLike | None = None
        self._senders: dict[str, tuple[SenderLike, threading.Lock]] = {}

    @classmethod
    def from_connection(cls, conn: Connection, clock: Clock) -> ServiceBusTransport:
        """A transport for a resolved connection; nothing connects until the first send."""
        clients = servicebus_clients(conn)
        return cls(clients.make, clock, endpoint=clients.endpoint, on_close=clients.close)

    def send(
        self,
        queue: str,
        message: Message,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        """Send one message; ``NotFound`` if the queue does not exist."""
        if not (delay_seconds >= 0 and math.isfinite(delay_seconds)):
            raise ValueError(f"delay_seconds must be a finite number >= 0, got {delay_seconds!r}")
        outgoing = self._build(message, message_id, correlation_id, delay_seconds)
        while True:
            sender, send_lock = self._sender(queue)
            with send_lock:
                if not self._is_current(queue, sender):
                    continue  # closed or evicted while this thread waited for the lock
                try:
                    sender.send_messages(outgoing, timeout=self._send_timeout)
                except MessagingEntityNotFoundError as exc:
                    self._forget(queue, sender)
                    _close_quietly(sender, "sender")
                    log.warning(
                        "servicebus.queue_not_found endpoint=%s queue=%s message_id=%s",
                        self._endpoint,
                        queue,
                        message_id,
                    )
                    raise NotFound(f"Service Bus queue {queue!r} does not exist") from exc
            break
        log.debug(
            "servicebus.sent queue=%s message_id=%s correlation_id=%s subject=%s delay_s=%s",
            queue,
            message_id,
            correlation_id,
            outgoing.subject,
            delay_seconds,
        )

    def waiting(self, queue: str) -> Waiting:
        active = self._active(queue, Waiting.PEEK)
        times = [m.enqueued_time_utc for m in active if m.enqueued_time_utc is not None]
        return Waiting(min(times).astimezone(UTC) if times else None, len(active))

    def holds_messages(self, queue: str) -> bool:
        """From a peek of one message, whatever its state: a peek shows locked, scheduled and
        deferred messages too."""
        return bool(self._peek(queue, 1))

    def depth(self, queue: str) -> int:
        """Active messages seen by a peek, so at most ``Waiting.PEEK``: the exact count needs
        the management API (Manage rights), which the app's identity does not have."""
        return len(self._active(queue, Waiting.PEEK))

    def peek(self, queue: str, limit: int) -> list[bytes]:
        return [body_bytes(m.body) for m in self._active(queue, max(limit, 1))]

    def _active(self, queue: str, count: int) -> list[PeekedLike]:
        """The active messages among the first ``count`` a peek returns."""
        # A peek also returns scheduled and deferred messages: only active ones are waiting.
        peeked = self._peek(queue, count)
        return [m for m in peeked if getattr(m, "state", None) in (None, _ACTIVE)]

    def _peek(self, queue: str, count: int) -> list[PeekedLike]:
        """The first ``count`` messages a peek shows, whatever their state."""
        with self._lock:
            if self._client is None:
                self._client = self._client_factory()
                log.info("servicebus.client_created endpoint=%s", self._endpoint)
            client = self._client
        receiver = client.get_queue_receiver(queue_name=queue)
        try:
            peeked = receiver.peek_messages(max_message_count=count)
        except MessagingEntityNotFoundError as exc:
            raise NotFound(f"Service Bus queue {queue!r} does not exist") from exc
        except ServiceBusAuthorizationError as exc:  # no Listen right: a deployment matter
            raise ConfigurationError(f"no right to read Service Bus queue {queue!r}") from exc
        finally:
            _close_quietly(receiver, "receiver")
        return list(peeked)

    def close(self) -> None:
        """Close every sender, the client and (via ``on_close``) the credential. Idempotent.

        A later send opens a new client."""
        with self._lock:
            entries = list(self._senders.values())
            self._senders.clear()
            client, self._client = self._client, None
        for sender, send_lock in entries:
            with send_lock:  # let an in-flight send finish first
                _close_quietly(sender, "sender")
        if client is not None:
            _close_quietly(client, "client")
            log.info("servicebus.closed endpoint=%s", self._endpoint)
        if self._on_close is not None:
            self._on_close()

    def _build(
        self, message: Message, message_id: str, correlation_id: str, delay_seconds: float
    ) -> ServiceBusMessage:
        scheduled = None
        if delay_seconds > 0:
            now = require_utc(self._clock.now(), "clock.now()")
            scheduled = now + timedelta(seconds=delay_seconds)
        properties: dict[str | bytes, PropertyValue] = dict(trace_context().items())
        return ServiceBusMessage(
            encode(stamped(message) if properties else message),
            content_type=CONTENT_TYPE,
            message_id=message_id,
            correlation_id=correlation_id,
            subject=message_type(message),
            application_properties=properties or None,
            scheduled_enqueue_time_utc=scheduled,
        )

    def _sender(self, queue: str) -> tuple[SenderLike, threading.Lock]:
        entry = self._senders.get(queue)
        if entry is not None:
            return entry
        with self._lock:
            entry = self._senders.get(queue)
            if entry is None:
                if self._client is None:
                    self._client = self._client_factory()
                    log.info("servicebus.client_created endpoint=%s", self._endpoint)
                entry = (self._client.get_queue_sender(queue_name=queue), threading.Lock())
                self._senders[queue] = entry
                log.info("servicebus.sender_created endpoint=%s queue=%s", self._endpoint, queue)
            return entry

    def _is_current(self, queue: str, sender: SenderLike) -> bool:
        entry = self._senders.get(queue)
        return entry is not None and entry[0] is sender

    def _forget(self, queue: str, sender: SenderLike) -> None:
        """Drop a sender that failed for good, so that a later send (say, once the queue
        exists) attaches a fresh link instead of reusing a broken one."""
        with self._lock:
            if self._is_current(queue, sender):
                del self._senders[queue]


def message_type(message: Message) -> str:
    """The ``type`` discriminator of a sas message (class name if it has none)."""
    value = getattr(message, "type", None)
    return value if isinstance(value, str) else type(message).__name__


def trace_context() -> dict[str, str]:
    """W3C trace context of the current OpenTelemetry span; empty without one."""
    return current_carrier()


def body_bytes(body: Any) -> bytes:
    """A received body as bytes: a data body comes as an iterable of byte chunks."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, Iterable):
        return b"".join(
            chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk) for chunk in body
        )
    return str(body).encode("utf-8")


def _close_quietly(closeable: SenderLike | ReceiverLike | ClientLike, what: str) -> None:
    try:
        closeable.close()
    except Exception as exc:  # closing is best effort; the link may already be broken
        log.warning("servicebus.close_failed what=%s error=%s", what, type(exc).__name__)

"""Dead-letter sub-queues of Azure Service Bus (``<queue>/$DeadLetterQueue``), for an operator.

Listing peeks each consumed queue's dead-letter queue. Replay and discard receive from it in
peek-lock mode until the message with the wanted sequence number turns up, complete it (replay
first sends a copy to the source queue: the same body, content type, message_id,
correlation_id, subject and application properties, minus the broker's DeadLetterReason and
DeadLetterErrorDescription) and abandon every other message they received. Every wait is
bounded: receives by ``receive_wait``, the whole search by ``max_scan`` and a deadline.

The copy keeps the original message_id, so a replay that was sent but whose completion failed
is dropped by duplicate detection when it is replayed again. The other side of that: within the
duplicate detection window after the original was first enqueued (infra/modules/servicebus.bicep,
10 minutes by default), Service Bus would drop the copy silently and the message would be lost,
so replay refuses (IllegalTransition) until the window is over.

Requeue (an operator replaying a message the app parked) sends a new message with the raw body
to a source queue, under the message id it is given.

Errors: a missing queue (``MessagingEntityNotFoundError``) is skipped when listing, False for
replay or discard of its dead letters, and ``NotFound`` when a replay's or requeue's source
queue is gone; every other ``ServiceBusError`` propagates. Nothing here logs message bodies or
secrets.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from azure.servicebus import (
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from sas.adapters.clients import servicebus_clients
from sas.adapters.servicebus import DEFAULT_SEND_TIMEOUT, PropertyValue, SenderLike, body_bytes
from sas.domain.clock import Clock, require_utc
from sas.domain.errors import IllegalTransition, NotFound
from sas.domain.parked import (
    ParkedMessage,
    bounded,
    oldest_first,
    parse_poison_id,
    poison_id,
    servicebus_reason,
)
from sas.settings import Connection

log = logging.getLogger(__name__)

DEAD_LETTER_PROPERTIES = frozenset({"DeadLetterReason", "DeadLetterErrorDescription"})
"""Set by the broker when it dead-letters a message; not part of the original."""
DEFAULT_DUPLICATE_DETECTION_WINDOW = timedelta(minutes=10)
"""infra/modules/servicebus.bicep's default duplicateDetectionHistoryTimeWindow (PT10M)."""
PAGE = 32
MAX_PEEK = 250


class ReceivedLike(Protocol):
    """The part of ``azure.servicebus.ServiceBusReceivedMessage`` this adapter reads."""

    @property
    def sequence_number(self) -> int | None: ...
    @property
    def message_id(self) -> str | None: ...
    @property
    def correlation_id(self) -> str | None: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def subject(self) -> str | None: ...
    @property
    def application_properties(self) -> Mapping[str | bytes, Any] | None: ...
    @property
    def body(self) -> Any: ...
    @property
    def delivery_count(self) -> int | None: ...
    @property
    def enqueued_time_utc(self) -> datetime | None: ...
    @property
    def dead_letter_reason(self) -> str | None: ...
    @property
    def dead_letter_error_description(self) -> str | None: ...


class ReceiverLike(Protocol):
    """The part of ``azure.servicebus.ServiceBusReceiver`` this adapter uses."""

    def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, timeout: float | None = None
    ) -> Sequence[ReceivedLike]: ...

    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> Sequence[ReceivedLike]: ...

    def complete_message(self, message: Any) -> None: ...

    def abandon_message(self, message: Any) -> None: ...

    def close(self) -> None: ...


class DeadLetterClientLike(Protocol):
    """The part of ``azure.servicebus.ServiceBusClient`` this adapter uses."""

    def get_queue_receiver(
        self,
        queue_name: str,
        *,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ...,
        max_wait_time: float | None = None,
        prefetch_count: int = 0,
    ) -> ReceiverLike: ...

    def get_queue_sender(self, queue_name: str) -> SenderLike: ...

    def close(self) -> None: ...


class ServiceBusDeadLetters:
    """Implements ``sas.services.ports.PoisonStore`` over Service Bus dead-letter queues."""

    def __init__(
        self,
        client_factory: Callable[[], DeadLetterClientLike],
        sources: Mapping[str, str],
        clock: Clock,
        *,
        endpoint: str = "servicebus",
        duplicate_detection_window: timedelta = DEFAULT_DUPLICATE_DETECTION_WINDOW,
        receive_wait: float = 2.0,
        peek_timeout: float = 10.0,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        max_scan: int = 256,
        deadline_seconds: float = 30.0,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """``sources`` maps every queue the app consumes to the function it triggers;
        ``client_factory`` is called once, on first use."""
        self._client_factory = client_factory
        self._sources = dict(sources)
        self._clock = clock
        self._endpoint = endpoint
        self._window = duplicate_detection_window
        self._receive_wait = receive_wait
        self._peek_timeout = peek_timeout
        self._send_timeout = send_timeout
        self._max_scan = max_scan
        self._deadline = deadline_seconds
        self._on_close = on_close
        self._lock = threading.Lock()
        self._client: DeadLetterClientLike | None = None

    @classmethod
    def from_connection(
        cls, conn: Connection, sources: Mapping[str, str], clock: Clock
    ) -> ServiceBusDeadLetters:
        """Dead letters over a resolved connection; nothing connects until used."""
        clients = servicebus_clients(conn)
        return cls(clients.make, sources, clock, endpoint=clients.endpoint, on_close=clients.close)

    def list(self, limit: int = 100) -> builtins.list[ParkedMessage]:
        found: builtins.list[ParkedMessage] = []
        for queue, function in self._sources.items():
            receiver = self._receiver(queue)
            try:
                peeked = receiver.peek_messages(
                    max_message_count=min(max(limit, 1), MAX_PEEK), timeout=self._peek_timeout
                )
            except MessagingEntityNotFoundError:
                log.warning("servicebus.dead_letters_queue_not_found queue=%s", queue)
                continue
            finally:
                _close_quietly(receiver)
            found.extend(
                self._view(queue, function, message)
                for message in peeked
                if message.sequence_number is not None
            )
        return oldest_first(found)[:limit]

    def replay(self, poison_id: str) -> bool:
        return self._take(poison_id, replay=True)

    def discard(self, poison_id: str) -> bool:
        return self._take(poison_id, replay=False)

    def requeue(self, queue: str, body: bytes, *, message_id: str) -> None:
        """A new message carrying ``body`` (what the function reads), labelled ``message_id``."""
        if queue not in self._sources:
            raise IllegalTransition(f"{queue} is not a queue the app consumes")
        self._send(queue, ServiceBusMessage(body, message_id=message_id))
        log.info("servicebus.requeued queue=%s message_id=%s", queue, message_id)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            _close_quietly(client)
        if self._on_close is not None:
            self._on_close()

    def _take(self, poison_id: str, *, replay: bool) -> bool:
        parsed = parse_poison_id(poison_id)
        if parsed is None or parsed[0] not in self._sources or not parsed[1].isdigit():
            return False
        queue, sequence_number = parsed[0], int(parsed[1])
        receiver = self._receiver(queue)
        held: builtins.list[ReceivedLike] = []
        try:
            target = self._find(receiver, sequence_number, held)
            if target is None:
                return False
            if replay:
                try:
                    self._check_window(target)
                    self._send_copy(queue, target)
                except BaseException:
                    held.append(target)  # still in the dead-letter queue: hand it back
                    raise
            receiver.complete_message(target)
        except MessagingEntityNotFoundError:
            return False  # the dead-letter queue's queue is gone
        finally:
            for message in held:
                try:
                    receiver.abandon_message(message)
                except Exception as exc:  # its lock expires on its own
                    log.warning("servicebus.abandon_failed error=%s", type(exc).__name__)
            _close_quietly(receiver)
        log.warning(
            "servicebus.dead_letter_%s queue=%s sequence_number=%s",
            "replayed" if replay else "discarded",
            queue,
            sequence_number,
        )
        return True

    def _find(
        self, receiver: ReceiverLike, sequence_number: int, held: builtins.list[ReceivedLike]
    ) -> ReceivedLike | None:
        """Receive until ``sequence_number`` turns up; every other message goes to ``held``."""
        deadline = time.monotonic() + self._deadline
        while len(held) < self._max_scan and time.monotonic() < deadline:
            batch = receiver.receive_messages(
                max_message_count=PAGE, max_wait_time=self._receive_wait
            )
            if not batch:
                return None
            target = None
            for message in batch:
                if target is None and message.sequence_number == sequence_number:
                    target = message
                else:
                    held.append(message)
            if target is not None:
                return target
        return None

    def _check_window(self, message: ReceivedLike) -> None:
        enqueued = message.enqueued_time_utc
        if message.message_id is None or enqueued is None or self._window <= timedelta(0):
            return
        ready = require_utc(enqueued, "enqueued_time_utc") + self._window
        if require_utc(self._clock.now(), "clock.now()") < ready:
            raise IllegalTransition(
                "Service Bus duplicate detection would drop a replay with the same message id "
                f"until {ready:%Y-%m-%dT%H:%M:%SZ}: replay it after that"
            )

    def _send_copy(self, queue: str, message: ReceivedLike) -> None:
        properties: dict[str | bytes, PropertyValue] = {
            (key.decode("utf-8") if isinstance(key, bytes) else key): value
            for key, value in (message.application_properties or {}).items()
        }
        for key in DEAD_LETTER_PROPERTIES:
            properties.pop(key, None)
        copy = ServiceBusMessage(
            body_bytes(message.body),
            content_type=message.content_type,
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            subject=message.subject,
            application_properties=properties or None,
        )
        self._send(queue, copy)

    def _send(self, queue: str, message: ServiceBusMessage) -> None:
        sender = self._get_client().get_queue_sender(queue_name=queue)
        try:
            sender.send_messages(message, timeout=self._send_timeout)
        except MessagingEntityNotFoundError:
            raise NotFound(f"Service Bus queue {queue!r} does not exist") from None
        finally:
            _close_quietly(sender)

    def _receiver(self, queue: str) -> ReceiverLike:
        return self._get_client().get_queue_receiver(
            queue_name=queue,
            sub_queue=ServiceBusSubQueue.DEAD_LETTER,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            max_wait_time=self._receive_wait,
            prefetch_count=0,
        )

    def _get_client(self) -> DeadLetterClientLike:
        with self._lock:
            if self._client is None:
                self._client = self._client_factory()
                log.info("servicebus.dead_letters_client_created endpoint=%s", self._endpoint)
            return self._client

    def _view(self, queue: str, function: str, message: ReceivedLike) -> ParkedMessage:
        kept, truncated = bounded(body_bytes(message.body))
        # Service Bus does not say when it dead-lettered a message: since it was enqueued.
        enqueued = message.enqueued_time_utc
        return ParkedMessage(
            id=poison_id(queue, str(message.sequence_number)),
            parked_by="host",
            queue=queue,
            function=function,
            reason=servicebus_reason(
                message.dead_letter_reason, message.dead_letter_error_description
            ),
            body=kept,
            body_truncated=truncated,
            parked_at=None if enqueued is None else require_utc(enqueued, "enqueued_time_utc"),
            delivery_count=message.delivery_count,
            transport="servicebus",
        )


def _close_quietly(closeable: ReceiverLike | SenderLike | DeadLetterClientLike) -> None:
    try:
        closeable.close()
    except Exception as exc:  # best effort; the link may already be broken
        log.warning("servicebus.close_failed error=%s", type(exc).__name__)

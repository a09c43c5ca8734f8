"""Transport over Azure Storage Queues (Azurite locally; also a cheap Azure option).

Bodies are Base64-encoded JSON: what the Functions queue trigger expects by default
(host.json leaves ``extensions.queues.messageEncoding`` at base64).
Storage Queues carry no message id or correlation id of ours; both are inside the body
(order id, step, attempt), and logged here. The sending span's W3C trace context goes in the
envelope too (``Message.trace``): a Storage message has no properties to carry it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC
from typing import TypeVar

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueServiceClient, TextBase64EncodePolicy

from sas.domain.errors import NotFound
from sas.domain.messages import Message, encode
from sas.domain.parked import STORAGE_PEEK_MAX, storage_body
from sas.domain.priority import Waiting
from sas.services.telemetry import stamped

log = logging.getLogger(__name__)

MAX_DELAY_SECONDS = 7 * 24 * 3600
PEEK_MAX = STORAGE_PEEK_MAX
"""Storage returns at most 32 messages per peek or receive."""


class StorageQueueTransport:
    def __init__(self, service: QueueServiceClient) -> None:
        self._service = service
        self._clients: dict[str, QueueClient] = {}
        self._lock = threading.Lock()

    def send(
        self,
        queue: str,
        message: Message,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        delay = min(max(int(delay_seconds + 0.999), 0), MAX_DELAY_SECONDS)
        try:
            client, text = self._client(queue), encode(stamped(message)).decode()
            first_calls_alone(
                "send_message",
                lambda: client.send_message(text, visibility_timeout=delay or None),
                decoded=sent,
            )
        except ResourceNotFoundError:
            raise NotFound(f"queue {queue} does not exist") from None
        log.debug(
            "sas.message_sent",
            extra={"queue": queue, "message_id": message_id, "order_id": correlation_id},
        )

    def depth(self, queue: str) -> int:
        """The service's approximate count (visible and delayed messages alike)."""
        try:
            properties = self._client(queue).get_queue_properties()
        except ResourceNotFoundError:
            raise NotFound(f"queue {queue} does not exist") from None
        return int(properties.approximate_message_count or 0)

    def holds_messages(self, queue: str) -> bool:
        """From the approximate count, which counts leased and delayed messages too and is
        never below the true count."""
        return self.depth(queue) > 0

    def waiting(self, queue: str) -> Waiting:
        """From a peek at the front of the queue (up to 32 messages: a Storage queue is only
        roughly first-in first-out, so the oldest of them)."""
        try:
            client = self._client(queue)
            peeked = first_calls_alone(
                "peek_messages", lambda: list(client.peek_messages(max_messages=Waiting.PEEK))
            )
        except ResourceNotFoundError:
            raise NotFound(f"queue {queue} does not exist") from None
        times = [m.inserted_on for m in peeked if m.inserted_on is not None]
        return Waiting(min(times).astimezone(UTC) if times else None, len(peeked))

    def peek(self, queue: str, limit: int) -> list[bytes]:
        """The first ``limit`` bodies (at most 32: all a Storage peek shows), decoded from
        the Base64 text this transport sends."""
        try:
            client = self._client(queue)
            peeked = first_calls_alone(
                "peek_messages",
                lambda: list(client.peek_messages(max_messages=min(max(limit, 1), PEEK_MAX))),
            )
        except ResourceNotFoundError:
            raise NotFound(f"queue {queue} does not exist") from None
        return [storage_body(message.content or "")[0] for message in peeked]

    def _client(self, queue: str) -> QueueClient:
        client = self._clients.get(queue)
        if client is None:
            with self._lock:
                client = self._clients.get(queue)
                if client is None:
                    client = self._service.get_queue_client(
                        queue, message_encode_policy=TextBase64EncodePolicy()
                    )
                    self._clients[queue] = client
        return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()


# --- the SDK's first calls in a process, one at a time ---------------------------------------
# azure-storage-queue works out each of its generated model classes' fields on the class's
# first instance, unguarded: threads that send or receive for the first time in a process at
# once can read a class another is still filling in (``RuntimeError: dictionary changed size
# during iteration``, or a half-decoded answer after the message was queued). An operation's
# calls run under one process-wide lock until one has decoded an answer.

T = TypeVar("T")

_first_calls = threading.Lock()
_decoded: set[str] = set()


def first_calls_alone(
    operation: str, call: Callable[[], T], *, decoded: Callable[[T], bool] = bool
) -> T:
    """``call()``, alone in the process until ``decoded(result)`` held once for ``operation``
    (an SDK method name). ``decoded``: whether the answer made the SDK build its models (a
    receive or peek that found nothing built none); by default, a truthy result."""
    if operation in _decoded:
        return call()
    with _first_calls:
        result = call()
        if decoded(result):
            _decoded.add(operation)
        return result


def sent(_: object) -> bool:
    """A send's answer is always decoded (the new message's id and receipt)."""
    return True

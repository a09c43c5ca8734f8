"""Poison queues of Azure Storage Queues (``<queue>-poison``), for an operator.

The Functions host (and sas_local's dev host, exactly like it) copies a message it gave up on
to ``<queue>-poison`` as the raw message text, Base64 for this app, and deletes the original.
Listing peeks (Storage shows at most the first 32 messages of a queue); replay and discard
receive with a short visibility timeout until the message is found, and hand every other one
they received back at once (visibility 0). Replay sends the raw text back to the source queue
unchanged, through a client without an encode policy, then deletes the poison copy.
Every message listed is a ``ParkedMessage`` parked by the host. Requeue (an operator replaying
a message the app parked) sends a raw body Base64-encoded, as the queue trigger expects.

Nothing here logs message bodies or connection strings.
"""

from __future__ import annotations

import base64
import builtins
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueMessage, QueueServiceClient

from sas.adapters.storage_queues import PEEK_MAX, first_calls_alone, sent
from sas.domain.clock import require_utc
from sas.domain.errors import IllegalTransition, NotFound
from sas.domain.parked import (
    ParkedMessage,
    bounded,
    oldest_first,
    parse_poison_id,
    poison_id,
    storage_body,
    storage_reason,
)
from sas.domain.wire import POISON_SUFFIX

log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 30
"""How long a message received while looking for another stays invisible if it cannot be
handed back (the pop receipt must also outlast the send of a replay)."""
DEFAULT_MAX_SCAN = 256
DEFAULT_DEADLINE_SECONDS = 20.0
PEEK_THREADS = 8


class StoragePoisonQueues:
    """Implements ``sas.services.ports.PoisonStore`` over Storage poison queues."""

    def __init__(
        self,
        service: QueueServiceClient,
        sources: Mapping[str, str],
        *,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
        max_scan: int = DEFAULT_MAX_SCAN,
        deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
    ) -> None:
        """``sources`` maps every queue the app consumes to the function it triggers."""
        self._service = service
        self._sources = dict(sources)
        self._lease = lease_seconds
        self._max_scan = max_scan
        self._deadline = deadline_seconds
        self._clients: dict[str, QueueClient] = {}
        self._lock = threading.Lock()

    def list(self, limit: int = 100) -> builtins.list[ParkedMessage]:
        """Every poison queue peeked at once: one round trip's wait, not one per queue (an app
        has some twenty, most of them never created)."""
        size = min(max(limit, 1), PEEK_MAX)

        def peek(source: tuple[str, str]) -> builtins.list[ParkedMessage]:
            queue, function = source
            client = self._client(queue + POISON_SUFFIX)
            try:
                peeked = first_calls_alone("peek_messages", partial(_peek, client, size))
            except ResourceNotFoundError:
                return []  # the host creates a poison queue on first use
            return [self._view(queue, function, message) for message in peeked]

        threads = max(1, min(PEEK_THREADS, len(self._sources)))
        with ThreadPoolExecutor(threads, thread_name_prefix="sas-poison-peek") as pool:
            found = [m for part in pool.map(peek, self._sources.items()) for m in part]
        return oldest_first(found)[:limit]

    def replay(self, poison_id: str) -> bool:
        return self._take(poison_id, replay=True)

    def discard(self, poison_id: str) -> bool:
        return self._take(poison_id, replay=False)

    def requeue(self, queue: str, body: bytes, *, message_id: str) -> None:
        """``body`` as Base64 text, which the queue trigger decodes back to exactly ``body``
        (host.json messageEncoding; what StorageQueueTransport's encode policy does)."""
        if queue not in self._sources:
            raise IllegalTransition(f"{queue} is not a queue the app consumes")
        try:
            client, text = self._client(queue), base64.b64encode(body).decode("ascii")
            first_calls_alone("send_message", lambda: client.send_message(text), decoded=sent)
        except ResourceNotFoundError:
            raise NotFound(f"queue {queue} does not exist") from None
        log.info("sas.storage_requeued queue=%s message_id=%s", queue, message_id)

    def _take(self, poison_id: str, *, replay: bool) -> bool:
        parsed = parse_poison_id(poison_id)
        if parsed is None or parsed[0] not in self._sources:
            return False
        queue, key = parsed
        target = self._find(queue, key)
        if target is None:
            return False
        poison = self._client(queue + POISON_SUFFIX)
        if replay:
            try:
                send = partial(self._client(queue).send_message, target.content)
                first_calls_alone("send_message", send, decoded=sent)
            except Exception as exc:
                self._release(poison, [target])
                if isinstance(exc, ResourceNotFoundError):
                    raise NotFound(f"queue {queue} does not exist") from None
                raise
        try:
            poison.delete_message(target.id, target.pop_receipt)
        except ResourceNotFoundError:
            # The lease ran out and someone else took it: a replay has then sent it twice.
            log.warning(
                "sas.poison_delete_lost",
                extra={"queue": queue, "message_id": target.id, "replayed": replay},
            )
            return replay
        log.info(
            "sas.poison_storage_removed",
            extra={"queue": queue, "message_id": target.id, "replayed": replay},
        )
        return True

    def _find(self, queue: str, key: str) -> QueueMessage | None:
        """Receive until message ``key`` turns up; everything else is handed back at once."""
        poison = self._client(queue + POISON_SUFFIX)
        held: builtins.list[QueueMessage] = []
        target: QueueMessage | None = None
        deadline = time.monotonic() + self._deadline
        try:
            while target is None and len(held) < self._max_scan and time.monotonic() < deadline:
                batch = first_calls_alone(
                    "receive_messages",
                    lambda: builtins.list(
                        poison.receive_messages(
                            max_messages=PEEK_MAX,
                            messages_per_page=PEEK_MAX,
                            visibility_timeout=self._lease,
                        )
                    ),
                )
                if not batch:
                    break
                for message in batch:
                    if target is None and message.id == key:
                        target = message
                    else:
                        held.append(message)
        except ResourceNotFoundError:
            return None
        finally:
            self._release(poison, held)
        return target

    def _release(self, poison: QueueClient, messages: builtins.list[QueueMessage]) -> None:
        for message in messages:
            try:
                poison.update_message(message.id, message.pop_receipt, visibility_timeout=0)
            except HttpResponseError as exc:  # its lease runs out on its own
                log.warning(
                    "sas.poison_release_failed",
                    extra={"message_id": message.id, "error": type(exc).__name__},
                )

    def _view(self, queue: str, function: str, message: QueueMessage) -> ParkedMessage:
        body, decodable = storage_body(message.content or "")
        kept, truncated = bounded(body)
        moved = message.inserted_on  # the poison copy was inserted when the host moved it
        return ParkedMessage(
            id=poison_id(queue, message.id),
            parked_by="host",
            queue=queue,
            function=function,
            reason=storage_reason(queue, decodable=decodable),
            body=kept,
            body_truncated=truncated,
            parked_at=None if moved is None else require_utc(moved, "inserted_on"),
            delivery_count=None,  # the host starts the poison copy afresh
            transport="storage",
        )

    def _client(self, queue: str) -> QueueClient:
        """A raw client: no encode or decode policy, so text goes and comes as it is."""
        client = self._clients.get(queue)
        if client is None:
            with self._lock:
                client = self._clients.get(queue)
                if client is None:
                    client = self._clients[queue] = self._service.get_queue_client(queue)
        return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()


def _peek(client: QueueClient, count: int) -> builtins.list[QueueMessage]:
    return builtins.list(client.peek_messages(max_messages=count))

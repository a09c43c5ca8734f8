"""Queue trigger: the Functions host's polling, lease, retry and poison-queue semantics.

Per queue function: fetch up to ``batchSize`` messages under a lease, run them concurrently,
fetch again once no more than ``newBatchThreshold`` are still running; back off from 100 ms to
``maxPollingInterval`` while the queue is empty, what each wait adds to the first one randomised
by a fifth either way (the host's randomized exponential back-off). Success deletes the
message; a failure makes it visible again after ``visibilityTimeout`` until its dequeue count
reaches ``maxDequeueCount``, then it is copied as-is to ``<queue>-poison`` and deleted.

:meth:`QueuePoller.wake` ends a back-off at once: the worker calls it when a function in the
same process has just put a message on the poller's queue (``watcher.py``), as the Functions
host's shared queue watcher does for messages its own output bindings add.

The dev host's own storage calls (receive, delete, release, poison) go over one session per
worker process (``shared_transport``), not one connection pool per thread.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.core.pipeline.transport import RequestsTransport
from azure.functions.queue import QueueMessage as FunctionQueueMessage
from azure.storage.queue import ExponentialRetry, QueueClient
from azure.storage.queue import QueueMessage as StorageQueueMessage

from sas.adapters.clients import pooled_session
from sas.adapters.storage_queues import first_calls_alone, sent
from sas.domain.wire import POISON_SUFFIX
from sas_local.devhost.config import LEASE_SECONDS, POLLING_JITTER, QueueOptions
from sas_local.devhost.invoke import InvocationContext, arguments, call_sync
from sas_local.devhost.loader import QueueFunction

log = logging.getLogger(__name__)


class InvalidBodyError(ValueError):
    pass


def decode_body(content: str, encoding: str) -> bytes:
    """The bytes the function sees; ``base64`` bodies must be valid Base64 text."""
    if encoding == "none":
        return content.encode("utf-8")
    compact = "".join(content.split())
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidBodyError("message body is not valid Base64") from None


POOL_MAXSIZE = 256
"""Connections the dev host keeps per storage endpoint in a worker: each poller has one receive
and up to ``batchSize + newBatchThreshold`` deletes or releases in flight (6 queue functions
at the defaults: 6 x 25)."""

_transport_lock = threading.Lock()
_transport: RequestsTransport | None = None


def shared_transport() -> RequestsTransport:
    """The transport of every dev-host queue client in this process (created on first use)."""
    global _transport
    with _transport_lock:
        if _transport is None:
            _transport = RequestsTransport(
                session=pooled_session(POOL_MAXSIZE),
                session_owner=False,
                connection_timeout=10,
                read_timeout=30,
            )
        return _transport


def make_client(connection_string: str, queue_name: str) -> QueueClient:
    """A client that sends and receives raw text (no encode/decode policy)."""
    return QueueClient.from_connection_string(
        connection_string,
        queue_name,
        retry_policy=ExponentialRetry(initial_backoff=1, increment_base=2, random_jitter_range=1),
        transport=shared_transport(),
    )


def jittered(delay: float, floor: float, ceiling: float) -> float:
    """One wait of the back-off: what it adds to ``floor`` give or take POLLING_JITTER, as the
    host's randomized back-off draws it; the first wait is ``floor``, the last ``ceiling``."""
    if delay <= floor or delay >= ceiling:
        return min(max(delay, floor), ceiling)
    spread = random.uniform(1 - POLLING_JITTER, 1 + POLLING_JITTER)  # noqa: S311  # spreading polls, not a secret
    return min(floor + (delay - floor) * spread, ceiling)


def ensure_queue(client: QueueClient) -> None:
    with contextlib.suppress(ResourceExistsError):
        client.create_queue()


class QueuePoller:
    def __init__(self, function: QueueFunction, options: QueueOptions, app_dir: Path) -> None:
        self.function = function
        self._options = options
        self._app_dir = app_dir
        self._poison_name = f"{function.queue_name}{POISON_SUFFIX}"
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._changed = threading.Condition()
        self._in_flight = 0
        self._clients: dict[str, QueueClient] = {}
        self._clients_lock = threading.Lock()
        self._poison_created = False
        self._poison_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(
            max_workers=options.max_in_flight, thread_name_prefix=f"devhost-{function.name}"
        )
        self._thread = threading.Thread(
            target=self._run, name=f"devhost-poll-{function.name}", daemon=True
        )

    def _fields(self, **more: Any) -> dict[str, Any]:
        return {"function": self.function.name, "queue": self.function.queue_name, **more}

    def _client(self, queue_name: str) -> QueueClient:
        client = self._clients.get(queue_name)
        if client is None:
            with self._clients_lock:
                client = self._clients.get(queue_name)
                if client is None:
                    client = make_client(self.function.connection_string, queue_name)
                    self._clients[queue_name] = client
        return client

    def prepare(self) -> None:
        """Create the queue if it is missing (start-up; raises if storage is unreachable)."""
        ensure_queue(self._client(self.function.queue_name))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop fetching; invocations already running carry on."""
        self._stop.set()
        self._wake.set()
        with self._changed:
            self._changed.notify_all()

    def wake(self) -> None:
        """A message was just put on this queue: poll now, and back off from the start again.

        Safe from any thread, at any time: a wake that comes while a receive is under way makes
        the next wait end at once, so a message that receive missed is fetched right after."""
        self._wake.set()

    def wait_idle(self, deadline: float) -> bool:
        """Wait until the poller and its invocations are done; False if the deadline passed."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._changed:
            while self._in_flight and time.monotonic() < deadline:
                self._changed.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            idle = self._in_flight == 0 and not self._thread.is_alive()
        self._executor.shutdown(wait=False, cancel_futures=False)
        return idle

    def _run(self) -> None:
        options = self._options
        delay = options.min_polling_interval
        source = self.function.queue_name
        while not self._stop.is_set():
            with self._changed:
                while self._in_flight > options.new_batch_threshold and not self._stop.is_set():
                    self._changed.wait(0.5)
            if self._stop.is_set():
                break
            self._wake.clear()  # a wake from here on is for a message this receive may miss
            try:
                receive = partial(
                    _received,
                    self._client(source),
                    max_messages=options.batch_size,
                    messages_per_page=options.batch_size,
                    visibility_timeout=LEASE_SECONDS,
                    retry_total=0,  # this loop backs off itself and stays stoppable
                )
                messages = first_calls_alone("receive_messages", receive)
            except Exception as exc:  # storage down or flaky: log, back off, keep polling
                log.warning(
                    "sas.devhost.receive_failed",
                    extra=self._fields(error=type(exc).__name__, retry_in_s=round(delay, 3)),
                )
                self._stop.wait(delay)
                delay = min(delay * 2, options.max_polling_interval)
                continue
            if not messages:
                woken = self._wake.wait(
                    jittered(delay, options.min_polling_interval, options.max_polling_interval)
                )
                delay = (
                    options.min_polling_interval
                    if woken
                    else min(delay * 2, options.max_polling_interval)
                )
                continue
            delay = options.min_polling_interval
            if self._stop.is_set():
                for message in messages:  # fetched while stopping: hand them back at once
                    try:
                        self._release(message, 0)
                    except Exception as exc:  # the lease expires on its own
                        log.warning(
                            "sas.devhost.release_failed",
                            extra=self._fields(message_id=message.id, error=type(exc).__name__),
                        )
                break
            for message in messages:
                with self._changed:
                    self._in_flight += 1
                self._executor.submit(self._process, message)

    def _process(self, message: StorageQueueMessage) -> None:
        try:
            self._handle(message)
        except Exception as exc:  # a storage call failed; the lease expires and it comes back
            log.error(
                "sas.devhost.message_handling_failed",
                extra=self._fields(message_id=message.id, error=type(exc).__name__),
            )
        finally:
            with self._changed:
                self._in_flight -= 1
                self._changed.notify_all()

    def _handle(self, message: StorageQueueMessage) -> None:
        dequeue_count = int(message.dequeue_count or 1)
        fields = self._fields(message_id=message.id, dequeue_count=dequeue_count)
        content: str = message.content or ""
        if dequeue_count > self._options.max_dequeue_count:
            # Dequeued too often without a recorded failure (its worker died mid-invocation).
            log.error("sas.devhost.message_poisoned", extra={**fields, "reason": "dequeue_count"})
            self._poison(message, content)
            return
        try:
            body = decode_body(content, self._options.message_encoding)
        except InvalidBodyError:
            log.error("sas.devhost.message_poisoned", extra={**fields, "reason": "invalid_base64"})
            self._poison(message, content)
            return
        trigger_message = FunctionQueueMessage(  # type: ignore[no-untyped-call]
            id=message.id,
            body=body,
            dequeue_count=dequeue_count,
            expiration_time=message.expires_on,
            insertion_time=message.inserted_on,
            time_next_visible=message.next_visible_on,
            pop_receipt=message.pop_receipt,
        )
        function = self.function
        context = InvocationContext(function.name, self._app_dir)
        started = time.monotonic()
        try:
            call_sync(
                function.fn,
                arguments(function.fn, function.arg_name, trigger_message, context),
                context.invocation_id,
            )
        except Exception:
            elapsed = round((time.monotonic() - started) * 1000, 1)
            log.exception(
                "sas.devhost.invocation_failed",
                extra={**fields, "invocation_id": context.invocation_id, "duration_ms": elapsed},
            )
            if dequeue_count >= self._options.max_dequeue_count:
                log.error(
                    "sas.devhost.message_poisoned",
                    extra={**fields, "reason": "max_dequeue_count"},
                )
                self._poison(message, content)
            else:
                self._release(message)
            return
        elapsed = round((time.monotonic() - started) * 1000, 1)
        log.debug(
            "sas.devhost.invocation_succeeded",
            extra={**fields, "invocation_id": context.invocation_id, "duration_ms": elapsed},
        )
        self._delete(message)

    def _release(self, message: StorageQueueMessage, visible_in: int | None = None) -> None:
        if visible_in is None:
            visible_in = math.ceil(self._options.visibility_timeout)
        self._client(self.function.queue_name).update_message(
            message.id, message.pop_receipt, visibility_timeout=visible_in
        )

    def _delete(self, message: StorageQueueMessage) -> None:
        try:
            self._client(self.function.queue_name).delete_message(message.id, message.pop_receipt)
        except ResourceNotFoundError:
            # Lease lost (another worker holds it now) or a retried delete that had succeeded.
            log.warning("sas.devhost.delete_not_found", extra=self._fields(message_id=message.id))

    def _poison(self, message: StorageQueueMessage, content: str) -> None:
        poison = self._client(self._poison_name)
        with self._poison_lock:
            if not self._poison_created:
                ensure_queue(poison)
                self._poison_created = True
        first_calls_alone("send_message", partial(poison.send_message, content), decoded=sent)
        self._delete(message)


def _received(client: QueueClient, **options: Any) -> list[StorageQueueMessage]:
    return list(client.receive_messages(**options))

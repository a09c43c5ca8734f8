"""ServiceBusDeadLetters at the SDK boundary: what it asks of ``ServiceBusClient`` and its
dead-letter receivers, with a recording fake standing in for the broker (no emulator speaks
Service Bus's AMQP dialect here)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from sas.adapters.poison_servicebus import ServiceBusDeadLetters
from sas.adapters.servicebus import DEFAULT_SEND_TIMEOUT
from sas.domain.errors import IllegalTransition, NotFound
from sas.domain.parked import parse_poison_id, poison_id
from sas.settings import Connection
from sas.testing import FakeClock

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SOURCES = {"sas-orders": "submit", "sas-agent-payment": "agent_payment"}
SECRET_BODY = b'{"type": "StepRequest", "card": "4111-secret"}'
REASON = "MaxDeliveryCountExceeded"
DESCRIPTION = "Message could not be consumed after 5 delivery attempts."


def received_properties() -> dict[str | bytes, Any]:
    """As the SDK hands them over: bytes keys and values, the broker's two included."""
    return {
        b"DeadLetterReason": REASON.encode(),
        b"DeadLetterErrorDescription": DESCRIPTION.encode(),
        b"traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }


@dataclass
class Received:
    """The attributes of a ServiceBusReceivedMessage the adapter reads."""

    sequence_number: int | None
    body: Any = (SECRET_BODY[:10], SECRET_BODY[10:])  # a data body comes in chunks
    message_id: str | None = "order-1:charge:2"
    correlation_id: str | None = "order-1"
    content_type: str | None = "application/json"
    subject: str | None = "StepRequest"
    application_properties: dict[str | bytes, Any] | None = field(
        default_factory=lambda: received_properties()
    )
    delivery_count: int | None = 5
    enqueued_time_utc: datetime | None = NOW - timedelta(hours=1)
    dead_letter_reason: str | None = REASON
    dead_letter_error_description: str | None = DESCRIPTION


class Broker:
    """Dead-letter queues by queue name, with peek-lock semantics, and the events in order."""

    def __init__(self) -> None:
        self.dead: dict[str, list[Received]] = {}
        self.locked: set[int] = set()
        self.events: list[tuple[str, str, int | None]] = []
        self.missing: set[str] = set()
        self.missing_senders: set[str] = set()

    def add(self, queue: str, *messages: Received) -> list[str]:
        self.dead.setdefault(queue, []).extend(messages)
        return [poison_id(queue, str(m.sequence_number)) for m in messages]


class FakeReceiver:
    def __init__(self, broker: Broker, queue: str, **options: Any) -> None:
        self.broker, self.queue, self.options = broker, queue, options
        self.closed = False
        self.waits: list[float | None] = []

    def _check(self) -> list[Received]:
        if self.queue in self.broker.missing:
            raise MessagingEntityNotFoundError(message="amqp:not-found")
        return self.broker.dead.setdefault(self.queue, [])

    def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, timeout: float | None = None
    ) -> list[Received]:
        self.broker.events.append(("peek", self.queue, None))
        return [replace(m) for m in self._check()[:max_message_count]]

    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[Received]:
        self.waits.append(max_wait_time)
        available = [m for m in self._check() if m.sequence_number not in self.broker.locked]
        batch = available[: max_message_count or 1]
        for message in batch:
            assert message.sequence_number is not None
            self.broker.locked.add(message.sequence_number)
        return batch

    def complete_message(self, message: Received) -> None:
        assert message.sequence_number in self.broker.locked, "completing an unlocked message"
        self.broker.events.append(("complete", self.queue, message.sequence_number))
        self.broker.locked.discard(message.sequence_number)
        self.broker.dead[self.queue].remove(message)

    def abandon_message(self, message: Received) -> None:
        assert message.sequence_number in self.broker.locked, "abandoning an unlocked message"
        self.broker.events.append(("abandon", self.queue, message.sequence_number))
        self.broker.locked.discard(message.sequence_number)
        message.delivery_count = (message.delivery_count or 0) + 1

    def close(self) -> None:
        self.closed = True


class FakeSender:
    def __init__(self, broker: Broker, queue: str) -> None:
        self.broker, self.queue = broker, queue
        self.sent: list[ServiceBusMessage] = []
        self.timeouts: list[float | None] = []
        self.closed = False

    def send_messages(self, message: ServiceBusMessage, *, timeout: float | None = None) -> None:
        if self.queue in self.broker.missing | self.broker.missing_senders:
            raise MessagingEntityNotFoundError(message="amqp:not-found")
        self.broker.events.append(("send", self.queue, None))
        self.sent.append(message)
        self.timeouts.append(timeout)

    def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.receivers: list[FakeReceiver] = []
        self.senders: list[FakeSender] = []
        self.closed = False

    def get_queue_receiver(self, queue_name: str, **options: Any) -> FakeReceiver:
        receiver = FakeReceiver(self.broker, queue_name, **options)
        self.receivers.append(receiver)
        return receiver

    def get_queue_sender(self, queue_name: str) -> FakeSender:
        sender = FakeSender(self.broker, queue_name)
        self.senders.append(sender)
        return sender

    def close(self) -> None:
        self.closed = True

    def sent(self) -> list[ServiceBusMessage]:
        return [message for sender in self.senders for message in sender.sent]


@pytest.fixture
def broker() -> Broker:
    return Broker()


@pytest.fixture
def client(broker: Broker) -> FakeClient:
    return FakeClient(broker)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def dead(client: FakeClient, clock: FakeClock) -> ServiceBusDeadLetters:
    return ServiceBusDeadLetters(lambda: client, SOURCES, clock, max_scan=50)


def body_of(message: ServiceBusMessage) -> bytes:
    return b"".join(message.body)


def test_list_reads_reason_description_delivery_count_and_body(dead, broker, client, clock):
    (first,) = broker.add("sas-orders", Received(7, delivery_count=5))
    (second,) = broker.add(
        "sas-agent-payment",
        Received(
            12,
            body=[b"\xff\x00"],
            enqueued_time_utc=NOW - timedelta(minutes=3),
            dead_letter_reason="TTLExpiredException",
            dead_letter_error_description=None,
        ),
    )
    broker.add("sas-alerts", Received(99))  # not a queue the app consumes

    listed = {m.id: m for m in dead.list()}

    assert list(listed) == [first, second]  # oldest first
    orders, payment = listed[first], listed[second]
    assert (orders.parked_by, orders.queue, orders.function, orders.transport) == (
        "host",
        "sas-orders",
        "submit",
        "servicebus",
    )
    assert orders.reason == f"{REASON}: {DESCRIPTION}"
    assert orders.delivery_count == 5 and orders.body == SECRET_BODY
    assert orders.age(clock.now()) == timedelta(hours=1)
    assert orders.parked_at == NOW - timedelta(hours=1)  # not said when: since enqueued
    assert parse_poison_id(orders.id) == ("sas-orders", "7")
    assert payment.reason == "TTLExpiredException" and payment.body == b"\xff\x00"
    assert payment.function == "agent_payment"
    assert payment.age(clock.now()) == timedelta(minutes=3)
    # Browsing only: dead-letter sub-queues, nothing locked, every receiver closed.
    assert {r.queue for r in client.receivers} == set(SOURCES)
    for receiver in client.receivers:
        assert receiver.options["sub_queue"] == ServiceBusSubQueue.DEAD_LETTER
        assert receiver.closed
    assert broker.locked == set() and all(kind == "peek" for kind, _, _ in broker.events)
    assert [m.id for m in dead.list(limit=1)] == [first]


def test_a_missing_queue_is_skipped_when_listing(dead, broker):
    (kept,) = broker.add("sas-orders", Received(1))
    broker.missing.add("sas-agent-payment")
    assert [m.id for m in dead.list()] == [kept]


def test_replay_sends_an_identical_copy_then_completes(dead, broker, client):
    (target,) = broker.add("sas-agent-payment", Received(42))

    assert dead.replay(target) is True

    (copy,) = client.sent()
    assert client.senders[0].queue == "sas-agent-payment"
    assert body_of(copy) == SECRET_BODY
    assert (copy.content_type, copy.message_id, copy.correlation_id, copy.subject) == (
        "application/json",
        "order-1:charge:2",
        "order-1",
        "StepRequest",
    )
    # The application's properties travel; the broker's dead-letter ones do not.
    assert copy.application_properties == {
        "traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    }
    assert broker.events[-2:] == [
        ("send", "sas-agent-payment", None),
        ("complete", "sas-agent-payment", 42),
    ]
    assert broker.dead["sas-agent-payment"] == []
    assert client.senders[0].closed and client.senders[0].timeouts == [DEFAULT_SEND_TIMEOUT]
    receiver = client.receivers[-1]
    assert receiver.options["sub_queue"] == ServiceBusSubQueue.DEAD_LETTER
    assert receiver.options["receive_mode"] == ServiceBusReceiveMode.PEEK_LOCK
    assert receiver.closed
    # A second replay of the same id finds nothing and sends nothing.
    assert dead.replay(target) is False
    assert len(client.sent()) == 1


def test_discard_completes_without_sending(dead, broker, client):
    target, kept = broker.add("sas-orders", Received(1), Received(2))

    assert dead.discard(target) is True

    assert client.sent() == []
    assert [m.sequence_number for m in broker.dead["sas-orders"]] == [2]
    assert dead.discard(target) is False
    assert [m.id for m in dead.list()] == [kept]


def test_messages_received_on_the_way_are_abandoned_not_completed(dead, broker):
    ids = broker.add("sas-orders", *(Received(n) for n in range(1, 6)))

    assert dead.replay(ids[3]) is True

    settled = [(kind, seq) for kind, _, seq in broker.events if kind in ("complete", "abandon")]
    assert sorted(settled) == [
        ("abandon", 1),
        ("abandon", 2),
        ("abandon", 3),
        ("abandon", 5),
        ("complete", 4),
    ]
    assert broker.locked == set()
    assert [m.sequence_number for m in broker.dead["sas-orders"]] == [1, 2, 3, 5]


def test_an_unknown_id_is_not_found_and_everything_received_goes_back(dead, broker, client):
    broker.add("sas-orders", Received(1), Received(2))

    assert dead.replay(poison_id("sas-orders", "999")) is False
    assert dead.discard(poison_id("sas-orders", "999")) is False

    assert client.sent() == []
    assert broker.locked == set() and len(broker.dead["sas-orders"]) == 2
    assert {kind for kind, _, _ in broker.events} == {"abandon"}
    assert all(wait is not None and wait <= 5 for r in client.receivers for wait in r.waits)


@pytest.mark.parametrize(
    "unknown",
    [
        "nope",
        poison_id("sas-alerts", "1"),  # a well-formed id of a queue the app does not consume
        poison_id("sas-orders", "not-a-number"),
        poison_id("sas-orders", "1") + "x",
    ],
)
def test_malformed_or_foreign_ids_touch_nothing(dead, broker, client, unknown):
    broker.add("sas-orders", Received(1))
    broker.add("sas-alerts", Received(1))
    assert dead.replay(unknown) is False
    assert dead.discard(unknown) is False
    assert client.receivers == [] and client.sent() == []


def test_a_missing_queue_means_nothing_to_replay_or_discard(dead, broker):
    broker.missing.add("sas-orders")
    assert dead.replay(poison_id("sas-orders", "1")) is False
    assert dead.discard(poison_id("sas-orders", "1")) is False


def test_replay_to_a_missing_source_queue_is_not_found_and_the_message_stays(dead, broker, client):
    (target,) = broker.add("sas-orders", Received(3))
    broker.missing_senders.add("sas-orders")  # the queue went away; its dead letters did not

    with pytest.raises(NotFound):
        dead.replay(target)

    assert broker.events[-1] == ("abandon", "sas-orders", 3)
    assert broker.locked == set() and len(broker.dead["sas-orders"]) == 1
    assert client.senders[0].closed


def test_replay_within_the_duplicate_detection_window_is_refused(dead, broker, client):
    (target,) = broker.add("sas-orders", Received(8, enqueued_time_utc=NOW - timedelta(minutes=4)))

    with pytest.raises(IllegalTransition, match="2026-11-22T12:06:00Z"):
        dead.replay(target)

    assert client.sent() == []  # Service Bus would have dropped it silently: lost
    assert broker.events[-1] == ("abandon", "sas-orders", 8)
    assert dead.discard(target) is True  # discarding needs no wait


def test_the_search_is_bounded(client, clock, broker):
    dead = ServiceBusDeadLetters(lambda: client, SOURCES, clock, max_scan=40, receive_wait=0.5)
    ids = broker.add("sas-orders", *(Received(n) for n in range(1, 201)))

    assert dead.discard(ids[150]) is False  # beyond what one search may hold

    receiver = client.receivers[-1]
    assert 1 <= len(receiver.waits) <= 2 and set(receiver.waits) == {0.5}
    assert broker.locked == set() and len(broker.dead["sas-orders"]) == 200


def test_logs_never_carry_bodies(dead, broker, caplog):
    caplog.set_level(logging.DEBUG)
    replayed, discarded = broker.add("sas-orders", Received(1), Received(2))
    dead.list()
    dead.replay(replayed)
    dead.discard(discarded)
    assert "sas-orders" in caplog.text
    assert "secret" not in caplog.text and "4111" not in caplog.text


def test_from_connection_connects_on_first_use_only(monkeypatch, broker, clock):
    made: list[str] = []

    def from_connection_string(connection_string: str) -> FakeClient:
        made.append(connection_string)
        return FakeClient(broker)

    monkeypatch.setattr(ServiceBusClient, "from_connection_string", from_connection_string)
    conn = Connection(
        setting="SasServiceBus",
        connection_string="Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;"
        "SharedAccessKey=c2VjcmV0",
    )
    dead = ServiceBusDeadLetters.from_connection(conn, SOURCES, clock)
    assert made == []
    assert dead.list() == []
    dead.list()
    assert len(made) == 1


# --- requeue: an operator replaying a message the app parked (rejected) --------------------

PARKED_ID = "20261122T120000.000000Z-0123456789ab"


def test_requeue_sends_the_raw_body_under_the_given_message_id(dead, broker, client):
    dead.requeue("sas-agent-payment", SECRET_BODY, message_id=PARKED_ID)

    (sent,) = client.sent()
    assert client.senders[0].queue == "sas-agent-payment"
    assert body_of(sent) == SECRET_BODY  # what the function's get_body() returns
    assert sent.message_id == PARKED_ID  # a crash before the drop re-sends a duplicate
    assert client.senders[0].timeouts == [DEFAULT_SEND_TIMEOUT] and client.senders[0].closed
    assert client.receivers == []  # no dead-letter queue is touched
    assert broker.events == [("send", "sas-agent-payment", None)]


def test_requeue_of_a_binary_body_keeps_every_byte(dead, client):
    dead.requeue("sas-orders", b"\xff\x00\xfe", message_id=PARKED_ID)
    (sent,) = client.sent()
    assert body_of(sent) == b"\xff\x00\xfe"


@pytest.mark.parametrize("queue", ["sas-alerts", "sas-orders/$DeadLetterQueue", "elsewhere"])
def test_requeue_goes_only_to_a_queue_the_app_consumes(dead, client, queue):
    with pytest.raises(IllegalTransition):
        dead.requeue(queue, SECRET_BODY, message_id=PARKED_ID)
    assert client.senders == [] and client.sent() == []


def test_requeue_to_a_missing_queue_is_not_found(dead, broker, client):
    broker.missing_senders.add("sas-orders")
    with pytest.raises(NotFound):
        dead.requeue("sas-orders", SECRET_BODY, message_id=PARKED_ID)
    assert client.senders[0].closed


def test_requeue_logs_never_carry_the_body(dead, caplog):
    caplog.set_level(logging.DEBUG)
    dead.requeue("sas-orders", SECRET_BODY, message_id=PARKED_ID)
    assert "sas-orders" in caplog.text and PARKED_ID in caplog.text
    assert "secret" not in caplog.text and "4111" not in caplog.text

"""ServiceBusTransport at the SDK boundary: what reaches ``ServiceBusSender.send_messages``.

No broker speaks Service Bus's AMQP dialect here, so a recording client stands in for
``ServiceBusClient``; tests/integration/test_servicebus_live.py checks the same contract
against a real namespace when one is configured.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.identity import DefaultAzureCredential, ManagedIdentityCredential
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
)
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from sas.adapters import clients
from sas.adapters import servicebus as sb
from sas.adapters.servicebus import ServiceBusTransport
from sas.domain.errors import ConfigurationError, NotFound
from sas.domain.messages import OperatorAlert, ScheduleRequest, StepRequest, encode
from sas.settings import Connection
from sas.testing import FakeClock, InMemoryStore, instance
from tests.workflows import REGISTRY, basket

pytestmark = pytest.mark.unit

NAMESPACE = "sas-test.servicebus.windows.net"
SECRET = "c2VjcmV0LWtleS1uZXZlci1sb2dnZWQ="
CONNECTION_STRING = f"Endpoint=sb://{NAMESPACE}/;SharedAccessKeyName=send;SharedAccessKey={SECRET}"
CLIENT_ID = "11111111-2222-3333-4444-555555555555"


class FakeSender:
    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.sent: list[ServiceBusMessage] = []
        self.timeouts: list[float | None] = []
        self.error: Exception | None = None
        self.closed = False
        self.overlaps = 0
        self._busy = False

    def send_messages(self, message: ServiceBusMessage, *, timeout: float | None = None) -> None:
        if self._busy:  # two threads inside one sender at once: the adapter must prevent it
            self.overlaps += 1
        self._busy = True
        try:
            for _ in range(2):  # before and during the "network" wait
                if self.closed:  # like the SDK: a closed handler refuses to send
                    raise ValueError("The handler has already been shutdown")
                time.sleep(0.0005)
            if self.error is not None:
                raise self.error
            self.sent.append(message)
            self.timeouts.append(timeout)
        finally:
            self._busy = False

    def close(self) -> None:
        self.closed = True


@dataclass
class FakePeeked:
    enqueued_time_utc: datetime | None
    state: Any = None
    body: Any = b""


class FakeReceiver:
    def __init__(self, waiting: list[FakePeeked]) -> None:
        self.waiting = waiting
        self.closed = False

    def peek_messages(self, max_message_count: int = 1) -> list[FakePeeked]:
        return self.waiting[:max_message_count]

    def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self) -> None:
        self.senders: dict[str, list[FakeSender]] = {}
        self.created: Counter[str] = Counter()
        self.closed = False
        self.fail_next: dict[str, Exception] = {}
        self.receivers: list[str] = []
        self.waiting: dict[str, list[FakePeeked]] = {}

    def get_queue_receiver(self, queue_name: str) -> FakeReceiver:
        self.receivers.append(queue_name)
        return FakeReceiver(self.waiting.get(queue_name, []))

    def get_queue_sender(self, queue_name: str) -> FakeSender:
        self.created[queue_name] += 1
        sender = FakeSender(queue_name)
        if queue_name in self.fail_next:
            sender.error = self.fail_next.pop(queue_name)
        self.senders.setdefault(queue_name, []).append(sender)
        return sender

    def close(self) -> None:
        self.closed = True

    def sent(self, queue: str) -> list[ServiceBusMessage]:
        return [message for sender in self.senders.get(queue, []) for message in sender.sent]


class Factory:
    """Counts how often the adapter asks for a client."""

    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.calls = 0

    def __call__(self) -> FakeClient:
        self.calls += 1
        return self.client


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 11, 22, 12, 0, tzinfo=UTC))


@pytest.fixture
def client() -> FakeClient:
    return FakeClient()


@pytest.fixture
def factory(client: FakeClient) -> Factory:
    return Factory(client)


@pytest.fixture
def transport(factory: Factory, clock: FakeClock) -> ServiceBusTransport:
    return ServiceBusTransport(factory, clock)


def step_request(clock: FakeClock, attempt: int = 2) -> StepRequest:
    return StepRequest(
        order_id="order-1",
        step="charge",
        step_index=1,
        attempt=attempt,
        action="charge",
        complete_by=clock.now() + timedelta(seconds=30),
        idempotency_key="order-1:charge",
        payload={"amount_cents": 1250},
    )


def body_of(message: ServiceBusMessage) -> bytes:
    return b"".join(message.body)


# --- what is sent --------------------------------------------------------------------------


def test_send_sets_ids_subject_content_type_and_body(
    transport: ServiceBusTransport, client: FakeClient, clock: FakeClock
) -> None:
    request = step_request(clock)

    transport.send(
        "sas-agent-payment",
        request,
        message_id="order-1:charge:2",
        correlation_id="order-1",
    )

    [sent] = client.sent("sas-agent-payment")
    assert sent.message_id == "order-1:charge:2"
    assert sent.correlation_id == "order-1"
    assert sent.subject == "StepRequest"
    assert sent.content_type == "application/json"
    assert body_of(sent) == encode(request)
    assert sent.scheduled_enqueue_time_utc is None
    assert not sent.application_properties  # no active span: no trace context


def test_subject_is_the_message_type(
    transport: ServiceBusTransport, client: FakeClient, clock: FakeClock
) -> None:
    alert = OperatorAlert(
        alert_id="order-9:alert:1:0",
        order_id="order-9",
        reason="compensation failed",
        at=clock.now(),
    )

    transport.send("sas-alerts", alert, message_id="order-9:alert", correlation_id="order-9")

    [sent] = client.sent("sas-alerts")
    assert sent.subject == "OperatorAlert"
    assert body_of(sent) == encode(alert)


def test_delay_schedules_enqueue_at_clock_now_plus_delay(
    transport: ServiceBusTransport, client: FakeClient, clock: FakeClock
) -> None:
    transport.send(
        "sas-scheduler",
        ScheduleRequest(order_id="order-2"),
        message_id="order-2:schedule:3",
        correlation_id="order-2",
        delay_seconds=12.5,
    )

    [sent] = client.sent("sas-scheduler")
    scheduled = sent.scheduled_enqueue_time_utc
    assert scheduled is not None
    assert scheduled.utcoffset() == timedelta(0)
    assert scheduled == datetime(2026, 11, 22, 12, 0, 12, 500_000, tzinfo=UTC)


def test_zero_delay_sends_immediately(
    transport: ServiceBusTransport, client: FakeClient, clock: FakeClock
) -> None:
    clock.advance(3600)
    transport.send(
        "sas-scheduler",
        ScheduleRequest(order_id="order-3"),
        message_id="order-3:schedule:1",
        correlation_id="order-3",
        delay_seconds=0,
    )

    [sent] = client.sent("sas-scheduler")
    assert sent.scheduled_enqueue_time_utc is None


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf")])
def test_invalid_delay_is_refused_before_connecting(
    transport: ServiceBusTransport, factory: Factory, delay: float
) -> None:
    with pytest.raises(ValueError, match="delay_seconds"):
        transport.send(
            "sas-scheduler",
            ScheduleRequest(order_id="order-4"),
            message_id="order-4:schedule:1",
            correlation_id="order-4",
            delay_seconds=delay,
        )
    assert factory.calls == 0


def test_naive_clock_is_rejected(client: FakeClient, factory: Factory) -> None:
    naive = FakeClock(datetime(2026, 11, 22, 12, 0))  # naive on purpose
    transport = ServiceBusTransport(factory, naive)

    with pytest.raises(ValueError, match="timezone-aware"):
        transport.send(
            "sas-scheduler",
            ScheduleRequest(order_id="order-5"),
            message_id="order-5:schedule:1",
            correlation_id="order-5",
            delay_seconds=5,
        )
    assert client.sent("sas-scheduler") == []


def test_active_span_travels_as_w3c_trace_context(
    transport: ServiceBusTransport, client: FakeClient
) -> None:
    context = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("sas", "t61rcWkgMzE")]),
    )

    with trace.use_span(NonRecordingSpan(context)):
        transport.send(
            "sas-scheduler",
            ScheduleRequest(order_id="order-6"),
            message_id="order-6:schedule:1",
            correlation_id="order-6",
        )

    [sent] = client.sent("sas-scheduler")
    assert sent.application_properties == {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "sas=t61rcWkgMzE",
    }


def test_unsampled_span_without_state_sends_traceparent_only(
    transport: ServiceBusTransport, client: FakeClient
) -> None:
    context = SpanContext(trace_id=1, span_id=2, is_remote=True)

    with trace.use_span(NonRecordingSpan(context)):
        transport.send(
            "sas-scheduler",
            ScheduleRequest(order_id="order-7"),
            message_id="order-7:schedule:1",
            correlation_id="order-7",
        )

    [sent] = client.sent("sas-scheduler")
    assert sent.application_properties == {
        "traceparent": "00-00000000000000000000000000000001-0000000000000002-00"
    }


def test_send_timeout_is_passed_to_the_sdk(
    factory: Factory, client: FakeClient, clock: FakeClock
) -> None:
    transport = ServiceBusTransport(factory, clock, send_timeout=7.5)

    transport.send(
        "sas-replies",
        ScheduleRequest(order_id="order-8"),
        message_id="order-8:x",
        correlation_id="order-8",
    )

    assert client.senders["sas-replies"][0].timeouts == [7.5]


# --- client and sender lifecycle -----------------------------------------------------------


def test_nothing_connects_before_the_first_send(factory: Factory, clock: FakeClock) -> None:
    ServiceBusTransport(factory, clock)

    assert factory.calls == 0


def test_one_client_and_one_sender_per_queue_are_reused(
    transport: ServiceBusTransport, factory: Factory, client: FakeClient
) -> None:
    for n in range(3):
        for queue in ("sas-scheduler", "sas-replies"):
            transport.send(
                queue,
                ScheduleRequest(order_id=f"order-{n}"),
                message_id=f"order-{n}:{queue}",
                correlation_id=f"order-{n}",
            )

    assert factory.calls == 1
    assert client.created == {"sas-scheduler": 1, "sas-replies": 1}
    assert len(client.sent("sas-scheduler")) == 3
    assert len(client.sent("sas-replies")) == 3


def test_concurrent_sends_share_one_client_and_never_overlap_on_a_sender(
    transport: ServiceBusTransport, factory: Factory, client: FakeClient
) -> None:
    threads = 16
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            barrier.wait()
            for i in range(5):
                transport.send(
                    "sas-orders" if n % 2 else "sas-scheduler",
                    ScheduleRequest(order_id=f"order-{n}-{i}"),
                    message_id=f"order-{n}-{i}",
                    correlation_id=f"order-{n}-{i}",
                )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=30)

    assert errors == []
    assert factory.calls == 1
    assert client.created == {"sas-orders": 1, "sas-scheduler": 1}
    assert len(client.sent("sas-orders")) + len(client.sent("sas-scheduler")) == threads * 5
    assert all(s.overlaps == 0 for senders in client.senders.values() for s in senders)


def test_close_closes_senders_and_client_and_a_later_send_reconnects(
    transport: ServiceBusTransport, factory: Factory, client: FakeClient
) -> None:
    transport.send(
        "sas-replies", ScheduleRequest(order_id="o-1"), message_id="a", correlation_id="o-1"
    )
    first_sender = client.senders["sas-replies"][0]

    transport.close()
    transport.close()  # idempotent

    assert first_sender.closed
    assert client.closed
    transport.send(
        "sas-replies", ScheduleRequest(order_id="o-1"), message_id="b", correlation_id="o-1"
    )
    assert factory.calls == 2
    assert client.created["sas-replies"] == 2


def test_close_while_sends_are_in_flight_loses_no_send(
    transport: ServiceBusTransport, client: FakeClient
) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []
    sent = Counter[int]()

    def worker(n: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                transport.send(
                    "sas-scheduler",
                    ScheduleRequest(order_id=f"order-{n}-{i}"),
                    message_id=f"order-{n}-{i}",
                    correlation_id=f"order-{n}-{i}",
                )
                sent[n] += 1
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            i += 1

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in pool:
        thread.start()
    for _ in range(10):
        time.sleep(0.01)
        transport.close()
    stop.set()
    for thread in pool:
        thread.join(timeout=30)

    assert errors == []
    assert len(client.sent("sas-scheduler")) == sum(sent.values()) > 0
    assert client.created["sas-scheduler"] > 1  # reopened after each close


def test_close_before_any_send_does_not_connect(
    transport: ServiceBusTransport, factory: Factory
) -> None:
    transport.close()

    assert factory.calls == 0


# --- errors --------------------------------------------------------------------------------


def test_missing_queue_raises_not_found_and_drops_the_sender(
    transport: ServiceBusTransport, client: FakeClient
) -> None:
    client.fail_next["sas-missing"] = MessagingEntityNotFoundError(message="amqp:not-found")

    with pytest.raises(NotFound, match="sas-missing") as raised:
        transport.send(
            "sas-missing",
            ScheduleRequest(order_id="order-1"),
            message_id="order-1:x",
            correlation_id="order-1",
        )

    assert isinstance(raised.value.__cause__, MessagingEntityNotFoundError)
    [broken] = client.senders["sas-missing"]
    assert broken.closed
    # Once the queue exists, the next send attaches a fresh sender.
    transport.send(
        "sas-missing",
        ScheduleRequest(order_id="order-1"),
        message_id="order-1:y",
        correlation_id="order-1",
    )
    assert client.created["sas-missing"] == 2
    assert [m.message_id for m in client.sent("sas-missing")] == ["order-1:y"]


def test_other_service_bus_errors_propagate_unchanged_and_keep_the_sender(
    transport: ServiceBusTransport, client: FakeClient
) -> None:
    failure = ServiceBusConnectionError(message="connection lost")
    client.fail_next["sas-replies"] = failure

    with pytest.raises(ServiceBusConnectionError) as raised:
        transport.send(
            "sas-replies",
            ScheduleRequest(order_id="order-1"),
            message_id="order-1:x",
            correlation_id="order-1",
        )

    assert raised.value is failure
    [sender] = client.senders["sas-replies"]
    assert not sender.closed
    assert client.created["sas-replies"] == 1


def test_a_failing_close_is_logged_not_raised(
    transport: ServiceBusTransport, client: FakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    transport.send(
        "sas-replies", ScheduleRequest(order_id="o-1"), message_id="a", correlation_id="o-1"
    )

    def broken_close() -> None:
        raise ServiceBusConnectionError(message="already gone")

    client.senders["sas-replies"][0].close = broken_close  # type: ignore[method-assign]

    with caplog.at_level(logging.WARNING, logger=sb.__name__):
        transport.close()

    assert "servicebus.close_failed" in caplog.text
    assert client.closed


# --- construction from settings ------------------------------------------------------------


class RecordingServiceBusClient(FakeClient):
    """Stands in for the ServiceBusClient class; records how it was built."""

    built: list[dict[str, Any]] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        RecordingServiceBusClient.built.append(kwargs)

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> RecordingServiceBusClient:
        return cls(conn_str=conn_str, **kwargs)


@pytest.fixture
def recording_client_class(monkeypatch: pytest.MonkeyPatch) -> type[RecordingServiceBusClient]:
    RecordingServiceBusClient.built = []
    monkeypatch.setattr(clients, "ServiceBusClient", RecordingServiceBusClient)
    return RecordingServiceBusClient


class RecordingManagedIdentityCredential(ManagedIdentityCredential):
    made: list[RecordingManagedIdentityCredential] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kwargs = kwargs
        self.was_closed = False
        RecordingManagedIdentityCredential.made.append(self)

    def close(self) -> None:
        self.was_closed = True
        super().close()


def send_one(transport: ServiceBusTransport) -> None:
    transport.send(
        "sas-orders",
        ScheduleRequest(order_id="order-1"),
        message_id="order-1",
        correlation_id="order-1",
    )


def test_connection_string_builds_the_client_from_the_string_on_first_send(
    recording_client_class: type[RecordingServiceBusClient],
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = Connection(setting="SasServiceBus", connection_string=CONNECTION_STRING)

    with caplog.at_level(logging.DEBUG, logger=sb.__name__):
        transport = ServiceBusTransport.from_connection(conn, clock)
        assert recording_client_class.built == []  # lazy
        send_one(transport)
        send_one(transport)

    assert recording_client_class.built == [{"conn_str": CONNECTION_STRING}]
    assert NAMESPACE in caplog.text  # the endpoint labels the logs ...
    assert SECRET not in caplog.text  # ... the key never does
    assert "SharedAccessKey" not in caplog.text


def test_identity_with_client_id_uses_that_managed_identity(
    recording_client_class: type[RecordingServiceBusClient],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import azure.identity

    RecordingManagedIdentityCredential.made = []
    monkeypatch.setattr(
        azure.identity, "ManagedIdentityCredential", RecordingManagedIdentityCredential
    )
    conn = Connection(
        setting="SasServiceBus",
        namespace=NAMESPACE,
        client_id=CLIENT_ID,
        credential="managedidentity",
    )

    transport = ServiceBusTransport.from_connection(conn, clock)
    assert recording_client_class.built == []
    send_one(transport)

    [built] = recording_client_class.built
    assert built["fully_qualified_namespace"] == NAMESPACE
    [credential] = RecordingManagedIdentityCredential.made
    assert built["credential"] is credential
    assert isinstance(credential, ManagedIdentityCredential)
    assert credential.kwargs == {"client_id": CLIENT_ID}

    transport.close()
    assert credential.was_closed


def test_identity_without_client_id_uses_default_azure_credential(
    recording_client_class: type[RecordingServiceBusClient], clock: FakeClock
) -> None:
    conn = Connection(setting="SasServiceBus", namespace=NAMESPACE)

    send_one(ServiceBusTransport.from_connection(conn, clock))

    [built] = recording_client_class.built
    assert built["fully_qualified_namespace"] == NAMESPACE
    assert isinstance(built["credential"], DefaultAzureCredential)
    assert "conn_str" not in built


def test_identity_real_types_with_the_real_client_class(clock: FakeClock) -> None:
    """Without any monkeypatching: builds a real ServiceBusClient (no I/O until a send)."""
    conn = Connection(
        setting="SasServiceBus",
        namespace=NAMESPACE,
        client_id=CLIENT_ID,
        credential="managedidentity",
    )
    transport = ServiceBusTransport.from_connection(conn, clock)

    real_client = transport._client_factory()  # the factory the first send would call

    try:
        assert type(real_client).__name__ == "ServiceBusClient"
        assert real_client.fully_qualified_namespace == NAMESPACE  # type: ignore[attr-defined]
        assert isinstance(real_client._credential, ManagedIdentityCredential)  # type: ignore[attr-defined]
    finally:
        real_client.close()
        transport.close()


def test_connection_without_string_or_namespace_is_a_configuration_error(
    clock: FakeClock,
) -> None:
    with pytest.raises(ConfigurationError, match="SasServiceBus__fullyQualifiedNamespace"):
        ServiceBusTransport.from_connection(Connection(setting="SasServiceBus"), clock)


# --- the credential follows <Conn>__credential (the Functions convention) --------------------


def test_managed_identity_without_client_id_is_the_system_assigned_identity(
    recording_client_class: type[RecordingServiceBusClient],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import azure.identity

    RecordingManagedIdentityCredential.made = []
    monkeypatch.setattr(
        azure.identity, "ManagedIdentityCredential", RecordingManagedIdentityCredential
    )
    conn = Connection(setting="SasServiceBus", namespace=NAMESPACE, credential="managedidentity")

    send_one(ServiceBusTransport.from_connection(conn, clock))

    [built] = recording_client_class.built
    [credential] = RecordingManagedIdentityCredential.made
    assert built["credential"] is credential
    assert credential.kwargs == {"client_id": None}


def test_client_id_without_managed_identity_credential_is_refused_before_any_send(
    recording_client_class: type[RecordingServiceBusClient], clock: FakeClock
) -> None:
    conn = Connection(setting="SasServiceBus", namespace=NAMESPACE, client_id=CLIENT_ID)

    with pytest.raises(ConfigurationError, match="SasServiceBus__clientId"):
        ServiceBusTransport.from_connection(conn, clock)

    assert recording_client_class.built == []


def test_the_service_bus_factory_reuses_the_shared_credential_rule(
    recording_client_class: type[RecordingServiceBusClient],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One rule for every client: from_connection takes its credential from clients.credential."""
    from sas.adapters import clients

    marker = object()
    seen: list[Connection] = []

    def fake_credential(connection: Connection) -> object:
        seen.append(connection)
        return marker

    monkeypatch.setattr(clients, "credential", fake_credential)
    conn = Connection(setting="SasServiceBus", namespace=NAMESPACE)

    send_one(ServiceBusTransport.from_connection(conn, clock))

    assert seen == [conn]
    assert recording_client_class.built[0]["credential"] is marker


def test_default_send_timeout_is_below_the_shortest_step_budget() -> None:
    from sas.declared import registry

    shortest = min(step.budget for w in registry().workflows for step in w.steps)

    assert shortest.total_seconds() > sb.DEFAULT_SEND_TIMEOUT


# --- peeking at a queue's backlog ----------------------------------------------------------


def test_what_waits_is_seen_by_a_peek_that_locks_nothing(
    transport: ServiceBusTransport, client: FakeClient
) -> None:
    enqueued = datetime(2026, 11, 22, 11, 59, tzinfo=UTC)
    client.waiting["sas-replies"] = [FakePeeked(enqueued), FakePeeked(enqueued)]
    assert transport.waiting("sas-replies").oldest == enqueued
    assert client.receivers == ["sas-replies"]
    assert transport.waiting("sas-empty").oldest is None


def test_a_peek_maps_a_missing_queue_to_not_found(
    transport: ServiceBusTransport, client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(self: FakeReceiver, max_message_count: int = 1) -> list[FakePeeked]:
        raise MessagingEntityNotFoundError(message="amqp:not-found")

    monkeypatch.setattr(FakeReceiver, "peek_messages", missing)
    with pytest.raises(NotFound):
        transport.waiting("sas-gone")


# --- priority lanes ------------------------------------------------------------------------


def test_a_high_priority_order_is_sent_on_the_high_lanes(
    client: FakeClient, transport: ServiceBusTransport, clock: FakeClock
) -> None:
    """The services pick the lane; the transport sends to that queue, nothing else changes."""
    from sas.domain.messages import OrderSubmitted, decode
    from sas.domain.wire import PRIORITIES, lane_queue_name
    from sas.services.context import Routes
    from sas.services.submission import SubmissionOutcome

    bases = ("sas-orders", "sas-scheduler", "sas-replies", "sas-agent-inventory")
    routes = Routes(
        "sas-orders",
        "sas-scheduler",
        "sas-replies",
        "sas-alerts",
        {"inventory": "sas-agent-inventory", "payment": "p", "shipping": "s"},
        lanes={base: {p: lane_queue_name(base, p) for p in PRIORITIES} for base in bases},
    )
    order = OrderSubmitted(
        order_id="urgent-1",
        details=basket(address="1 Bus Street", sku="s1"),
        priority="high",
    )
    outcome = instance(InMemoryStore(), transport, routes, clock, REGISTRY).submit(order)
    assert outcome is SubmissionOutcome.ACCEPTED
    (sent,) = client.sent("sas-agent-inventory-high")
    assert client.sent("sas-agent-inventory") == []
    request = decode(StepRequest, body_of(sent))
    assert request.priority == "high"
    assert sent.message_id == f"{request.idempotency_key}:1"
    assert request.idempotency_key.startswith("urgent-1:")
    assert sent.subject == "StepRequest"


def test_the_oldest_waiting_message_of_a_lane_is_peeked_on_that_lane(
    client: FakeClient, transport: ServiceBusTransport, clock: FakeClock
) -> None:
    enqueued = clock.now() - timedelta(seconds=9)
    client.waiting["sas-orders-high"] = [FakePeeked(enqueued)]
    assert transport.waiting("sas-orders-high").oldest == enqueued
    assert transport.waiting("sas-orders").oldest is None
    assert client.receivers == ["sas-orders-high", "sas-orders"]


def test_a_lanes_backlog_counts_only_active_messages(
    client: FakeClient, transport: ServiceBusTransport, clock: FakeClock
) -> None:
    """A peek also returns scheduled (and deferred) messages: a retry's delayed re-ask is no
    backlog, however long ago it was sent."""
    from azure.servicebus import ServiceBusMessageState

    long_ago = clock.now() - timedelta(minutes=5)
    recent = clock.now() - timedelta(seconds=1)
    client.waiting["sas-agent-payment"] = [
        FakePeeked(long_ago, ServiceBusMessageState.SCHEDULED),
        FakePeeked(long_ago, ServiceBusMessageState.DEFERRED),
        FakePeeked(recent, ServiceBusMessageState.ACTIVE),
    ]
    seen = transport.waiting("sas-agent-payment")
    assert (seen.oldest, seen.count) == (recent, 1)


def test_a_peek_returns_the_active_bodies_whole_and_leaves_them(
    client: FakeClient, transport: ServiceBusTransport, clock: FakeClock
) -> None:
    """A data body comes as chunks of bytes; a scheduled message is not waiting yet."""
    from azure.servicebus import ServiceBusMessageState

    now = clock.now()
    client.waiting["sas-alerts"] = [
        FakePeeked(now, ServiceBusMessageState.ACTIVE, [b'{"a":', b"1}"]),
        FakePeeked(now, ServiceBusMessageState.SCHEDULED, [b"later"]),
        FakePeeked(now, None, b"plain"),
    ]
    assert transport.peek("sas-alerts", 10) == [b'{"a":1}', b"plain"]
    assert transport.peek("sas-alerts", 1) == [b'{"a":1}']
    assert client.receivers == ["sas-alerts", "sas-alerts"]


def test_the_context_also_travels_in_the_body_and_an_untraced_body_is_unchanged(
    transport: ServiceBusTransport, client: FakeClient
) -> None:
    context = SpanContext(trace_id=0xAB, span_id=0xCD, is_remote=True)
    with trace.use_span(NonRecordingSpan(context)):
        transport.send("q", ScheduleRequest(order_id="o8"), message_id="m8", correlation_id="o8")
    transport.send("q", ScheduleRequest(order_id="o9"), message_id="m9", correlation_id="o9")

    traced, untraced = client.sent("q")
    parent = f"00-{0xAB:032x}-{0xCD:016x}-00"
    assert traced.application_properties == {"traceparent": parent}
    assert b"".join(traced.body) == encode(
        ScheduleRequest.model_validate({"order_id": "o8", "trace": {"traceparent": parent}})
    )
    assert untraced.application_properties is None
    assert b"".join(untraced.body) == encode(ScheduleRequest(order_id="o9"))


def test_a_received_service_bus_message_continues_the_trace_its_properties_name() -> None:
    from sas.entrypoints.queues import handle

    @dataclass
    class Received:  # the part of the worker's ServiceBusMessage the inbound path reads
        body: bytes
        application_properties: dict[str, object]

        def get_body(self) -> bytes:
            return self.body

    seen: list[str] = []

    def handler(message: ScheduleRequest) -> None:
        seen.append(f"{trace.get_current_span().get_span_context().trace_id:032x}")

    message = Received(
        body=encode(ScheduleRequest(order_id="o1")),
        application_properties={
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        },
    )
    handle(message, function="schedule", queue_setting="x", model=ScheduleRequest, handler=handler)
    assert seen == ["4bf92f3577b34da6a3ce929d0e0e4736"]
    assert not trace.get_current_span().get_span_context().is_valid  # detached afterwards


def test_a_queue_the_identity_may_not_read_leaves_the_other_gauges_sampled(
    client: FakeClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """The depth sampler peeks every queue; a refused peek (no Listen right there) is that
    queue's gauge missing, not every gauge's."""
    from sas.services import metrics
    from sas.services.gauges import QueueGauges

    class Refusing(FakeReceiver):
        def peek_messages(self, max_message_count: int = 1) -> list[FakePeeked]:
            raise ServiceBusAuthorizationError(message="Unauthorized access. 'Listen' claim(s)")

    waiting = [FakePeeked(clock.now()), FakePeeked(clock.now())]
    client.waiting = {"sas-orders": waiting, "sas-replies": waiting[:1]}
    opened = client.get_queue_receiver
    monkeypatch.setattr(
        client,
        "get_queue_receiver",
        lambda queue_name: Refusing([]) if queue_name == "sas-alerts" else opened(queue_name),
    )
    transport = ServiceBusTransport(Factory(client), clock, endpoint=NAMESPACE)
    with pytest.raises(ConfigurationError, match="no right to read Service Bus queue 'sas-alerts'"):
        transport.depth("sas-alerts")
    sampled: dict[str, int] = {}
    monkeypatch.setattr(metrics.queue_depth, "set", sampled.update)
    queues = ("sas-orders", "sas-alerts", "sas-replies")
    gauges = QueueGauges(transport, queues, InMemoryStore(), None, clock)
    with caplog.at_level(logging.WARNING):
        gauges.sample()
    assert sampled == {"sas-orders": 2, "sas-replies": 1}
    assert "sas.gauge_queue_failed queue=sas-alerts error=ConfigurationError" in caplog.text

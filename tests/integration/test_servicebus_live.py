"""Opt-in contract test of ServiceBusTransport against a real Service Bus namespace.

Runs only when one of these is set (skipped otherwise, with the reason shown by ``-ra``):

- ``SAS_TEST_SERVICEBUS_CONNECTION``: a connection string (a namespace with local auth on), or
- ``SAS_TEST_SERVICEBUS_NAMESPACE``: ``<name>.servicebus.windows.net``, signed in with
  azure-identity (``az login``; ``SAS_TEST_SERVICEBUS_CLIENT_ID`` picks a managed identity).
  The principal needs Azure Service Bus Data Sender and Data Receiver on the namespace.

``SAS_TEST_SERVICEBUS_QUEUE`` (default ``sas-contract``) must exist and is drained of this
test's own leftovers, and so must its high-priority lane ``<queue>-high``. Create them once,
e.g. ``az servicebus queue create -g <rg> --namespace-name <ns> -n sas-contract`` (and
``-n sas-contract-high``); a deployment made by infra/ already has every lane of the app's
queues, so ``SAS_TEST_SERVICEBUS_QUEUE=sas-agent-payment`` works there as it is.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from sas.adapters.clients import credential
from sas.adapters.servicebus import ServiceBusTransport
from sas.domain.errors import NotFound
from sas.domain.messages import ScheduleRequest, encode
from sas.services.store_time import SystemClock
from sas.settings import Connection

pytestmark = pytest.mark.integration

CONNECTION_ENV = "SAS_TEST_SERVICEBUS_CONNECTION"
NAMESPACE_ENV = "SAS_TEST_SERVICEBUS_NAMESPACE"
CLIENT_ID_ENV = "SAS_TEST_SERVICEBUS_CLIENT_ID"
QUEUE_ENV = "SAS_TEST_SERVICEBUS_QUEUE"
PREFIX = "contract-"
RECEIVE_DEADLINE = timedelta(seconds=60)
CLOCK_SKEW = timedelta(seconds=2)


@pytest.fixture(scope="module")
def connection() -> Connection:
    if conn_str := os.environ.get(CONNECTION_ENV):
        return Connection(setting=CONNECTION_ENV, connection_string=conn_str)
    if namespace := os.environ.get(NAMESPACE_ENV):
        return Connection(
            setting=NAMESPACE_ENV,
            namespace=namespace,
            client_id=os.environ.get(CLIENT_ID_ENV) or None,
            credential="managedidentity" if os.environ.get(CLIENT_ID_ENV) else None,
        )
    pytest.skip(
        f"live Service Bus contract test: set {CONNECTION_ENV} (connection string) or "
        f"{NAMESPACE_ENV} (<name>.servicebus.windows.net, with az login) to run it"
    )


@pytest.fixture(scope="module")
def queue() -> str:
    return os.environ.get(QUEUE_ENV, "sas-contract")


@pytest.fixture(scope="module")
def transport(connection: Connection) -> Iterator[ServiceBusTransport]:
    sender = ServiceBusTransport.from_connection(connection, SystemClock())
    yield sender
    sender.close()


@pytest.fixture(scope="module")
def receiving_client(connection: Connection) -> Iterator[ServiceBusClient]:
    if connection.connection_string:
        client = ServiceBusClient.from_connection_string(connection.connection_string)
    else:
        assert connection.namespace is not None
        client = ServiceBusClient(connection.namespace, credential(connection))
    with client:
        yield client


def receive(client: ServiceBusClient, queue: str, message_id: str) -> ServiceBusReceivedMessage:
    """Receive until ``message_id`` arrives; complete it and any leftovers of earlier runs."""
    deadline = datetime.now(UTC) + RECEIVE_DEADLINE
    with client.get_queue_receiver(queue_name=queue) as receiver:
        while datetime.now(UTC) < deadline:
            for message in receiver.receive_messages(max_message_count=10, max_wait_time=5):
                if message.message_id == message_id:
                    receiver.complete_message(message)
                    return message
                if str(message.correlation_id or "").startswith(PREFIX):
                    receiver.complete_message(message)  # a leftover of an earlier run
                else:
                    receiver.abandon_message(message)  # not ours: leave it alone
    pytest.fail(f"message {message_id} not received from {queue} within {RECEIVE_DEADLINE}")


def text_properties(message: ServiceBusReceivedMessage) -> dict[str, Any]:
    def text(value: Any) -> Any:
        return value.decode() if isinstance(value, bytes) else value

    return {text(k): text(v) for k, v in (message.application_properties or {}).items()}


def new_order_id() -> str:
    return f"{PREFIX}{uuid.uuid4().hex[:12]}"


def test_send_round_trips_ids_properties_and_body(
    transport: ServiceBusTransport, receiving_client: ServiceBusClient, queue: str
) -> None:
    order_id = new_order_id()
    message = ScheduleRequest(order_id=order_id)
    span = NonRecordingSpan(
        SpanContext(
            trace_id=uuid.uuid4().int,
            span_id=uuid.uuid4().int >> 64,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    )

    with trace.use_span(span):
        transport.send(queue, message, message_id=f"{order_id}:schedule:1", correlation_id=order_id)
    received = receive(receiving_client, queue, f"{order_id}:schedule:1")

    context = span.get_span_context()
    assert received.correlation_id == order_id
    assert received.subject == "ScheduleRequest"
    assert received.content_type == "application/json"
    assert b"".join(received.body) == encode(message)
    assert received.scheduled_enqueue_time_utc is None
    assert text_properties(received)["traceparent"] == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
    )


def test_delayed_send_is_scheduled_and_not_delivered_early(
    transport: ServiceBusTransport, receiving_client: ServiceBusClient, queue: str
) -> None:
    order_id = new_order_id()
    delay = 8.0
    before = datetime.now(UTC)

    transport.send(
        queue,
        ScheduleRequest(order_id=order_id),
        message_id=f"{order_id}:schedule:2",
        correlation_id=order_id,
        delay_seconds=delay,
    )
    after = datetime.now(UTC)
    received = receive(receiving_client, queue, f"{order_id}:schedule:2")
    received_at = datetime.now(UTC)

    scheduled = received.scheduled_enqueue_time_utc
    assert scheduled is not None
    assert before + timedelta(seconds=delay) - CLOCK_SKEW <= scheduled
    assert scheduled <= after + timedelta(seconds=delay) + CLOCK_SKEW
    assert received_at >= before + timedelta(seconds=delay) - CLOCK_SKEW
    assert received.correlation_id == order_id


def test_missing_queue_is_not_found(transport: ServiceBusTransport) -> None:
    order_id = new_order_id()

    with pytest.raises(NotFound):
        transport.send(
            f"sas-contract-missing-{uuid.uuid4().hex[:8]}",
            ScheduleRequest(order_id=order_id),
            message_id=f"{order_id}:missing",
            correlation_id=order_id,
        )


def test_a_high_priority_step_request_travels_on_the_high_lane(
    transport: ServiceBusTransport, receiving_client: ServiceBusClient, queue: str
) -> None:
    """The dispatch picks the lane from the order's priority; the real namespace delivers it
    from that queue (the lane is an ordinary queue with its own trigger)."""
    from sas.domain.messages import StepRequest, decode
    from sas.domain.model import OrderState, ProcessState
    from sas.domain.wire import PRIORITIES, lane_queue_name
    from sas.services.consequences import dispatch
    from sas.services.context import Routes
    from sas.testing import InMemoryStore, instance
    from tests.workflows import REGISTRY, SHOP

    order_id = new_order_id()
    lanes = {p: lane_queue_name(queue, p) for p in PRIORITIES}
    agents = dict.fromkeys(("inventory", "payment", "shipping"), queue)
    routes = Routes("o", "s", "r", "a", agents, lanes={queue: lanes})
    now = datetime.now(UTC)
    state = OrderState(
        order_id=order_id,
        workflow=SHOP.name,
        process_state=ProcessState.PROCESSING,
        submitted_at=now,
        updated_at=now,
        locked_by="contract",
        complete_by=now + timedelta(seconds=60),
        attempt=1,
        details={"customer_id": "c1", "currency": "EUR", "lines": [], "address": "x"},
        priority="high",
    )
    app = instance(InMemoryStore(), transport, routes, SystemClock(), REGISTRY)
    dispatch(app.ctx, state, SHOP)
    received = receive(receiving_client, lanes["high"], f"{order_id}:reserve:1")
    request = decode(StepRequest, b"".join(received.body))
    assert (request.order_id, request.priority) == (order_id, "high")

"""The Storage Queue transport against real Azurite, read back the way the trigger reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.storage.queue import TextBase64DecodePolicy

from sas.adapters.storage_queues import StorageQueueTransport
from sas.domain.errors import NotFound
from sas.domain.messages import ScheduleRequest, decode
from tests.conftest import unique_queue

pytestmark = pytest.mark.integration


def test_messages_are_base64_json_as_the_functions_trigger_expects(queue_service):
    name = unique_queue()
    queue_service.create_queue(name)
    StorageQueueTransport(queue_service).send(
        name, ScheduleRequest(order_id="o1"), message_id="o1:schedule", correlation_id="o1"
    )
    reader = queue_service.get_queue_client(name, message_decode_policy=TextBase64DecodePolicy())
    (received,) = list(reader.receive_messages())
    assert decode(ScheduleRequest, received.content) == ScheduleRequest(order_id="o1")
    raw = queue_service.get_queue_client(name).peek_messages()
    assert raw == [] or not raw[0].content.startswith("{")  # not plain JSON on the wire


def test_a_delayed_send_is_invisible_until_due(queue_service):
    name = unique_queue()
    queue_service.create_queue(name)
    StorageQueueTransport(queue_service).send(
        name, ScheduleRequest(order_id="o1"), message_id="m", correlation_id="o1", delay_seconds=30
    )
    client = queue_service.get_queue_client(name)
    assert client.get_queue_properties().approximate_message_count == 1
    assert list(client.receive_messages()) == []


def test_a_missing_queue_is_a_domain_error(queue_service):
    with pytest.raises(NotFound):
        StorageQueueTransport(queue_service).send(
            unique_queue(), ScheduleRequest(order_id="o1"), message_id="m", correlation_id="o1"
        )


def test_what_waits_is_dated_by_the_enqueue_time_of_the_first_visible_message(queue_service):
    name = unique_queue()
    queue_service.create_queue(name)
    transport = StorageQueueTransport(queue_service)
    assert transport.waiting(name).oldest is None
    before = datetime.now(UTC) - timedelta(seconds=5)  # Azurite's clock is this machine's
    transport.send(name, ScheduleRequest(order_id="o1"), message_id="a", correlation_id="o1")
    transport.send(name, ScheduleRequest(order_id="o2"), message_id="b", correlation_id="o2")
    first = transport.waiting(name).oldest
    assert first is not None and first.tzinfo is not None and first >= before
    (taken,) = list(queue_service.get_queue_client(name).receive_messages(max_messages=1))
    assert transport.waiting(name).oldest is not None  # the second still waits
    queue_service.get_queue_client(name).delete_message(taken)
    with pytest.raises(NotFound):
        transport.waiting(unique_queue())


def test_a_peek_returns_the_bodies_as_sent_and_leaves_them_queued(queue_service):
    name = unique_queue()
    queue_service.create_queue(name)
    transport = StorageQueueTransport(queue_service)
    for order_id in ("o1", "o2", "o3"):
        transport.send(
            name, ScheduleRequest(order_id=order_id), message_id=order_id, correlation_id=order_id
        )
    peeked = transport.peek(name, 2)
    assert [decode(ScheduleRequest, body).order_id for body in peeked] == ["o1", "o2"]
    assert len(transport.peek(name, 100)) == 3  # all three still there
    with pytest.raises(NotFound):
        transport.peek(unique_queue(), 5)

"""Order ids over the whole character space against Azurite: an id sas accepts is a valid
Table PartitionKey and RowKey (the real store creates and point-reads the order and indexes it)
and travels through a real Storage queue and back intact; an id it refuses, sent to the real
``submit`` function body, is parked with a reason naming ``order_id`` and nothing else is
written. Which ids are accepted, and the message ids made from them: tests/unit/test_order_ids.py.
"""

from __future__ import annotations

import contextlib
import json
import unicodedata
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from azure.data.tables import TableClient
from azure.functions.queue import QueueMessage
from azure.storage.queue import QueueServiceClient, TextBase64DecodePolicy
from hypothesis import HealthCheck, example, given, settings

from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.errors import AlreadyExists
from sas.domain.messages import ScheduleRequest, decode
from sas.domain.model import HistoryEntry, OrderRecord
from sas.domain.transitions import initial_state
from sas.domain.wire import schedule_message_id
from tests.conftest import unique_queue
from tests.harness import store_on
from tests.integration.test_fuzz_functions import rows, user_function
from tests.unit.test_order_ids import ACCEPTED, EVERY_CHAR, REFUSED, accepted, candidate_ids, order
from tests.workflows import SHOP

pytestmark = pytest.mark.integration


@pytest.fixture
def queue(queue_service: QueueServiceClient) -> Iterator[str]:
    name = unique_queue("ids")
    queue_service.create_queue(name)
    yield name
    queue_service.delete_queue(name)


def round_trip(
    order_id: str,
    store: TableStateStore,
    table: TableClient,
    queues: QueueServiceClient,
    queue: str,
) -> None:
    """The id as a PartitionKey (through the real store) and through a real Storage queue."""
    now = datetime.now(UTC)
    record = OrderRecord(order_id, SHOP.name, {}, "fingerprint", now)
    state = initial_state(order_id, SHOP, reply_to=None, now=now)
    with contextlib.suppress(AlreadyExists):  # the same id drawn again
        store.create_order(record, state, HistoryEntry(order_id, now, "submitted", attempt=0))
    found, kept = store.get_state(order_id), store.get_order(order_id)
    assert found is not None and found.value.order_id == order_id
    assert kept is not None and kept.order_id == order_id
    assert table.get_entity(order_id, "state")["PartitionKey"] == order_id  # a point read
    store.touch_live(order_id, now, now)  # the id as a RowKey too: the in-flight marker
    assert order_id in {marker.order_id for marker in store.list_live()}

    StorageQueueTransport(queues).send(
        queue,
        ScheduleRequest(order_id=order_id),
        message_id=schedule_message_id(order_id, now),
        correlation_id=order_id,
    )
    receiver = queues.get_queue_client(queue, message_decode_policy=TextBase64DecodePolicy())
    (received,) = list(receiver.receive_messages(max_messages=32))
    receiver.delete_message(received)
    assert decode(ScheduleRequest, received.content).order_id == order_id


def _has_surrogate(value: str) -> bool:
    return any(unicodedata.category(c) == "Cs" for c in value)


def parked_on_submit(order_id: str, table: TableClient) -> None:
    """Through the real ``submit`` function body: parked, and nothing else written."""
    parked_before, others_before = rows(table)
    body = json.dumps(order(order_id)).encode()  # every non-ASCII character escaped
    user_function("submit")(QueueMessage(id="m1", body=body, dequeue_count=1))
    parked_after, others_after = rows(table)
    seen = {row["RowKey"] for row in parked_before}
    (new,) = [row for row in parked_after if row["RowKey"] not in seen]
    # The reason names the field; a lone surrogate is refused earlier, by the JSON parser.
    reason = new["Reason"]
    assert new["Queue"] == "sas-orders", reason
    assert "order_id" in reason or ("Invalid JSON" in reason and _has_surrogate(order_id)), reason
    assert others_after == others_before


def test_accepted_ids_round_trip_and_refused_ones_are_parked(
    app_env: None, table: TableClient, queue_service: QueueServiceClient, queue: str
) -> None:
    store = store_on(table)

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    # Every character, lone surrogates included: JSON escapes them (``\\ud800``), so a
    # submitter can send one even though no UTF-8 body can carry it raw.
    @given(order_id=candidate_ids(EVERY_CHAR))
    def check(order_id: str) -> None:
        if accepted(order_id):
            round_trip(order_id, store, table, queue_service, queue)
        else:
            parked_on_submit(order_id, table)

    for explicit in (*REFUSED, *ACCEPTED):
        check = example(order_id=explicit)(check)
    check()

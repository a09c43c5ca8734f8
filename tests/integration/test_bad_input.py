"""Each class of bad message, through the real function bodies, against Azurite (I8):
parked with its reason and original body, the message settled (no exception, so no retry
storm), and nothing else written."""

from __future__ import annotations

import json
from typing import Any

import azure.functions as func
import pytest
from azure.functions.queue import QueueMessage

from sas import bootstrap
from sas.domain.messages import MAX_MESSAGE_BYTES
from sas.domain.wire import REJECTED_PARTITION

pytestmark = pytest.mark.integration

VALID_ORDER: dict[str, Any] = {
    "type": "OrderSubmitted",
    "order_id": "o1",
    "details": {
        "customer_id": "c1",
        "currency": "EUR",
        "address": "1 Main St",
        "lines": [{"sku": "s1", "quantity": 1, "unit_price_cents": 100}],
    },
}


def body(**changes: object) -> bytes:
    return json.dumps({**VALID_ORDER, **changes}).encode()


BAD_ORDERS = {
    "not_utf8": (b"\xff\xfe\x00garbage", "not UTF-8"),
    "not_json": (b"{this is not json", "invalid OrderSubmitted"),
    "wrong_type_on_queue": (
        json.dumps(
            {
                "type": "StepReply",
                "order_id": "o1",
                "step": "charge",
                "step_index": 0,
                "attempt": 1,
                "outcome": "ok",
            }
        ).encode(),
        "type",
    ),
    "unknown_field": (body(admin=True), "<unexpected field>: Extra inputs"),
    "missing_field": (json.dumps({"type": "OrderSubmitted", "order_id": "o1"}).encode(), "details"),
    "future_version": (body(v=2), "v:"),
    "oversize": (b" " * (MAX_MESSAGE_BYTES + 1), "oversize"),
    "hostile_id_injection": (body(order_id="o1' or PartitionKey ne '"), "order_id"),
    "hostile_id_path": (body(order_id="../../etc/passwd"), "order_id"),
    "hostile_nesting": (b"[" * 20_000 + b"]" * 20_000, "invalid OrderSubmitted"),
    "unknown_workflow": (body(workflow="nope"), "unknown workflow"),
    "wrong_types": (body(order_id=12345), "order_id"),
}


def user_function(name: str):
    from sas.entrypoints import queues

    for builder in queues.blueprint._function_builders:
        if builder._function.get_function_name() == name:
            return builder._function.get_user_function()
    raise LookupError(name)


def deliver(function: str, payload: bytes) -> None:
    user_function(function)(QueueMessage(id="m1", body=payload, dequeue_count=1))


def everything(table) -> list[dict[str, Any]]:
    return list(table.list_entities())


@pytest.mark.parametrize("case", sorted(BAD_ORDERS))
def test_each_class_of_bad_order_is_parked_with_its_reason(app_env, table, case):
    payload, reason = BAD_ORDERS[case]
    deliver("submit", payload)  # returns normally: the message is settled
    rows = everything(table)
    assert {row["PartitionKey"] for row in rows} == {REJECTED_PARTITION}  # nothing partial
    (parked,) = bootstrap.store().list_parked()
    assert parked.queue == "sas-orders"
    assert reason in parked.reason
    assert parked.body == payload[: len(parked.body)]
    assert parked.body_truncated is (len(parked.body) < len(payload))


@pytest.mark.parametrize(
    ("function", "queue", "payload", "reason"),
    [
        ("schedule", "sas-scheduler", b'{"type": "ScheduleRequest"}', "order_id"),
        ("on_reply", "sas-replies", b'{"type": "StepReply", "order_id": "o1"}', "step"),
        (
            "on_reply",
            "sas-replies",
            json.dumps(
                {
                    "type": "StepReply",
                    "order_id": "o1",
                    "step": "charge",
                    "step_index": 0,
                    "attempt": 0,
                    "outcome": "ok",
                }
            ).encode(),
            "attempt",
        ),
        (
            "agent_payment",
            "sas-agent-payment",
            json.dumps(
                {
                    "type": "StepRequest",
                    "order_id": "o1",
                    "step": "charge",
                    "step_index": 1,
                    "attempt": 1,
                    "action": "charge",
                    "complete_by": "2026-01-01T00:00:00",
                    "idempotency_key": "o1:charge",
                    "payload": {},
                }
            ).encode(),
            "complete_by",
        ),
    ],
)
def test_bad_messages_on_every_queue_are_parked(app_env, table, function, queue, payload, reason):
    deliver(function, payload)
    (parked,) = bootstrap.store().list_parked()
    assert parked.queue == queue and reason in parked.reason
    assert parked.body == payload


def test_a_reply_for_an_order_that_does_not_exist_is_parked_and_changes_nothing(app_env, table):
    reply = {
        "type": "StepReply",
        "order_id": "ghost",
        "step": "charge",
        "step_index": 1,
        "attempt": 1,
        "outcome": "ok",
    }
    deliver("on_reply", json.dumps(reply).encode())
    assert {row["PartitionKey"] for row in everything(table)} == {REJECTED_PARTITION}
    (parked,) = bootstrap.store().list_parked()
    assert parked.queue == "sas-replies" and "unknown order" in parked.reason
    assert json.loads(parked.body)["order_id"] == "ghost"


def test_a_schedule_request_for_an_order_that_does_not_exist_is_parked(app_env, table):
    deliver("schedule", b'{"type": "ScheduleRequest", "order_id": "ghost"}')
    (parked,) = bootstrap.store().list_parked()
    assert parked.queue == "sas-scheduler" and "unknown order" in parked.reason
    assert {row["PartitionKey"] for row in everything(table)} == {REJECTED_PARTITION}


def test_a_different_order_under_a_taken_id_is_parked_and_the_original_kept(app_env, table):
    deliver("submit", body())
    deliver("submit", body(details={**VALID_ORDER["details"], "address": "2 Other St"}))
    (parked,) = bootstrap.store().list_parked()
    assert parked.queue == "sas-orders" and "already used" in parked.reason
    assert json.loads(parked.body)["details"]["address"] == "2 Other St"
    original = bootstrap.store().get_order("o1")
    assert original is not None and original.details["address"] == "1 Main St"


@pytest.mark.parametrize(
    ("reply_to", "reason"),
    [
        ("sas-alerts", "app's own queues"),  # status events posing as operator alerts
        ("sas-scheduler", "app's own queues"),
        ("sas-replies", "app's own queues"),
        ("sas-agent-payment", "app's own queues"),
        ("sas-orders-poison", "app's own queues"),
        ("someone-elses-queue", "reply_to must match status-*"),
    ],
)
def test_a_submitter_cannot_point_status_events_at_a_queue_it_may_not_use(
    app_env, table, reply_to, reason
):
    deliver("submit", body(reply_to=reply_to))
    assert {row["PartitionKey"] for row in everything(table)} == {REJECTED_PARTITION}
    (parked,) = bootstrap.store().list_parked()
    assert reason in parked.reason


def test_an_allowed_reply_to_is_accepted(app_env, table):
    deliver("submit", body(reply_to="status-shop-7"))
    assert bootstrap.store().list_parked() == []
    accepted = bootstrap.store().get_order("o1")
    assert accepted is not None and accepted.reply_to == "status-shop-7"


def test_the_function_bodies_take_the_trigger_message_types():
    assert user_function("submit").__annotations__["msg"] in (
        func.QueueMessage,
        func.ServiceBusMessage,
    )

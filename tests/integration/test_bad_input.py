"""Each class of bad message, through the real function bodies, against Azurite (I8):
parked with its reason and original body, the message settled (no exception, so no retry
storm), and nothing else written."""

from __future__ import annotations

import json

import azure.functions as func
import pytest
from azure.functions.queue import QueueMessage

from sas import bootstrap
from sas.domain.messages import MAX_MESSAGE_BYTES
from sas.domain.wire import REJECTED_PARTITION

pytestmark = pytest.mark.integration

VALID_ORDER = {
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
    "unknown_field": (body(admin=True), "admin"),
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


def everything(table) -> list[dict]:
    return list(table.list_entities())


@pytest.mark.parametrize("case", sorted(BAD_ORDERS))
def test_each_class_of_bad_order_is_parked_with_its_reason(app_env, table, case):
    payload, reason = BAD_ORDERS[case]
    deliver("submit", payload)  # returns normally: the message is settled
    rows = everything(table)
    assert {row["PartitionKey"] for row in rows} == {REJECTED_PARTITION}  # nothing partial
    (parked,) = bootstrap.store().list_parked()
    assert parked["queue"] == "sas-orders"
    assert reason in parked["reason"]
    assert parked["body"] == payload[: len(parked["body"])]
    assert parked["body_truncated"] is (len(parked["body"]) < len(payload))


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
    assert parked["queue"] == queue and reason in parked["reason"]
    assert parked["body"] == payload


def test_a_reply_for_an_order_that_does_not_exist_changes_nothing(app_env, table):
    reply = {
        "type": "StepReply",
        "order_id": "ghost",
        "step": "charge",
        "step_index": 1,
        "attempt": 1,
        "outcome": "ok",
    }
    deliver("on_reply", json.dumps(reply).encode())
    assert everything(table) == []


def test_the_function_bodies_take_the_trigger_message_types():
    assert user_function("submit").__annotations__["msg"] in (
        func.QueueMessage,
        func.ServiceBusMessage,
    )

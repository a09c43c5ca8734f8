import json
from datetime import UTC, datetime

import pytest

from sas.domain.errors import InvalidMessage
from sas.domain.messages import (
    MAX_MESSAGE_BYTES,
    OrderSubmitted,
    StatusEvent,
    StepReply,
    StepRequest,
    decode,
    encode,
)
from tests.workflows import SHOP

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def order(**overrides):
    body = {
        "v": 1,
        "type": "OrderSubmitted",
        "order_id": "ord-1",
        "details": {
            "customer_id": "c-1",
            "currency": "EUR",
            "address": "1 Main St",
            "lines": [{"sku": "sku-1", "quantity": 2, "unit_price_cents": 500}],
        },
        "reply_to": "status-1",
    }
    body.update(overrides)
    return json.dumps(body).encode()


def test_a_valid_order_round_trips():
    message = decode(OrderSubmitted, order())
    assert message.details["lines"][0]["unit_price_cents"] == 500
    assert decode(OrderSubmitted, encode(message)) == message


def test_fingerprint_is_stable_and_changes_with_content():
    a, b = decode(OrderSubmitted, order()), decode(OrderSubmitted, order())
    assert a.fingerprint() == b.fingerprint()
    c = decode(OrderSubmitted, order(reply_to="status-2"))
    assert a.fingerprint() != c.fingerprint()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"not json", "invalid OrderSubmitted"),
        (b"[]", "invalid OrderSubmitted"),
        (order(extra_field=1), "<unexpected field>: Extra inputs"),
        (order(v=2), "v:"),
        (order(type="StepReply"), "type:"),
        (order(order_id="a/b"), "order_id"),
        (order(order_id="x" * 65), "order_id"),
        (order(order_id=""), "order_id"),
        (order(reply_to="Not_A_Queue"), "reply_to"),
        (order(reply_to="a--b"), "reply_to"),
        (b" " * (MAX_MESSAGE_BYTES + 1), "oversize"),
    ],
)
def test_bad_bodies_are_rejected_with_a_reason(body, reason):
    with pytest.raises(InvalidMessage) as caught:
        decode(OrderSubmitted, body)
    assert reason in caught.value.reason
    assert "extra_field" not in caught.value.reason  # a sender's field name is never repeated


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"lines": []}, "lines"),
        ({"lines": [{"sku": "s", "quantity": "2", "unit_price_cents": 1}]}, "quantity"),
        ({"currency": "<script>"}, "currency"),
        ({"SECRET_extra": 1}, "<unexpected field>: Extra inputs"),
    ],
)
def test_a_workflows_input_is_checked_against_its_schema_strictly(change, reason):
    details = {**json.loads(order())["details"], **change}
    with pytest.raises(ValueError) as caught:
        SHOP.parse_input(details)
    assert reason in str(caught.value)
    assert "<script>" not in str(caught.value) and "SECRET" not in str(caught.value)
    assert decode(OrderSubmitted, order(details=details)).details == details  # the envelope's fine


def test_reason_never_echoes_the_hostile_input():
    hostile = "<script>" + "A" * 100
    with pytest.raises(InvalidMessage) as caught:
        decode(OrderSubmitted, order(order_id=hostile))
    assert "<script>" not in caught.value.reason


def test_step_messages_require_aware_datetimes_and_positive_attempts():
    request = {
        "type": "StepRequest",
        "order_id": "o1",
        "step": "charge",
        "step_index": 1,
        "attempt": 3,
        "action": "charge",
        "complete_by": "2026-11-22T12:00:00+00:00",
        "idempotency_key": "o1:charge",
        "payload": {},
    }
    parsed = decode(StepRequest, json.dumps(request))
    assert parsed.complete_by == datetime(2026, 11, 22, 12, tzinfo=UTC)
    with pytest.raises(InvalidMessage, match="complete_by"):
        decode(StepRequest, json.dumps({**request, "complete_by": "2026-11-22T12:00:00"}))
    with pytest.raises(InvalidMessage, match="attempt"):
        decode(StepRequest, json.dumps({**request, "attempt": 0}))


def test_reply_outcome_is_closed_and_types_do_not_cross_queues():
    reply = {
        "type": "StepReply",
        "order_id": "o1",
        "step": "charge",
        "step_index": 0,
        "attempt": 1,
        "outcome": "ok",
    }
    assert decode(StepReply, json.dumps(reply)).outcome == "ok"
    with pytest.raises(InvalidMessage, match="outcome"):
        decode(StepReply, json.dumps({**reply, "outcome": "maybe"}))
    with pytest.raises(InvalidMessage, match="type"):
        decode(StatusEvent, json.dumps(reply))

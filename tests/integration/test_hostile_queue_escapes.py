"""Bad input (I8), found by a hostile review.

Hostile bodies that escape the queue functions as exceptions (retry -> poison)
instead of being processed or parked."""

from __future__ import annotations

import json
from typing import Any

import pytest
from azure.functions.queue import QueueMessage

from sas import bootstrap
from tests.integration.test_bad_input import VALID_ORDER, user_function

pytestmark = pytest.mark.integration


def run(function: str, payload: bytes) -> None:
    """Deliver one message to a queue function's body, as the host does; it must return."""
    user_function(function)(QueueMessage(id="m1", body=payload, dequeue_count=1))


def parked_reasons() -> list[str]:
    return [parked.reason for parked in bootstrap.store().list_parked()]


def submit_o1() -> None:
    run("submit", json.dumps(VALID_ORDER).encode())
    assert bootstrap.store().get_state("o1") is not None


def reply(**changes: Any) -> bytes:
    base = {
        "type": "StepReply",
        "order_id": "o1",
        "step": "reserve",
        "step_index": 0,
        "attempt": 1,
        "outcome": "ok",
    }
    return json.dumps({**base, **changes}).encode()


def test_a_reply_with_an_attempt_past_int32_is_settled(app_env, table):
    """attempt had no upper bound in StepReply; the dropped-reply history row stores it and
    azure-data-tables serialises a Python int as Edm.Int32 only -> TypeError escapes."""
    submit_o1()
    before = bootstrap.store().get_state("o1")
    run("on_reply", reply(attempt=2**31))  # must return normally, parked
    assert any("attempt" in reason for reason in parked_reasons())
    assert bootstrap.store().get_state("o1") == before


def step_request(**changes: Any) -> bytes:
    base = {
        "type": "StepRequest",
        "order_id": "o1",
        "step": "charge",
        "step_index": 1,
        "attempt": 1,
        "action": "charge",
        "complete_by": "2999-01-01T00:00:00+00:00",
        "idempotency_key": "o1:charge",
        "payload": {},
    }
    return json.dumps({**base, **changes}).encode()


def test_a_step_request_whose_payload_holds_1e400_is_settled(app_env, table):
    """decode refuses NaN/Infinity literals but not 1e400, which parses to inf; httpx encodes
    JSON with allow_nan=False -> ValueError escapes the agent."""
    body = step_request().replace(b'"payload": {}', b'"payload": {"x": 1e400}')
    run("agent_payment", body)
    assert any("NaN or Infinity" in reason for reason in parked_reasons())


def test_a_step_request_with_a_non_ascii_idempotency_key_is_settled(app_env, table):
    """idempotency_key was free text (3..200 chars) and goes into an HTTP header; httpx encodes
    header values as ASCII -> UnicodeEncodeError escapes the agent."""
    run("agent_payment", step_request(idempotency_key="o1:charg\u00e9"))
    assert any("idempotency_key" in reason for reason in parked_reasons())

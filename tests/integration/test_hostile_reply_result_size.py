"""Bad input (I8), found by a hostile review.

A StepReply for the current attempt whose result is under MAX_MESSAGE_BYTES but over
what one Table property holds: record_step's write fails and the exception escapes on_reply."""

from __future__ import annotations

import json

import pytest

from sas import bootstrap
from tests.integration.test_bad_input import VALID_ORDER
from tests.integration.test_hostile_queue_escapes import parked_reasons, run

pytestmark = pytest.mark.integration


def test_a_current_reply_with_a_40_kib_result_is_settled(app_env, table):
    run("submit", json.dumps(VALID_ORDER).encode())
    run("schedule", b'{"type": "ScheduleRequest", "order_id": "o1"}')
    found = bootstrap.store().get_state("o1")
    assert found is not None
    state = found.value
    assert state.attempt == 1 and state.step_index == 0
    reply = {
        "type": "StepReply",
        "order_id": "o1",
        "step": "reserve",
        "step_index": 0,
        "attempt": 1,
        "outcome": "ok",
        "result": {"note": "\u00e9" * 20_000},  # 40 KB of UTF-8, 20k chars -> 120 KB escaped
    }
    body = json.dumps(reply, ensure_ascii=False).encode()
    assert len(body) < 48 * 1024
    run("on_reply", body)  # must return normally, parked, the order unchanged
    assert any("result" in reason for reason in parked_reasons())
    after = bootstrap.store().get_state("o1")
    assert after is not None and after.value == state

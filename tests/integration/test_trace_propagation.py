"""The order's trace context through Storage Queues on Azurite: in the message envelope (a
Storage message has no properties), through the real function bodies, onto the state row. No
SDK is installed here, so this is also what an untraced deployment does: a submitter's context
passes through unchanged; an order sent without one leaves every message and row as before."""

from __future__ import annotations

import json

import pytest
from azure.storage.queue import QueueServiceClient, TextBase64DecodePolicy

from sas import bootstrap, settings
from sas.domain.messages import StepRequest, decode
from sas.domain.wire import STATE_ROW
from tests.integration.test_bad_input import body, deliver

pytestmark = pytest.mark.integration

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def agent_requests(azurite) -> list[StepRequest]:
    queue = QueueServiceClient.from_connection_string(azurite.connection_string).get_queue_client(
        bootstrap.settings().agent_queue("inventory"),
        message_decode_policy=TextBase64DecodePolicy(),
    )
    return [decode(StepRequest, m.content) for m in queue.peek_messages(max_messages=32)]


def test_a_submitters_context_reaches_the_state_row_and_the_agents_request(app_env, azurite, table):
    deliver("submit", body(trace={"traceparent": TRACEPARENT, "tracestate": "shop=1"}))
    state = bootstrap.store().get_state("o1")
    assert state is not None and state.value.traceparent == TRACEPARENT
    assert table.get_entity("o1", STATE_ROW)["TraceParent"] == TRACEPARENT
    [request] = agent_requests(azurite)
    assert request.trace is not None
    assert (request.trace.traceparent, request.trace.tracestate) == (TRACEPARENT, "shop=1")


def test_an_order_without_context_is_stored_and_sent_as_before(app_env, azurite, table):
    deliver("submit", body())
    assert "TraceParent" not in table.get_entity("o1", STATE_ROW)
    [request] = agent_requests(azurite)
    assert request.trace is None
    queue = QueueServiceClient.from_connection_string(azurite.connection_string).get_queue_client(
        bootstrap.settings().agent_queue("inventory"),
        message_decode_policy=TextBase64DecodePolicy(),
    )
    [raw] = queue.peek_messages()
    assert "trace" not in json.loads(raw.content)


def test_a_garbled_traceparent_is_parked_like_any_bad_field(app_env):
    deliver("submit", body(trace={"traceparent": "00-not-a-trace"}))
    (parked,) = bootstrap.store().list_parked()
    assert parked.queue == bootstrap.settings().queue(settings.QUEUE_ORDERS)
    assert "trace.traceparent" in parked.reason
    assert bootstrap.store().get_order("o1") is None

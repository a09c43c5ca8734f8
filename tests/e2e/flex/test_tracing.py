"""One order's trace, followed across every span its workers recorded: submitted, its first step
timed out (the remote answered too late) and recovered by the Supervisor, retried with the next
attempt, then its second step refused, so the order was compensated.

The dev host's workers record finished spans through a preload (sas_local/span_capture.py); the
app itself runs unchanged, with nothing but the OpenTelemetry API in its services.
"""

from __future__ import annotations

from typing import Any

import pytest

from sas.adapters.clients import queue_service_client
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.model import ProcessState
from sas.settings import QUEUE_ORDERS
from sas_local.demo import demo_order
from sas_local.ledger import configure_faults
from sas_local.processes import wait_until
from sas_local.span_capture import read_spans

pytestmark = pytest.mark.e2e

Span = dict[str, Any]


@pytest.fixture(scope="module")
def order_id(stack) -> str:
    """Drive one order: reserve answers too late until the Supervisor has recovered it; then
    reserve succeeds and payment refuses, so the order is compensated."""
    store = TableStateStore.connect(stack.settings.storage, stack.settings.table_name)
    transport = StorageQueueTransport(queue_service_client(stack.settings.storage))
    # Slower than the agent's call timeout: the effect is applied, the answer never arrives.
    configure_faults(
        stack.simulator_url,
        {"per_service": {"inventory": {"slow_rate": 1.0, "slow_seconds": 30.0}}},
    )
    order = demo_order(0, "trace").model_copy(update={"reply_to": None})
    transport.send(
        stack.settings.queue(QUEUE_ORDERS),
        order,
        message_id=order.order_id,
        correlation_id=order.order_id,
    )

    def recovered() -> bool:
        found = store.get_state(order.order_id)
        return found is not None and found.value.failure_count >= 1

    # The retry waits out a 2 s backoff: the faults change well before it calls again.
    wait_until(recovered, timeout=90, interval=0.1, what="the Supervisor's recovery")
    configure_faults(stack.simulator_url, {"per_service": {"payment": {"permanent_rate": 1.0}}})

    def compensated() -> bool:
        found = store.get_state(order.order_id)
        return found is not None and found.value.process_state is ProcessState.COMPENSATED

    wait_until(compensated, timeout=90, interval=0.5, what="the order Compensated")
    return order.order_id


@pytest.fixture(scope="module")
def trace(order_id, spans_dir) -> list[Span]:
    """Every span of the order's trace, once the last one (the undo's reply) is written."""

    def complete() -> list[Span] | None:
        spans = read_spans(spans_dir)
        submit = [s for s in spans if s["name"] == "sas.submit" and _order(s) == order_id]
        if not submit:
            return None
        mine = [s for s in spans if s["trace_id"] == submit[0]["trace_id"]]
        replies = [s for s in mine if s["name"] == "sas.reply"]
        done = any(s["attributes"].get("sas.outcome") == "finished" for s in replies)
        return mine if done else None

    spans: list[Span] = wait_until(complete, timeout=30, interval=0.5, what="the whole trace")
    return spans


def _order(span: Span) -> str | None:
    value = span["attributes"].get("sas.order_id")
    return value if isinstance(value, str) else None


def _one(spans: list[Span], name: str, **attributes: object) -> Span:
    found = [
        s
        for s in spans
        if s["name"] == name
        and all(s["attributes"].get(f"sas.{k}") == v for k, v in attributes.items())
    ]
    assert len(found) == 1, f"{name} {attributes}: {len(found)} spans"
    return found[0]


def _children(spans: list[Span], parent: Span, name: str) -> list[Span]:
    return [s for s in spans if s["parent_id"] == parent["span_id"] and s["name"] == name]


def test_every_span_about_the_order_is_in_one_trace(trace, order_id, spans_dir):
    about_order = [s for s in read_spans(spans_dir) if _order(s) == order_id]
    assert {s["trace_id"] for s in about_order} == {trace[0]["trace_id"]}
    assert {s["span_id"] for s in about_order} <= {s["span_id"] for s in trace}
    names = {s["name"] for s in trace}
    assert {
        "sas.submit",
        "sas.agent",
        "sas.remote_call",
        "sas.reply",
        "sas.supervisor.recover",
        "sas.schedule",
        "sas.compensate",
    } <= names


def test_submit_agent_remote_call_and_reply_form_one_chain(trace, order_id):
    submit = _one(trace, "sas.submit", order_id=order_id)
    assert submit["parent_id"] is None  # the submitter sent no context: the trace starts here
    first = _one(trace, "sas.agent", step="reserve", attempt=1, mode="do")
    assert first["parent_id"] == submit["span_id"]  # submission dispatches step 1 itself
    calls = _children(trace, first, "sas.remote_call")
    assert calls and all(c["status"] == "ERROR" for c in calls)  # timed out, every try
    assert first["attributes"]["sas.outcome"] == "gave_up"

    retried = _one(trace, "sas.agent", step="reserve", attempt=2, mode="do")
    [ok_call] = _children(trace, retried, "sas.remote_call")
    assert ok_call["status"] != "ERROR" and ok_call["attributes"]["sas.action"] == "reserve"
    reply = _one(trace, "sas.reply", step="reserve", attempt=2)
    assert reply["parent_id"] == retried["span_id"]
    assert reply["attributes"]["sas.outcome"] == "advanced"
    charge = _one(trace, "sas.agent", step="charge", mode="do")
    assert charge["parent_id"] == reply["span_id"]
    assert charge["attributes"]["sas.attempt"] == 3
    assert charge["attributes"]["sas.outcome"] == "refused" and charge["status"] == "ERROR"


def test_the_recovery_joins_the_trace_and_the_retry_follows_it(trace, order_id):
    submit = _one(trace, "sas.submit", order_id=order_id)
    recover = _one(trace, "sas.supervisor.recover", step="reserve", attempt=1)
    # A timer starts with no context: the recovery continues the order's stored one.
    assert recover["parent_id"] == submit["span_id"]
    assert recover["attributes"]["sas.outcome"] == "retry"
    [schedule] = _children(trace, recover, "sas.schedule")
    # Asked before the backoff ended by its clock (the store time it estimates may trail the
    # queue's by up to its error), the Scheduler answers not_yet and asks again, in the trace.
    for _ in range(3):
        if schedule["attributes"]["sas.outcome"] != "not_yet":
            break
        [schedule] = _children(trace, schedule, "sas.schedule")
    assert schedule["attributes"]["sas.outcome"] == "claimed"
    retried = _one(trace, "sas.agent", step="reserve", attempt=2, mode="do")
    assert retried["parent_id"] == schedule["span_id"]
    assert retried["start"] > recover["start"]


def test_the_compensation_is_in_the_orders_trace(trace, order_id):
    refused = _one(trace, "sas.reply", step="charge")
    assert refused["attributes"]["sas.outcome"] == "compensating"
    [compensate] = _children(trace, refused, "sas.compensate")
    assert compensate["attributes"]["sas.order_id"] == order_id
    assert compensate["attributes"]["sas.reason"] == "refused"
    [schedule] = _children(trace, compensate, "sas.schedule")
    undo = _one(trace, "sas.agent", step="reserve", mode="undo")
    assert undo["parent_id"] == schedule["span_id"]
    assert undo["attributes"]["sas.outcome"] == "replied"
    [release] = _children(trace, undo, "sas.remote_call")
    assert release["attributes"]["sas.action"] == "release"
    last = _one(trace, "sas.reply", step="reserve", mode="undo")
    assert last["parent_id"] == undo["span_id"]
    assert last["attributes"]["sas.outcome"] == "finished"


def test_log_records_carry_the_order_and_its_trace(stack, trace, order_id):
    trace_id = trace[0]["trace_id"]
    lines = [
        line
        for line in stack.stderr().splitlines()
        if f"order_id={order_id}" in line and f"trace_id={trace_id}" in line
    ]
    assert any("sas.step_expired" in line for line in lines)  # logged by the Supervisor
    assert any("sas.step_refused" in line and "attempt=3" in line for line in lines)
    assert any("sas.compensation_started" in line for line in lines)

"""What a step is sent: the workflow's input, or what its ``input`` builds from the input and
the results of the steps before it (sas/domain/workflow.py, sas/services/consequences.py)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from sas.domain.errors import InvalidMessage
from sas.domain.messages import OrderSubmitted, ScheduleRequest, StepRequest
from sas.domain.model import OrderState, ProcessState
from sas.domain.workflow import StepDefinition, Workflow
from tests.fakes import FakeClock, InMemoryStore, RecordingTransport
from tests.instances import WORKFLOWS, instance
from tests.unit.test_services import ROUTES, ok_reply, run_to_completion, submitted

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def state_of(store: InMemoryStore) -> OrderState:
    found = store.get_state("o1")
    assert found is not None
    return found.value


def requests(transport: RecordingTransport) -> dict[str, StepRequest]:
    return {s.message.step: s.message for s in transport.sent if isinstance(s.message, StepRequest)}


def test_ship_is_sent_the_reservation_that_reserve_returned():
    store, transport, clock = InMemoryStore(), RecordingTransport(), FakeClock()
    instance(store, transport, ROUTES, clock).submit(submitted())
    run_to_completion(store, transport, clock, instance(store, transport, ROUTES, clock, "s1"))
    sent = requests(transport)
    assert sent["ship"].payload["reservation"] == {"ref": "reserve"}  # reserve's result
    assert "reservation" not in sent["charge"].payload
    assert sent["charge"].payload["order_id"] == "o1"
    state = state_of(store)
    assert state.process_state is ProcessState.PROCESSED
    assert state.results == {"reserve": {"ref": "reserve"}, "charge": {"ref": "charge"},
                             "ship": {"ref": "ship"}}  # fmt: skip


def test_a_builder_that_fails_sends_nothing_and_the_step_is_recovered_by_expiry(
    monkeypatch, caplog
):
    calls: list[int] = []

    def broken(order: Any, results: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("missing")
        return {"fixed": True}

    step = StepDefinition("go", "payment", "charge", timedelta(seconds=5), input=broken)
    monkeypatch.setitem(WORKFLOWS, "flaky", Workflow("flaky", (step,)))
    store, transport, clock = InMemoryStore(), RecordingTransport(), FakeClock()
    app = instance(store, transport, ROUTES, clock)
    order = submitted().model_copy(update={"workflow": "flaky"})
    with caplog.at_level(logging.ERROR):
        app.submit(order)
    assert requests(transport) == {}
    assert "sas.step_input_failed error=KeyError" in caplog.text
    assert "missing" not in caplog.messages[-1]  # the event names the error type only
    clock.advance(6)
    app.sweep()  # expired: retried after a backoff
    clock.advance(10)
    app.schedule(ScheduleRequest(order_id="o1"))
    (request,) = requests(transport).values()
    assert request.payload == {"fixed": True, "order_id": "o1"}
    app.on_reply(ok_reply(request))
    assert state_of(store).process_state is ProcessState.PROCESSED


def test_the_order_id_always_travels_and_cannot_be_overridden_by_the_data():
    step = StepDefinition("go", "payment", "charge", timedelta(seconds=5))
    workflow = Workflow("solo", (step,))
    assert workflow.step_data(0, "o1", {"order_id": "forged", "a": 1}, {}) == {
        "order_id": "o1",
        "a": 1,
    }


def test_an_order_submitted_with_other_details_is_refused_by_the_workflows_input():
    store, transport, clock = InMemoryStore(), RecordingTransport(), FakeClock()
    order = OrderSubmitted(order_id="o1", details={"customer_id": "c1"})
    with pytest.raises(InvalidMessage, match="invalid details"):
        instance(store, transport, ROUTES, clock).submit(order)
    assert store.get_state("o1") is None and transport.sent == []

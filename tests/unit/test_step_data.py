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
from sas.testing import FakeClock, InMemoryQueues, InMemoryStore, Instance, instance
from tests.unit.test_services import ROUTES, ok_reply, run_to_completion, submitted
from tests.workflows import REGISTRY, registry

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def state_of(store: InMemoryStore) -> OrderState:
    found = store.get_state("o1")
    assert found is not None
    return found.value


def requests(transport: InMemoryQueues) -> dict[str, StepRequest]:
    """Every step request sent, by step; those still queued are taken (the test answers them
    by hand), so no queue the Supervisor asks about holds them."""
    sent = [s.message for s in transport.sent if isinstance(s.message, StepRequest)]
    for queue in {s.queue for s in transport.sent if isinstance(s.message, StepRequest)}:
        transport.take(queue)
    return {request.step: request for request in sent}


def submitted_to(
    first: StepDefinition, build: Any, **then: Any
) -> tuple[InMemoryStore, FakeClock, InMemoryQueues, Instance]:
    """An order submitted to a two-step workflow whose second step ``then`` has ``build`` as
    its input builder (``then``: more of its options)."""
    second = StepDefinition("then", "payment", "charge", timedelta(seconds=5), input=build, **then)
    workflows = registry(Workflow("flaky", (first, second)))
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    app = instance(store, transport, ROUTES, clock, workflows)
    app.submit(submitted().model_copy(update={"workflow": "flaky"}))
    return store, clock, transport, app


def test_ship_is_sent_the_reservation_that_reserve_returned():
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    run_to_completion(
        store, transport, clock, instance(store, transport, ROUTES, clock, REGISTRY, "s1")
    )
    sent = requests(transport)
    assert sent["ship"].payload["reservation"] == {"ref": "reserve"}  # reserve's result
    assert "reservation" not in sent["charge"].payload
    assert sent["charge"].payload["order_id"] == "o1"
    state = state_of(store)
    assert state.process_state is ProcessState.PROCESSED
    assert state.results == {"reserve": {"ref": "reserve"}, "charge": {"ref": "charge"},
                             "ship": {"ref": "ship"}}  # fmt: skip


def test_a_builder_that_fails_stops_the_order_in_error_naming_the_step_and_the_error(caplog):
    def broken(order: Any, results: Any) -> dict[str, Any]:
        return {"fixed": results["go"]["missing"]}

    first = StepDefinition("go", "payment", "charge", timedelta(seconds=5))
    store, _, transport, app = submitted_to(first, broken)
    with caplog.at_level(logging.ERROR):
        app.on_reply(ok_reply(requests(transport)["go"]))
    assert set(requests(transport)) == {"go"}  # then's data did not build: nothing sent
    state = state_of(store)
    assert state.process_state is ProcessState.ERROR and state.step == "then"
    assert state.last_error == "then: its input builder raised KeyError (a bug in the app)"
    assert "sas.step_input_failed error=KeyError" in caplog.text
    assert "missing" not in caplog.messages[-1]  # the event names the error type only
    kinds = [entry.kind for entry in store.get_history("o1")]
    assert kinds[-2:] == ["completed", "input_failed"] and "go" in state.results
    alerts = [m for m in transport.sent if type(m.message).__name__ == "OperatorAlert"]
    assert len(alerts) == 1


def test_a_builder_that_fails_when_a_retry_is_claimed_stops_the_order_in_error():
    calls: list[int] = []

    def fails_second(order: Any, results: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) > 2:  # built once to check the claim, once to send it
            raise ValueError("no")
        return {}

    first = StepDefinition("first", "payment", "charge", timedelta(seconds=5))
    store, clock, transport, app = submitted_to(first, fails_second)
    app.on_reply(ok_reply(requests(transport)["first"]))
    assert "then" in requests(transport)  # claimed and sent: it built then
    clock.advance(8)
    app.sweep()  # expired: a retry, after a backoff
    clock.advance(10)
    app.schedule(ScheduleRequest(order_id="o1"))
    state = state_of(store)
    assert state.process_state is ProcessState.ERROR
    assert state.last_error == "then: its input builder raised ValueError (a bug in the app)"
    assert [e.kind for e in store.get_history("o1")][-1] == "input_failed"
    sent = [s.message for s in transport.sent if isinstance(s.message, StepRequest)]
    assert [request.step for request in sent] == ["first", "then"]  # none for the failed claim


def test_details_that_do_not_build_the_first_step_are_refused_before_any_write():
    def needs_name(order: Any, results: Any) -> dict[str, Any]:
        return {"name": order["name"]}

    step = StepDefinition("go", "payment", "charge", timedelta(seconds=5), input=needs_name)
    workflows = registry(Workflow("named", (step,)))
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    order = OrderSubmitted(order_id="o1", workflow="named", details={"other": 1})
    with pytest.raises(InvalidMessage, match=r"do not build the first step's input \(KeyError\)"):
        instance(store, transport, ROUTES, clock, workflows).submit(order)
    assert store.states == {} and transport.sent == []


def test_an_undo_gets_the_details_never_the_builders_data():
    def broken_later(order: Any, results: Any) -> dict[str, Any]:
        return {"ref": results["go"]["missing"]}  # fails once go has run

    first = StepDefinition("go", "payment", "charge", timedelta(seconds=5), undo="refund")
    then = StepDefinition(
        "then", "payment", "charge", timedelta(seconds=5), undo="refund", input=broken_later
    )
    workflow = Workflow("broken", (first, then))
    data = workflow.step_data(1, "o1", {"a": 1}, {"go": {"ref": "x"}}, "undo")
    assert data == {"a": 1, "order_id": "o1"}


def test_the_order_id_always_travels_and_cannot_be_overridden_by_the_data():
    step = StepDefinition("go", "payment", "charge", timedelta(seconds=5))
    workflow = Workflow("solo", (step,))
    assert workflow.step_data(0, "o1", {"order_id": "forged", "a": 1}, {}) == {
        "order_id": "o1",
        "a": 1,
    }


def test_an_order_submitted_with_other_details_is_refused_by_the_workflows_input():
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    order = OrderSubmitted(order_id="o1", details={"customer_id": "c1"})
    with pytest.raises(InvalidMessage, match="invalid details"):
        instance(store, transport, ROUTES, clock, REGISTRY).submit(order)
    assert store.get_state("o1") is None and transport.sent == []


def test_details_too_large_to_keep_are_refused():
    step = StepDefinition("go", "payment", "charge", timedelta(seconds=5))
    workflows = registry(Workflow("free", (step,)))  # no input schema
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    order = OrderSubmitted(order_id="o1", workflow="free", details={"text": "ж" * 8000})
    with pytest.raises(InvalidMessage, match="details too large to keep"):
        instance(store, transport, ROUTES, clock, workflows).submit(order)
    assert store.states == {}


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "details",
    [{"n": float("nan")}, {"s": "\ud800"}, _deep(5000)],
    ids=["nan", "lone surrogate", "deep"],
)
def test_details_no_json_document_can_carry_are_refused(details):
    step = StepDefinition("go", "payment", "charge", timedelta(seconds=5))
    with pytest.raises(ValueError, match="details are not JSON data"):
        Workflow("free", (step,)).parse_input(details)


def test_a_builder_that_fails_once_its_step_ran_never_stops_the_compensation():
    calls: list[int] = []

    def broken(order: Any, results: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) > 2:  # built to check the claim and to send it; never again
            raise KeyError("never builds")
        return {}

    first = StepDefinition("go", "payment", "charge", timedelta(seconds=5), undo="refund")
    store, clock, transport, app = submitted_to(first, broken, undo="refund", max_failures=1)
    app.on_reply(ok_reply(requests(transport)["go"]))
    assert "then" in requests(transport)  # sent, and lost
    clock.advance(8)
    app.sweep()  # then expired at its threshold: compensated, itself included
    for _ in range(2):  # then's undo, then go's
        app.schedule(ScheduleRequest(order_id="o1"))
        undo = [s.message for s in transport.sent if isinstance(s.message, StepRequest)][-1]
        assert undo.mode == "undo" and undo.payload["customer_id"] == "c1"  # the details
        app.on_reply(ok_reply(undo).model_copy(update={"mode": "undo"}))
    assert state_of(store).process_state is ProcessState.COMPENSATED

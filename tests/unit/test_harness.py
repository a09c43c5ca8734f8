"""The order workflow under each failure mode, in memory through sas.testing: the states,
history and effects the guarantees promise, each case in milliseconds."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from sas.actions import ActionContext, PythonAgent, Refused, app_table
from sas.domain.workflow import Registry, StepDefinition, Workflow
from sas.entrypoints.order_views import OrderView
from sas.testing import (
    Harness,
    HarnessError,
    ProcessState,
    crash_before_reply,
    fault,
    ok,
    refuse,
    too_slow,
)
from workflows import REGISTRY

pytestmark = [pytest.mark.unit, pytest.mark.fast]

DETAILS = {
    "customer_id": "c1",
    "currency": "EUR",
    "address": "1 Main St",
    "lines": [{"sku": "s1", "quantity": 1, "unit_price_cents": 100}],
}
DONE = {"o1:reserve", "o1:charge", "o1:ship"}


def order(harness: Harness) -> str:
    return harness.submit("order", DETAILS, order_id="o1")


def test_success_processes_every_step_once():
    harness = Harness(REGISTRY)
    harness.script("inventory", "reserve", ok({"reservation": "r1"}))
    order_id = order(harness)
    harness.run()
    assert harness.state(order_id).process_state is ProcessState.PROCESSED
    assert harness.effects == DONE
    assert harness.statuses(order_id)[-1] == "completed"
    assert harness.state(order_id).results["reserve"] == {"reservation": "r1"}


def test_transient_faults_are_retried_within_the_step():
    harness = Harness(REGISTRY)
    harness.script("payment", "charge", fault(), fault(retry_after=1), ok())
    order(harness)
    harness.run()
    assert harness.state("o1").process_state is ProcessState.PROCESSED
    charges = [(c.agent, c.action, c.key) for c in harness.calls if c.action == "charge"]
    assert charges == [("payment", "charge", harness.key("o1", "charge"))] * 3
    assert harness.history("o1").count("claimed:charge") == 1  # one attempt was enough


def test_a_refusal_compensates_the_steps_done_in_reverse():
    harness = Harness(REGISTRY)
    harness.script("shipping", "ship", refuse("no courier"))
    order(harness)
    harness.run()
    state = harness.state("o1")
    assert state.process_state is ProcessState.COMPENSATED
    assert "no courier" in (state.last_error or "")
    assert harness.effects == {"o1:reserve", "o1:charge", "o1:charge:undo", "o1:reserve:undo"}
    undos = [c.action for c in harness.calls if c.key.endswith(":undo")]
    assert undos == ["refund", "release"]


def test_a_step_too_slow_for_its_deadline_is_retried_and_applied_once():
    harness = Harness(REGISTRY)
    harness.script("payment", "charge", too_slow(20))  # a 15 s budget
    order(harness)
    harness.run()
    assert harness.state("o1").process_state is ProcessState.PROCESSED
    assert "expired_retry:charge" in harness.history("o1")
    assert harness.effects == DONE  # the late call's effect and the retry's are one


def test_a_crash_before_the_reply_is_recovered_without_a_second_effect():
    harness = Harness(REGISTRY)
    harness.script("inventory", "reserve", crash_before_reply({"reservation": "r1"}))
    order(harness)
    harness.run()
    assert harness.state("o1").process_state is ProcessState.PROCESSED
    reserves = [c for c in harness.calls if c.action == "reserve"]
    assert len(reserves) == 2 and {c.key for c in reserves} == {harness.key("o1", "reserve")}
    assert harness.effects == DONE


def test_every_message_delivered_twice_changes_nothing():
    harness = Harness(REGISTRY, duplicate_deliveries=True)
    order(harness)
    harness.run()
    assert harness.state("o1").process_state is ProcessState.PROCESSED
    assert harness.effects == DONE
    assert "reply_dropped:reserve" in harness.history("o1")  # the duplicate reply, fenced
    assert harness.statuses("o1").count("completed") == 1


def test_a_step_that_keeps_expiring_is_compensated_including_itself():
    harness = Harness(REGISTRY, max_failures=2)
    harness.script("payment", "charge", too_slow(20), too_slow(20))
    order(harness)
    harness.run()
    assert harness.state("o1").process_state is ProcessState.COMPENSATED
    assert harness.effects >= {"o1:charge:undo", "o1:reserve:undo"}


def test_an_undo_refused_ends_in_error_with_one_alert():
    harness = Harness(REGISTRY)
    harness.script("shipping", "ship", refuse())
    harness.script("payment", "refund", refuse("refund rejected"))
    order(harness)
    harness.run()
    assert harness.state("o1").process_state is ProcessState.ERROR
    assert [a.order_id for a in harness.alerts] == ["o1"]


def test_bad_details_are_parked_and_nothing_runs():
    harness = Harness(REGISTRY)
    harness.submit("order", {"customer_id": "c1"}, order_id="o1")
    harness.run()
    assert harness.store.get_state("o1") is None
    (parked,) = harness.store.list_parked()
    assert parked.reason.startswith("invalid details")


def test_python_agents_run_their_own_functions_unless_scripted():
    seen: list[dict[str, Any]] = []

    def provision(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
        seen.append(data)
        return {"id": f"vm-{context.order_id}"}

    def notify(context: ActionContext, data: dict[str, Any]) -> None:
        raise Refused("mailbox full")

    steps = (
        StepDefinition("provision", "cloud", "provision", timedelta(seconds=15)),
        StepDefinition("notify", "mailer", "send", timedelta(seconds=15)),
    )
    registry = Registry(
        (Workflow("setup", steps, on_failure="error"),),
        python_agents=(
            PythonAgent("cloud", {"provision": provision}),
            PythonAgent("mailer", {"send": notify}),
        ),
    )
    harness = Harness(registry)
    harness.submit("setup", {"name": "a"}, order_id="a1")
    harness.script("mailer", "send", fault(), ok())
    harness.submit("setup", {"name": "b"}, order_id="b1")
    harness.run()
    assert harness.state("a1").process_state is ProcessState.PROCESSED
    assert harness.state("b1").process_state is ProcessState.ERROR  # the real notify refused
    assert seen == [{"name": "a", "order_id": "a1"}, {"name": "b", "order_id": "b1"}]
    assert harness.state("a1").results["provision"] == {"id": "vm-a1"}


def test_the_harness_refuses_a_clock_that_would_not_move():
    with pytest.raises(ValueError, match="must be positive"):
        Harness(REGISTRY, supervisor_every=0)


def test_a_script_names_only_actions_a_step_calls_and_what_is_left_is_shown():
    harness = Harness(REGISTRY)
    with pytest.raises(ValueError, match="no step calls 'payment' action 'chargee'"):
        harness.script("payment", "chargee", fault())
    harness.script("payment", "refund", ok())  # never called: the order succeeds
    order(harness)
    harness.run()
    assert list(harness.unused()) == [("payment", "refund")]
    (ship,) = [c for c in harness.calls if c.action == "ship"]
    assert ship.data["reservation"] == {}  # what the builder made of reserve's result


@pytest.mark.parametrize(
    ("needs", "problem"),
    [
        (lambda context: app_table("ledger"), "table 'ledger': no Python agent declares it"),
        (lambda context: context.setting("AUDIT_URL"), "does not declare it"),
    ],
    ids=["table", "setting"],
)
def test_an_action_needing_what_its_agent_does_not_declare_stops_the_run(needs, problem):
    """A deployed agent retries a configuration fault like any other (it may be fixed); in
    memory it is the test's own mistake, and it stops the run saying what is missing."""

    def audit(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
        needs(context)
        return {}

    step = StepDefinition("audit", "auditor", "audit", timedelta(seconds=15))
    registry = Registry(
        (Workflow("audited", (step,)),),
        python_agents=(PythonAgent("auditor", {"audit": audit}, tables=("audit",)),),
    )
    harness = Harness(registry)
    harness.submit("audited", {})
    with pytest.raises(HarnessError, match=problem):
        harness.run()


def test_an_action_keeps_its_effects_in_its_declared_table_in_memory():
    """The workspace example as written (workflows/workspace.py: ``app_table("workspaces")``,
    a create that conflicts on a key used before), every message delivered twice."""
    harness = Harness(REGISTRY, duplicate_deliveries=True)
    request = {"team": "Blue", "owner": "o@example.com", "plan": "team", "region": "eastus"}
    order_id = harness.submit("workspace", request)
    harness.run()
    assert harness.state(order_id).process_state is ProcessState.PROCESSED
    rows = list(harness.tables["workspaces"].query_entities(f"PartitionKey eq '{order_id}'"))
    assert sorted(row["Action"] for row in rows) == ["configure", "create", "notify"]
    created = next(row for row in rows if row["Action"] == "create")
    assert json.loads(created["Result"]) == harness.state(order_id).results["create"]


def _late_then_retried(harness: Harness, agent: str, action: str, step: str) -> str:
    harness.script(agent, action, too_slow(20, {"booking": "first"}))
    order_id = harness.submit(*_TRIP_OR_ORDER[agent])
    harness.run()
    assert f"expired_retry:{step}" in harness.history(order_id)  # the late answer was dropped
    return order_id


_TRIP_OR_ORDER = {"payment": ("order", DETAILS), "hotels": ("trip", {})}


def test_a_retry_after_a_late_answer_gets_the_first_result_of_an_http_service():
    harness = Harness(REGISTRY)
    order_id = _late_then_retried(harness, "payment", "charge", "charge")
    assert harness.state(order_id).results["charge"] == {"booking": "first"}
    assert [c.action for c in harness.calls].count("charge") == 2


def test_a_retry_after_a_late_answer_gets_the_first_result_of_a_python_action():
    ran: list[str] = []

    def book(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
        ran.append(context.idempotency_key)
        return {"booking": "another"}

    step = StepDefinition("hotel", "hotels", "book", timedelta(seconds=15))
    trip = Registry((Workflow("trip", (step,)),), (PythonAgent("hotels", {"book": book}),))
    harness = Harness(trip)
    order_id = _late_then_retried(harness, "hotels", "book", "hotel")
    assert harness.state(order_id).results["hotel"] == {"booking": "first"}
    assert ran == []  # the scripted call applied it: the retry is answered as a replay


def test_an_order_reads_as_the_api_shows_it():
    harness = Harness(REGISTRY)
    harness.script("inventory", "reserve", ok({"reservation": "r1"}))
    order_id = order(harness)
    harness.run()
    view = harness.order(order_id)
    assert isinstance(view, OrderView)
    assert (view.process_state, view.step) == ("Processed", "ship")
    assert [(s.name, s.result) for s in view.steps] == list(harness.state(order_id).results.items())
    assert view.steps[0].result == {"reservation": "r1"}
    with pytest.raises(LookupError):
        harness.order("no-such-order")

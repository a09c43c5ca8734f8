"""Orders survive a change of their workflow: each runs to its end on the definition it was
bound to at submission, whatever is deployed meanwhile (in memory; tests/integration/
test_versions_on_azurite.py runs the same deploys on Table Storage).

TRIP books a flight (an HTTP agent), a hotel (a Python agent that keeps its own bookings) and
charges (HTTP). Ten orders are stopped in flight, mid-step, then the app is deployed again."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from sas.actions import ActionContext
from sas.domain.errors import InvalidMessage
from sas.domain.messages import OrderSubmitted
from sas.domain.model import ProcessState
from sas.domain.wire import missing_definition_key
from sas.domain.workflow import PythonAgent, Registry, StepDefinition, Workflow
from sas.services.operator import Operator
from sas.testing import Harness, crash_before_reply, refuse, too_slow
from tests.harness import CLAIMED, ReadThenYield, World
from tests.unit.test_failure_modes import order
from tests.workflows import REGISTRY as SHOP_REGISTRY
from tests.workflows import SHOP, basket

pytestmark = [pytest.mark.unit, pytest.mark.fast]

BUDGET = timedelta(seconds=15)
ORDERS = 10

BOOKED: dict[str, dict[str, Any]] = {}
"""The hotel service's own record, by idempotency key: a retry under a key books nothing."""


def book(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    found = BOOKED.setdefault(
        context.idempotency_key,
        {"order_id": data["order_id"], "room": f"room-{len(BOOKED)}", "undone": False},
    )
    return {"room": found["room"]}


def cancel(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    BOOKED[str(data["original_key"])]["undone"] = True
    return {}


def send(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    BOOKED.setdefault(context.idempotency_key, {"order_id": data["order_id"], "mail": True})
    return {}


HOTELS = PythonAgent("hotels", {"book": book, "cancel": cancel})
MAILER = PythonAgent("mailer", {"send": send})

FLIGHT = StepDefinition("flight", "flights", "book", BUDGET, undo="cancel")
HOTEL = StepDefinition("hotel", "hotels", "book", BUDGET, undo="cancel")
PAY = StepDefinition("pay", "payment", "charge", BUDGET, undo="refund")
NOTIFY = StepDefinition("notify", "mailer", "send", BUDGET)

V1 = Workflow("trip", (FLIGHT, HOTEL, PAY))
RENAMED = Workflow("trip", (StepDefinition("airfare", "flights", "book", BUDGET, undo="cancel"),
                            HOTEL, PAY), version=2)  # fmt: skip
SWAPPED = Workflow("trip", (FLIGHT, PAY, HOTEL), version=2)
APPENDED = Workflow("trip", (FLIGHT, HOTEL, PAY, NOTIFY), version=2)
SHORTER = Workflow("trip", (FLIGHT, PAY), version=2)


def deployed(*trips: Workflow) -> Registry:
    agents = [HOTELS, *((MAILER,) if any(NOTIFY in t.steps for t in trips) else ())]
    return Registry(workflows=(*trips, *SHOP_REGISTRY.workflows), python_agents=tuple(agents))


@pytest.fixture(autouse=True)
def _fresh_hotel() -> None:
    BOOKED.clear()


def in_flight(harness: Harness, *, stopped_at: str) -> list[str]:
    """ORDERS trip orders, each stopped in the middle of step ``stopped_at``: the call was
    made and applied, then its host died before the reply (the request comes back later)."""
    step = next(s for s in V1.steps if s.name == stopped_at)
    harness.script(step.agent, step.action, *[crash_before_reply({"ref": "first"})] * ORDERS)
    ids = [harness.submit("trip", {"traveller": n}, order_id=f"t{n}") for n in range(ORDERS)]
    harness.run(for_seconds=1)
    for order_id in ids:
        state = harness.state(order_id)
        assert state.is_running and state.step == stopped_at, state
    return ids


def effects(harness: Harness, order_id: str) -> Counter[str]:
    """How many effects (distinct keys, not undone) were applied for the order, by
    ``agent.action``: at the remote (HTTP calls, and scripted ones), in the hotel's record."""
    keys: set[tuple[str, str]] = set()
    for (agent, action, key), effect in harness.remote.effects.items():
        if effect.order_id == order_id and effect.undoes is None and effect.undone_by is None:
            keys.add((f"{agent}.{action}", key))
    for key, row in BOOKED.items():
        if row["order_id"] == order_id and not row.get("undone"):
            keys.add(("mailer.send" if row.get("mail") else "hotels.book", key))
    return Counter(label for label, _ in keys)


def assert_ran_on(harness: Harness, order_id: str, workflow: Workflow) -> None:
    """Processed on ``workflow``: each of its steps' effects applied once, each recorded
    (no effect twice, none orphaned), and nothing of any other step."""
    state = harness.state(order_id)
    assert state.process_state is ProcessState.PROCESSED, (order_id, state.last_error)
    assert (state.version, state.definition) == (workflow.version, workflow.fingerprint)
    expected = Counter(f"{s.agent}.{s.action}" for s in workflow.steps)
    assert effects(harness, order_id) == expected, order_id
    recorded = [s.name for s in harness.store.get_steps(order_id)]
    assert sorted(recorded) == sorted(s.name for s in workflow.steps), order_id


@pytest.mark.parametrize(
    ("change", "stopped_at"),
    [(RENAMED, "flight"), (SWAPPED, "hotel"), (APPENDED, "pay"), (SHORTER, "hotel")],
    ids=["rename", "swap", "append", "remove-a-step"],
)
def test_orders_in_flight_finish_on_the_version_they_began_with(
    change: Workflow, stopped_at: str
) -> None:
    harness = Harness(deployed(V1))
    started = in_flight(harness, stopped_at=stopped_at)
    harness.deploy(deployed(V1, change))  # the new version beside the old one
    later = harness.submit("trip", {"traveller": "late"}, order_id="t-new")
    harness.run()
    for order_id in started:
        assert_ran_on(harness, order_id, V1)
    assert_ran_on(harness, later, change)
    assert harness.store.list_parked() == [] and harness.alerts == []


def test_a_step_renamed_in_place_makes_orders_wait_not_book_twice() -> None:
    """The mistake the lock test (tests/unit/test_workflow_lock.py) exists for, made anyway:
    v1 edited in place. Its orders wait, visibly, instead of running on the edit."""
    harness = Harness(deployed(V1))
    started = in_flight(harness, stopped_at="flight")
    edited = Workflow("trip", RENAMED.steps)  # still "version 1"
    harness.deploy(deployed(edited))
    harness.run(for_seconds=600)
    for order_id in started:
        state = harness.state(order_id)
        assert state.is_running and state.waiting is not None, state
        assert "changed since the order began" in state.waiting
        assert "waiting:flight" in harness.history(order_id)
        assert effects(harness, order_id) == Counter({"flights.book": 1})
    (alert,) = harness.alerts  # one for the definition, not one per order
    assert "trip v1 changed" in alert.reason
    harness.deploy(deployed(V1, RENAMED))  # v1 as it was, the rename as v2
    harness.run()
    for order_id in started:
        assert_ran_on(harness, order_id, V1)
        assert "resumed:flight" in harness.history(order_id)
    assert harness.store.get_missing(f"trip.1.{V1.fingerprint}") is None


def test_orders_of_a_removed_version_wait_and_finish_when_it_is_back() -> None:
    harness = Harness(deployed(V1))
    started = in_flight(harness, stopped_at="hotel")
    harness.deploy(deployed(SWAPPED))  # v1 gone
    harness.run(for_seconds=900)
    waiting = [harness.state(order_id) for order_id in started]
    assert all(s.waiting == "trip v1 is not deployed" for s in waiting)
    assert harness.store.get_missing(f"trip.1.{V1.fingerprint}") is not None
    assert len(harness.alerts) == 1
    assert harness.store.list_parked() == []
    harness.deploy(deployed(V1, SWAPPED))
    harness.run()
    for order_id in started:
        assert_ran_on(harness, order_id, V1)


def test_an_operator_may_close_an_order_whose_version_is_gone() -> None:
    harness = Harness(deployed(V1))
    (first, *_) = in_flight(harness, stopped_at="hotel")
    harness.deploy(deployed(SWAPPED))
    harness.run(for_seconds=120)
    closed = Operator(harness.ctx).close(first, actor="ops", reason="refunded by hand")
    assert closed.process_state is ProcessState.CLOSED and closed.waiting is None
    harness.run(for_seconds=600)
    assert harness.state(first).process_state is ProcessState.CLOSED


@pytest.mark.parametrize("seed", range(4))
def test_during_a_deploy_old_hosts_leave_new_versions_to_new_hosts(seed: int) -> None:
    """Old hosts (v1 only) and new ones (v1 and v2) take messages at random: an old host
    never parks, fails or runs a v2 order, nor alerts about it; it leaves it to a new host."""
    harness = Harness(deployed(V1), seed=seed)
    started = in_flight(harness, stopped_at="hotel")
    harness.deploy(deployed(V1, APPENDED), alongside=True)
    newer = [harness.submit("trip", {"traveller": n}, order_id=f"n{n}") for n in range(ORDERS)]
    harness.run()
    for order_id in started:
        assert_ran_on(harness, order_id, V1)
    versions = Counter(harness.state(order_id).version for order_id in newer)
    assert sum(versions.values()) == ORDERS
    for order_id in newer:
        state = harness.state(order_id)
        assert_ran_on(harness, order_id, V1 if state.version == 1 else APPENDED)
    assert harness.store.list_parked() == [] and harness.alerts == []
    assert all(h.count("expired") == 0 for o in newer for h in harness.history(o))
    held = [s for s in harness.queues.sent if s.message_id.count(":held:")]
    assert held, "an old host was handed a message of a v2 order"


def test_a_submission_may_name_its_version() -> None:
    harness = Harness(deployed(V1, APPENDED))
    for version in (1, 2):
        submit(harness, f"v{version}", version)
    harness.run()
    assert_ran_on(harness, "v1", V1)
    assert_ran_on(harness, "v2", APPENDED)


def test_a_submission_naming_a_version_not_deployed_is_held_or_refused() -> None:
    """Newer than any deployed: a host mid-deploy, so it waits for one that has it. Older: a
    mistake, refused with the versions there are."""
    harness = Harness(deployed(APPENDED))
    submit(harness, "future", 3)
    submit(harness, "past", 1)
    harness.run(for_seconds=120)
    (parked,) = harness.store.list_parked()
    assert "has no version 1 (deployed: 2)" in parked.reason
    held = [s for s in harness.queues.sent if s.queue == "orders" and ":held:" in s.message_id]
    assert held and all(getattr(s.message, "order_id", None) == "future" for s in held)
    harness.deploy(deployed(APPENDED, Workflow("trip", APPENDED.steps, version=3)))
    harness.run()
    assert harness.state("future").version == 3


def submit(harness: Harness, order_id: str, version: int) -> None:
    message = OrderSubmitted(order_id=order_id, workflow="trip", version=version, details={})
    harness.queues.send("orders", message, message_id=order_id, correlation_id=order_id)


def test_an_old_host_takes_every_request_first_and_no_v2_order_fails() -> None:
    """The worst turn of a rolling deploy: an old host is handed every message first. Agents
    run any version's steps whose actions they have, and hold only the rest, briefly."""
    harness = Harness(deployed(V1))
    harness.deploy(deployed(V1, APPENDED), alongside=True)
    old, new = harness._hosts
    firsts: set[str] = set()

    def old_first(queue: str | None = None) -> Any:
        if queue is None or queue not in old.ctx.routes.consumed:
            return new
        key = f"{queue}:{len(harness.queues.sent)}"
        if key in firsts:
            return new
        firsts.add(key)
        return old

    harness._next_host = old_first  # type: ignore[method-assign]
    ids = [harness.submit("trip", {"traveller": n}, order_id=f"m{n}") for n in range(ORDERS)]
    harness.run()
    for order_id in ids:
        state = harness.state(order_id)
        assert_ran_on(harness, order_id, V1 if state.version == 1 else APPENDED)
    assert harness.alerts == []


def test_an_expiry_left_while_waiting_is_counted_when_the_version_is_back() -> None:
    """Charged, but the answer came too late; the expiry came while the version was gone.
    Once it is back the expiry counts as any other: the retry is refused, and the charge
    (maybe applied) is refunded with the rest."""
    harness = Harness(deployed(V1))
    harness.script("payment", "charge", too_slow(600, {"charge": "c1"}), refuse("declined"))
    harness.submit("trip", {"traveller": 1}, order_id="t1")
    harness.run(for_seconds=1)
    assert harness.state("t1").step == "pay"
    harness.deploy(deployed(SWAPPED))
    harness.run(for_seconds=120)
    assert harness.state("t1").waiting is not None
    harness.deploy(deployed(V1, SWAPPED))
    harness.run()
    state = harness.state("t1")
    assert state.process_state is ProcessState.COMPENSATED
    assert "resumed:pay" in harness.history("t1")
    assert harness.remote.applied("t1")[("payment", "charge")] is True  # undone


def test_a_missing_definition_is_alerted_again_once_it_was_back() -> None:
    harness = Harness(deployed(V1))
    harness.queues.fail_next_send_to.add("alerts")  # the first alert's send fails
    in_flight(harness, stopped_at="hotel")
    harness.deploy(deployed(SWAPPED))
    harness.run(for_seconds=180)
    assert len(harness.alerts) == 1  # the failed send was tried again
    harness.deploy(deployed(V1, SWAPPED))
    harness.run()
    harness.submit("trip", {"traveller": "again"}, order_id="t-again")
    harness.script("hotels", "book", crash_before_reply())
    harness.deploy(deployed(V1))
    harness.run(for_seconds=1)
    harness.deploy(deployed(SWAPPED))
    harness.run(for_seconds=180)
    assert len(harness.alerts) == 2  # a second episode, a second alert


def test_a_submission_held_for_an_hour_is_refused_and_parked() -> None:
    harness = Harness(deployed(V1))
    submit(harness, "typo", 20)
    harness.run(for_seconds=2 * 3600)
    (parked,) = harness.store.list_parked()
    assert "trip v20 is not deployed (no host had it for an hour)" in parked.reason
    assert harness.store.get_state("typo") is None


def test_a_sweep_that_loses_its_race_to_a_reply_leaves_the_marker_due_in_time() -> None:
    """An old host's Supervisor reads an expired v2 order; meanwhile a new host applies its
    reply and claims the next step: the marker stays due by the new deadline."""
    harness = Harness(deployed(V1))
    harness.deploy(deployed(V1, APPENDED), alongside=True)
    old, new = harness._hosts
    new.submit(OrderSubmitted(order_id="a1", workflow="trip", details={}))
    for message in harness.queues.take("agent-flights"):
        new.consume("agent-flights", message)
    (reply,) = harness.queues.take("replies")
    harness.clock.advance(20 + 11 * 60)  # the flight's deadline passed long ago
    meanwhile = ReadThenYield(harness.store, lambda: new.on_reply(reply))  # type: ignore[arg-type]
    old.named("old-supervisor", store=meanwhile).sweep()
    state = harness.state("a1")
    assert state.is_running and state.step == "hotel"
    (marker,) = harness.store.list_due(state.complete_by)  # type: ignore[arg-type]
    assert marker.due_at <= state.complete_by  # type: ignore[operator]


@pytest.mark.parametrize("field", ["deferred_since", "held_since", "holds", "room_turn"])
def test_an_operator_may_not_submit_what_only_the_app_sets(field: str) -> None:
    harness = Harness(deployed(V1))
    value: object = 1 if field == "holds" else harness.clock.now()
    order = OrderSubmitted.model_validate(
        {"order_id": "x1", "workflow": "trip", "details": {}, field: value}
    )
    with pytest.raises(InvalidMessage, match=f"{field} is set by the app"):
        Operator(harness.ctx).submit(order)
    assert harness.queues.sent == []


def test_a_purged_id_submitted_again_gets_new_effects_under_new_keys() -> None:
    """HTTP agents: the remote keeps the first order's effects under its keys; the same id
    submitted again after a purge, with other details, is called under keys of its own."""
    harness = Harness(SHOP_REGISTRY)
    harness.submit("order", basket(address="1 First St"), order_id="o1")
    harness.run()
    first = harness.state("o1")
    stored = harness.store.get_state("o1")
    assert stored is not None and harness.store.purge_order(stored)
    harness.submit("order", basket(address="2 Second St"), order_id="o1")
    harness.run()
    again = harness.state("o1")
    assert again.process_state is ProcessState.PROCESSED
    assert again.incarnation != first.incarnation
    keys = {key for (_, _, key), effect in harness.remote.effects.items() if not effect.undoes}
    assert len(keys) == 6  # three steps, twice, never one key for both
    assert {harness.key("o1", s.name) for s in SHOP.steps} < keys
    ships = [c for c in harness.calls if c.action == "ship"]
    assert [c.data["address"] for c in ships] == ["1 First St", "2 Second St"]


def test_a_pending_order_claimed_once_its_definition_is_back_forgets_the_absence() -> None:
    """The held schedule request can claim it before any sweep resumes it: the claim says it
    resumed and forgets the absence, so the next one is alerted again."""
    world = World()
    oid = order(world)
    world.drop("agent-inventory")
    world.tick(CLAIMED + 1)  # expired: Pending, its schedule request after a backoff
    original = world.app
    edited = replace(SHOP, steps=(replace(SHOP.steps[0], name="reserved"), *SHOP.steps[1:]))
    world.app = original.named("edited", workflows=Registry(workflows=(edited,)))
    world.supervisor = world.app.named("supervisor-edited")  # v1 edited in place
    for _ in range(200):
        world.clock.advance(1)
        world.run()
        world.tick()
        if world.state(oid).waiting is not None:
            break
    state = world.state(oid)
    assert state.waiting is not None and state.process_state is ProcessState.PENDING
    key = missing_definition_key(state.workflow, state.version, state.definition)
    assert world.store.get_missing(key) is not None
    world.app = original  # v1 as it was; no sweep meanwhile
    for _ in range(400):
        world.clock.advance(1)
        world.run()
        if world.state(oid).waiting is None:
            break
    assert "resumed" in world.history(oid)
    assert world.store.get_missing(key) is None

"""Service logic against recording fakes; the same flows run against Azurite in integration."""

from datetime import timedelta

import pytest

from sas.domain.messages import (
    OrderSubmitted,
    ScheduleRequest,
    StepReply,
    StepRequest,
)
from sas.domain.model import ProcessState
from sas.domain.wire import idempotency_key
from sas.domain.workflow import START_SLACK
from sas.services.backlog import Backlog
from sas.services.context import Routes
from sas.services.scheduler import ReplyOutcome, ScheduleOutcome
from sas.services.submission import SubmissionOutcome
from sas.testing import FakeClock, InMemoryQueues, InMemoryStore, instance
from tests.workflows import REGISTRY, SHOP, STRICT, Basket, Line

pytestmark = [pytest.mark.unit, pytest.mark.fast]

ROUTES = Routes(
    "orders",
    "scheduler",
    "replies",
    "alerts",
    {"inventory": "agent-inventory", "payment": "agent-payment", "shipping": "agent-shipping"},
)


def submitted(
    order_id="o1",
    reply_to="status-q",
    address="1 Main St",
    status_events="outcome",
    priority="normal",
) -> OrderSubmitted:
    return OrderSubmitted(
        order_id=order_id,
        details=Basket(
            customer_id="c1",
            currency="EUR",
            address=address,
            lines=[Line(sku="s1", quantity=1, unit_price_cents=100)],
        ).model_dump(mode="json"),
        reply_to=reply_to,
        status_events=status_events,
        priority=priority,
    )


@pytest.fixture
def parts():
    clock = FakeClock()
    return InMemoryStore(), InMemoryQueues(clock), clock


def test_submission_inserts_the_order_claims_its_first_step_and_dispatches_it(parts):
    store, transport, clock = parts
    assert (
        instance(store, transport, ROUTES, clock, REGISTRY, "h1").submit(submitted())
        is SubmissionOutcome.ACCEPTED
    )
    state = store.get_state("o1").value
    assert (state.process_state, state.attempt, state.locked_by) == (
        ProcessState.PROCESSING,
        1,
        "h1",
    )
    assert state.details == store.get_order("o1").details  # dispatching reads nothing else
    assert transport.to("scheduler") == []
    [request] = transport.to("agent-inventory")
    assert (request.step, request.attempt) == ("reserve", 1)
    assert [h.kind for h in store.get_history("o1")] == ["submitted", "claimed"]
    assert transport.to("status-q") == []  # outcome events only, by default


def test_a_submitter_that_asks_for_steps_hears_of_each_step(parts):
    store, transport, clock = parts
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted(status_events="steps"))
    assert [m.status for m in transport.to("status-q")] == ["received", "step_started"]
    assert store.get_state("o1").value.status_events == "steps"


def test_the_default_status_level_keeps_an_orders_fingerprint(parts):
    """A field left at its default is not part of the fingerprint: adding a field with a
    default changes no order's fingerprint (a redelivery stays a redelivery)."""
    default = submitted()
    explicit = submitted(status_events="steps")
    assert "status_events" not in default.model_dump_json(exclude_defaults=True)
    assert default.fingerprint() != explicit.fingerprint()
    assert default.fingerprint() != submitted(priority="high").fingerprint()
    without_defaults = default.model_dump(mode="json")
    for optional in (
        "status_events",
        "priority",
        "deferred_since",
        "trace",
        "version",
        "held_since",
        "holds",
        "room_turn",
    ):
        without_defaults.pop(optional)
    import hashlib
    import json

    canonical = json.dumps(without_defaults, sort_keys=True, separators=(",", ":"))
    assert default.fingerprint() == hashlib.sha256(canonical.encode()).hexdigest()


def test_a_missing_reply_to_queue_does_not_fail_the_order(parts):
    store, transport, clock = parts
    transport.missing_queues.add("status-q")
    assert (
        instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted(status_events="steps"))
        is SubmissionOutcome.ACCEPTED
    )
    assert transport.to("agent-inventory")


def test_conflicting_resubmission_is_refused_and_reported(parts):
    store, transport, clock = parts
    submission = instance(store, transport, ROUTES, clock, REGISTRY)
    submission.submit(submitted())
    assert submission.submit(submitted(address="elsewhere")) is SubmissionOutcome.CONFLICT
    assert store.get_order("o1").details["address"] == "1 Main St"
    assert [m.status for m in transport.to("status-q")] == ["rejected"]


def ok_reply(request: StepRequest) -> StepReply:
    """The agent's success for ``request``."""
    return StepReply(
        order_id=request.order_id,
        step=request.step,
        step_index=request.step_index,
        attempt=request.attempt,
        outcome="ok",
        result={"ref": request.step},
        incarnation=request.incarnation,
    )


def run_to_completion(store, transport, clock, scheduler):
    """Play the agents: answer every StepRequest with success, in order."""
    handled = 0
    while True:
        requests = [s.message for s in transport.sent if isinstance(s.message, StepRequest)]
        if handled == len(requests):
            return
        req = requests[handled]
        handled += 1
        clock.advance(1)
        scheduler.on_reply(ok_reply(req))


def test_the_scheduler_drives_every_step_to_processed(parts):
    store, transport, clock = parts
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted(status_events="steps"))
    scheduler = instance(store, transport, ROUTES, clock, REGISTRY, "s1")
    run_to_completion(store, transport, clock, scheduler)
    state = store.get_state("o1").value
    assert state.process_state is ProcessState.PROCESSED
    requests = [s for s in transport.sent if isinstance(s.message, StepRequest)]
    assert [(s.queue, s.message.attempt) for s in requests] == [
        ("agent-inventory", 1),
        ("agent-payment", 2),
        ("agent-shipping", 3),
    ]
    keys = [
        idempotency_key("o1", state.incarnation, s, "do") for s in ("reserve", "charge", "ship")
    ]
    assert [s.message_id for s in requests] == [f"{key}:{n}" for n, key in enumerate(keys, 1)]
    assert [s.message.idempotency_key for s in requests] == keys
    assert [s.name for s in store.get_steps("o1")] == [s.name for s in SHOP.steps]
    statuses = [m.status for m in transport.to("status-q")]
    assert statuses[0] == "received" and statuses[-1] == "completed"


def test_by_default_a_submitter_hears_only_how_the_order_ends(parts):
    store, transport, clock = parts
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    run_to_completion(
        store, transport, clock, instance(store, transport, ROUTES, clock, REGISTRY, "s1")
    )
    assert [m.status for m in transport.to("status-q")] == ["completed"]


def test_schedule_of_an_order_that_is_not_pending_does_nothing(parts):
    store, transport, clock = parts
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    scheduler = instance(store, transport, ROUTES, clock, REGISTRY, "s1")
    scheduler.schedule(ScheduleRequest(order_id="o1"))
    before = len(transport.sent)
    assert scheduler.schedule(ScheduleRequest(order_id="o1")) is ScheduleOutcome.NOT_PENDING
    assert scheduler.schedule(ScheduleRequest(order_id="nope")) is ScheduleOutcome.UNKNOWN_ORDER
    assert len(transport.sent) == before


def test_a_reply_for_an_old_attempt_is_dropped(parts):
    store, transport, clock = parts
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    scheduler = instance(store, transport, ROUTES, clock, REGISTRY, "s1")
    scheduler.schedule(ScheduleRequest(order_id="o1"))
    before = store.get_state("o1")
    late = StepReply(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=7,
        outcome="ok",
        incarnation=store.get_state("o1").value.incarnation,
    )
    assert scheduler.on_reply(late) is ReplyOutcome.STALE
    assert store.get_state("o1") == before
    assert store.get_steps("o1") == []


def test_a_reply_naming_the_wrong_step_is_dropped(parts):
    store, transport, clock = parts
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    scheduler = instance(store, transport, ROUTES, clock, REGISTRY, "s1")
    scheduler.schedule(ScheduleRequest(order_id="o1"))
    wrong = StepReply(
        order_id="o1",
        step="charge",
        step_index=0,
        attempt=1,
        outcome="ok",
        incarnation=store.get_state("o1").value.incarnation,
    )
    assert scheduler.on_reply(wrong) is ReplyOutcome.STALE


def test_a_refusal_of_the_first_step_is_compensated_with_nothing_to_undo(parts):
    store, transport, clock = parts
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    scheduler = instance(store, transport, ROUTES, clock, REGISTRY, "s1")
    scheduler.schedule(ScheduleRequest(order_id="o1"))
    refusal = StepReply(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=1,
        outcome="error",
        error="no stock",
        incarnation=store.get_state("o1").value.incarnation,
    )
    assert scheduler.on_reply(refusal) is ReplyOutcome.FINISHED
    assert scheduler.on_reply(refusal) is ReplyOutcome.STALE  # a duplicate changes nothing
    state = store.get_state("o1").value
    assert state.process_state is ProcessState.COMPENSATED and "no stock" in state.last_error
    assert transport.to("alerts") == []
    assert transport.to("status-q")[-1].status == "compensated"
    assert [h.kind for h in store.get_history("o1")] == [
        "submitted",
        "claimed",
        "refused",
        "reply_dropped",
    ]


def test_an_error_reply_in_a_workflow_without_compensation_alerts_exactly_once(parts):
    assert STRICT.on_failure == "error" and STRICT.steps[0].name == "reserve"
    store, transport, clock = parts
    instance(store, transport, ROUTES, clock, REGISTRY).submit(
        submitted().model_copy(update={"workflow": STRICT.name})
    )
    scheduler = instance(store, transport, ROUTES, clock, REGISTRY, "s1")
    scheduler.schedule(ScheduleRequest(order_id="o1"))
    refusal = StepReply(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=1,
        outcome="error",
        error="declined",
        incarnation=store.get_state("o1").value.incarnation,
    )
    assert scheduler.on_reply(refusal) is ReplyOutcome.FINISHED
    assert scheduler.on_reply(refusal) is ReplyOutcome.STALE
    state = store.get_state("o1").value
    assert state.process_state is ProcessState.ERROR and "declined" in state.last_error
    assert state.alert_pending is False  # sent, and the debt cleared
    (alert,) = transport.to("alerts")
    assert alert.order_id == "o1" and "declined" in alert.reason
    assert transport.to("status-q")[-1].status == "failed"


def test_a_claimed_steps_deadline_covers_the_wait_in_its_agents_lane(parts):
    """Under a backlog the request waits behind older ones before any agent can start it: the
    deadline covers that wait (as long as the lane's oldest request has waited so far, capped),
    so a burst does not expire steps nobody started."""
    from sas.services.consequences import QUEUE_ALLOWANCE_BUDGETS

    store, transport, clock = parts
    budget = SHOP.steps[0].budget
    transport.waiting_since["agent-inventory"] = clock.now() - timedelta(seconds=40)
    instance(store, transport, ROUTES, clock, REGISTRY, backlog=Backlog(transport, clock)).submit(
        submitted("q1")
    )
    state = store.get_state("q1")
    assert state is not None
    assert state.value.complete_by == clock.now() + budget + START_SLACK + timedelta(seconds=40)
    transport.waiting_since["agent-inventory"] = clock.now() - timedelta(hours=1)
    instance(store, transport, ROUTES, clock, REGISTRY, backlog=Backlog(transport, clock)).submit(
        submitted("q2")
    )
    capped = store.get_state("q2")
    assert capped is not None
    allowance = budget * QUEUE_ALLOWANCE_BUDGETS
    assert capped.value.complete_by == clock.now() + budget + START_SLACK + allowance
    # Without a backlog (or without the option) the deadline is the budget alone.
    transport.waiting_since.clear()
    instance(store, transport, ROUTES, clock, REGISTRY, backlog=Backlog(transport, clock)).submit(
        submitted("q3")
    )
    plain = store.get_state("q3")
    assert plain is not None and plain.value.complete_by == clock.now() + budget + START_SLACK


def test_a_claimed_steps_deadline_also_covers_the_wait_its_reply_can_expect(parts):
    """A reply that waits in a backlogged replies lane past its step's deadline would have the
    step expired and run again: the deadline covers that lane's expected wait too."""
    store, transport, clock = parts
    budget = SHOP.steps[0].budget
    transport.waiting_since["agent-inventory"] = clock.now() - timedelta(seconds=10)
    transport.waiting_since["replies"] = clock.now() - timedelta(seconds=25)
    instance(store, transport, ROUTES, clock, REGISTRY, backlog=Backlog(transport, clock)).submit(
        submitted("r1")
    )
    state = store.get_state("r1")
    assert state is not None
    assert state.value.complete_by == clock.now() + budget + START_SLACK + timedelta(seconds=35)

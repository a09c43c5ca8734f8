"""Priority lanes, in memory with messages played by hand: an order's priority picks its lane
at every hop and is kept through retries, compensation and resubmission; a low-priority
submission yields to backlogged higher lanes, within its bound. What a real queue's peek says
about a delayed message is checked on Azurite (tests/integration/test_priorities.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sas.domain.messages import OrderSubmitted
from sas.domain.model import ProcessState
from sas.domain.priority import AdmissionPolicy, Waiting
from sas.domain.wire import PRIORITIES, Priority, lane_queue_name
from sas.services.backlog import Backlog
from sas.services.context import Routes
from sas.services.submission import SubmissionOutcome
from sas.testing import instance, refuse
from tests.harness import World
from tests.workflows import REGISTRY, basket

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def laned(queue: str) -> dict[Priority, str]:
    return {p: lane_queue_name(queue, p) for p in PRIORITIES}


AGENT_QUEUES = {
    "inventory": "agent-inventory",
    "payment": "agent-payment",
    "shipping": "agent-shipping",
}
LANED = Routes(
    "orders",
    "scheduler",
    "replies",
    "alerts",
    AGENT_QUEUES,
    lanes={q: laned(q) for q in ("orders", "scheduler", "replies", *AGENT_QUEUES.values())},
)


def order(order_id: str, priority: Priority = "normal") -> OrderSubmitted:
    return OrderSubmitted(
        order_id=order_id,
        details=basket(address="1 Lane Street", sku="s1"),
        priority=priority,
    )


def queues_used(world: World, order_id: str) -> set[str]:
    return {s.queue for s in world.bus.sent if getattr(s.message, "order_id", None) == order_id}


@pytest.mark.parametrize("priority", ["high", "low"])
def test_every_message_of_an_order_takes_its_priority_lane(priority):
    world = World(routes=LANED)
    world.submit(order("o1", priority))
    world.run()
    assert world.state("o1").process_state is ProcessState.PROCESSED
    assert world.state("o1").priority == priority
    used = queues_used(world, "o1")
    assert used == {
        f"agent-inventory-{priority}",
        f"agent-payment-{priority}",
        f"agent-shipping-{priority}",
        f"replies-{priority}",
    }


def test_priority_is_kept_through_retry_compensation_and_resubmission():
    world = World(routes=LANED, max_failures=2)
    world.remote.script("payment", "charge", refuse("card declined"))
    world.remote.script("inventory", "release", refuse("warehouse says no"))
    world.submit(order("o2", "high"))
    # The inventory agent dies holding the first request: the Supervisor retries the step.
    assert world.drop("agent-inventory-high")
    world.clock.advance(20)
    world.make_due("o2")
    world.tick()
    assert world.history("o2")[-1] == "expired_retry"
    world.clock.advance(3)
    # Then payment refuses: compensation; the undo is refused too: Error.
    world.run()
    assert world.state("o2").process_state is ProcessState.ERROR
    for sweep in range(3):  # the Supervisor sends the owed alert
        world.make_due("o2")
        world.tick(1 + sweep)
    assert world.remote.unused() == {}  # the warehouse refused once: the next release succeeds
    world.operator.resubmit("o2", actor="test-operator")
    world.run()
    assert world.state("o2").process_state is ProcessState.COMPENSATED
    kinds = world.history("o2")
    assert {"expired_retry", "refused", "resubmitted"} <= set(kinds)
    used = queues_used(world, "o2") - {"alerts"}
    assert used, "the order sent nothing"
    assert all(queue.endswith("-high") for queue in used), sorted(used)
    assert "scheduler-high" in used  # the retry, the compensation and the resubmission


def backlog_normal_orders(world: World, age_seconds: float) -> None:
    """A normal submission waiting in the orders queue for ``age_seconds``."""
    world.bus.send("orders", order("waiting"), message_id="waiting", correlation_id="waiting")
    world.clock.advance(age_seconds)


def test_a_low_submission_waits_while_a_higher_lane_is_backlogged():
    world = World(routes=LANED)
    policy = AdmissionPolicy(backlog=timedelta(seconds=5), max_deferral=timedelta(seconds=60))
    submission = instance(
        world.store, world.bus, LANED, world.clock, REGISTRY, admission=policy,
        backlog=Backlog(world.bus, world.clock),
    )  # fmt: skip
    backlog_normal_orders(world, 6)
    assert submission.submit(order("low-1", "low")) is SubmissionOutcome.DEFERRED
    assert world.store.get_state("low-1") is None  # nothing written
    (copy,) = world.bus.to("orders-low")
    assert isinstance(copy, OrderSubmitted)
    assert copy.deferred_since == world.clock.now()
    assert copy.fingerprint() == order("low-1", "low").fingerprint()
    (sent,) = [s for s in world.bus.sent if s.queue == "orders-low"]
    assert sent.due == world.clock.now() + policy.recheck
    # Still backlogged 30 s later: deferred again, the first deferral's time kept.
    world.clock.advance(30)
    assert submission.submit(copy) is SubmissionOutcome.DEFERRED
    again = world.bus.to("orders-low")[-1]
    assert isinstance(again, OrderSubmitted)
    assert again.deferred_since == copy.deferred_since
    # The bound: once deferred for max_deferral in all, it is let in whatever the backlog.
    world.clock.advance(31)
    assert submission.submit(again) is SubmissionOutcome.ACCEPTED
    assert world.state("low-1").priority == "low"


def test_a_low_submission_goes_straight_in_without_a_backlog():
    world = World(routes=LANED)
    backlog_normal_orders(world, 2)  # waiting, but not for long
    assert world.app.submit(order("low-2", "low")) is SubmissionOutcome.ACCEPTED
    assert world.bus.to("orders-low") == []


def test_high_and_normal_submissions_never_wait_for_admission():
    world = World(routes=LANED)
    backlog_normal_orders(world, 600)
    levels: tuple[Priority, ...] = ("high", "normal")
    for n, priority in enumerate(levels):
        outcome = world.app.submit(order(f"o-{n}", priority))
        assert outcome is SubmissionOutcome.ACCEPTED


def test_a_forged_deferral_time_in_the_future_never_stretches_the_bound():
    policy = AdmissionPolicy(backlog=timedelta(seconds=5), max_deferral=timedelta(seconds=60))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    delay = policy.deferral(
        "low",
        deferred_since=now + timedelta(days=365),
        now=now,
        higher=Waiting(now - timedelta(seconds=30), 1),
    )
    assert delay == policy.recheck
    assert (
        policy.deferral(
            "low",
            deferred_since=now - timedelta(seconds=60),
            now=now,
            higher=Waiting(now - timedelta(seconds=30), 1),
        )
        is None
    )


def test_a_burst_in_a_higher_lane_counts_as_a_backlog_before_it_has_waited_long():
    policy = AdmissionPolicy(backlog=timedelta(seconds=5))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    fresh = now - timedelta(seconds=1)
    assert policy.deferral("low", deferred_since=None, now=now, higher=Waiting(fresh, 31)) is None
    burst = Waiting(fresh, Waiting.PEEK)
    assert policy.deferral("low", deferred_since=None, now=now, higher=burst) == policy.recheck

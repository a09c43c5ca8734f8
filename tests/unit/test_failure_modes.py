"""The failure modes of the pattern (docs/architecture.md, "Failure modes") whose outcome the
domain decides, each its own test, in memory with an injected clock: retries, deadlines,
fencing, thresholds, compensation order, alerts, ticks, resubmission. The store's part (ETags
at Table Storage, the in-flight table, a real race) and one end-to-end run per invariant stay
on Azurite (tests/integration/test_failure_modes.py)."""

from __future__ import annotations

import pytest

from sas.domain.messages import OperatorAlert, ScheduleRequest, StepReply
from sas.domain.model import ProcessState
from sas.domain.wire import idempotency_key
from sas.services.agent import AgentOutcome
from sas.services.scheduler import ReplyOutcome, ScheduleOutcome
from sas.testing import fault, ok, refuse, too_slow
from tests.harness import BUDGET, CLAIMED, World
from tests.unit.test_services import submitted
from tests.workflows import STRICT

pytestmark = [pytest.mark.unit, pytest.mark.fast]

ALL_STEPS = (("inventory", "reserve"), ("payment", "charge"), ("shipping", "ship"))
SLOW = 60.0
"""How long a slow remote call takes: well past a step's budget."""


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def strict() -> str:
    """A workflow that stops in Error for an operator instead of compensating."""
    return STRICT.name


def order(world: World, order_id: str = "o1", workflow: str = "order") -> str:
    world.submit(submitted(order_id).model_copy(update={"workflow": workflow}))
    return order_id


def assert_effects_once(world: World, order_id: str, *pairs: tuple[str, str]) -> None:
    """The order's effects are exactly ``pairs``, each applied once (one idempotency key each:
    a retry under a new key would show as a second effect of its action)."""
    made = [(e.agent, e.action) for e in world.remote.effects.values() if e.order_id == order_id]
    assert sorted(made) == sorted(pairs)


def test_transient_fault_is_retried_inside_the_deadline(world):
    world.remote.script("payment", "charge", fault("HTTP 503"), fault("timeout"), ok())
    oid = order(world)
    world.run()
    state = world.state(oid)
    assert state.process_state is ProcessState.PROCESSED
    assert state.attempt == 3  # no supervisor retry was needed: one attempt per step
    charges = [c for c in world.remote.calls if c.action == "charge"]
    assert len(charges) == 3 and len({c.key for c in charges}) == 1
    assert_effects_once(world, oid, *ALL_STEPS)


def test_deadline_passes_agent_stays_silent_then_supervisor_retries_to_success(world):
    world.remote.script("payment", "charge", too_slow(SLOW))  # applied, but answered too late
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler"), world.deliver("agent-inventory")
    world.deliver("replies")
    assert world.deliver("agent-payment") == [AgentOutcome.LATE]
    assert world.bus.pending("replies") == []  # past complete-by the agent sends nothing
    assert world.state(oid).process_state is ProcessState.PROCESSING
    assert world.tick()["retry"] == 1
    retried = world.state(oid)
    assert (retried.process_state, retried.failure_count, retried.locked_by) == (
        ProcessState.PENDING,
        1,
        None,
    )
    world.run()
    assert world.state(oid).process_state is ProcessState.PENDING  # backing off
    world.clock.advance(2)  # the backoff
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert_effects_once(world, oid, *ALL_STEPS)  # the retried charge replayed, not re-applied
    assert "expired_retry" in world.history(oid)


def test_submission_crash_between_its_claim_and_the_request(world):
    world.bus.fail_next_send_to.add("agent-inventory")
    with pytest.raises(ConnectionError):
        order(world)  # inserted and claimed, then died before sending
    oid = "o1"
    claimed = world.state(oid)
    assert claimed.process_state is ProcessState.PROCESSING and claimed.attempt == 1
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert_effects_once(world, oid, *ALL_STEPS)


def test_scheduler_restart_resumes_in_flight_work_from_the_store(world):
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler"), world.deliver("agent-inventory")
    restarted = world.new_scheduler("scheduler-after-restart")  # old instance is gone
    world.app = restarted  # what consumes the queues from now on
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert "scheduler-after-restart" in {h.actor for h in world.store.get_history(oid)}


def test_late_reply_after_a_newer_attempt_was_claimed_completes_the_step_once(world):
    """The reply rule: attempt 1's ok (every attempt calls with the one key) still completes
    the step the order waits on; attempt 2's reply is then the stale one."""
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")
    (old_request,) = world.bus.take("agent-inventory")  # attempt 1 is slow somewhere
    world.tick(CLAIMED)
    world.clock.advance(2)
    world.deliver("scheduler")  # attempt 2 claimed
    assert world.state(oid).attempt == 2
    late = StepReply(
        order_id=oid,
        step="reserve",
        step_index=0,
        attempt=old_request.attempt,
        outcome="ok",
        result={"from": "attempt 1"},
        incarnation=old_request.incarnation,
    )
    world.clock.advance(1)
    assert world.app.on_reply(late) is ReplyOutcome.ADVANCED
    assert world.store.get_steps(oid)[0].attempt == 1
    assert world.history(oid)[-2:] == ["completed", "claimed"]
    world.run()  # attempt 2's reply: dropped
    assert world.history(oid).count("reply_dropped") == 1
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert world.store.get_steps(oid)[0].result == {"from": "attempt 1"}


def test_non_transient_error_sets_error_and_alerts_once(world, strict):
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    oid = order(world, workflow=strict)
    world.run()
    state = world.state(oid)
    assert state.process_state is ProcessState.ERROR and state.last_error is not None
    assert "card declined" in state.last_error
    for _ in range(3):
        world.tick(60)  # sweeps find it terminal: no second alert
    assert len(world.alerts()) == 1
    alert = world.alerts()[0]
    assert isinstance(alert, OperatorAlert) and alert.order_id == oid
    assert world.store.list_live() == []


def test_threshold_reached_sets_error_and_alerts_once(strict):
    world = World(max_failures=3)
    oid = order(world, workflow=strict)
    world.deliver("orders"), world.deliver("scheduler")
    for _ in range(10):  # the agent crashes every time
        world.drop("agent-inventory")
        world.tick(BUDGET + 1)
        world.clock.advance(60)
        world.deliver("scheduler")
    state = world.state(oid)
    assert state.process_state is ProcessState.ERROR
    assert state.failure_count == 3
    assert state.last_error is not None
    assert "expired 3 times" in state.last_error
    assert len(world.alerts()) == 1
    assert world.history(oid).count("expired_retry") == 2
    assert world.history(oid).count("expired_error") == 1


def test_threshold_reached_on_a_forward_step_compensates_including_that_step(world):
    world.remote.script("payment", "charge", too_slow(SLOW), too_slow(SLOW), too_slow(SLOW))
    oid = order(world)
    world.settle_with_supervision()
    state = world.state(oid)
    assert state.process_state is ProcessState.COMPENSATED
    # charge was applied (slowly) though never confirmed: it is refunded, reserve released
    assert world.remote.applied(oid) == {
        ("inventory", "reserve"): True,
        ("payment", "charge"): True,
    }
    assert world.remote.undo_order == [("payment", "charge"), ("inventory", "reserve")]
    assert world.alerts() == []


def test_compensation_runs_in_reverse_with_a_timed_out_undo_retried(world):
    world.remote.script("shipping", "ship", refuse("HTTP 422 no courier"))
    world.remote.script("payment", "refund", too_slow(SLOW))  # the first refund times out
    oid = order(world)
    world.run()
    stuck = world.state(oid)
    assert (stuck.process_state, stuck.mode, stuck.step_index) == (
        ProcessState.COMPENSATING,
        "undo",
        1,
    )
    world.settle_with_supervision()
    state = world.state(oid)
    assert state.process_state is ProcessState.COMPENSATED
    assert world.remote.undo_order == [("payment", "charge"), ("inventory", "reserve")]
    assert world.remote.applied(oid) == {
        ("inventory", "reserve"): True,
        ("payment", "charge"): True,
    }
    undo_keys = [c.key for c in world.remote.calls if c.action == "refund"]
    key = idempotency_key("o1", state.incarnation, "charge", "undo")
    assert undo_keys == [key, key]  # retried with the same key
    entries = world.store.get_history(oid)
    kinds = [h.kind for h in entries]
    assert kinds.index("refused") < kinds.index("expired_retry") < kinds.index("undone")
    assert [h.mode for h in entries if h.kind == "expired_retry"] == ["undo"]
    assert kinds.count("undone") == 2
    statuses = [m.status for m in world.bus.to("status-q")]
    assert statuses[-1] == "compensated" and "compensating" in statuses


def test_an_undo_that_fails_for_good_ends_in_error_with_one_alert(world):
    world.remote.script("shipping", "ship", refuse("HTTP 422 refused"))
    world.remote.script("payment", "refund", refuse("HTTP 409 refund window closed"))
    oid = order(world)
    world.settle_with_supervision()
    state = world.state(oid)
    assert state.process_state is ProcessState.ERROR and state.last_error is not None
    assert "refund window closed" in state.last_error
    assert len(world.alerts()) == 1


def test_doubled_and_missed_ticks(world):
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")
    world.drop("agent-inventory")
    world.clock.advance(CLAIMED + 1)
    first, second = world.tick(), world.tick()  # a doubled tick at the same instant
    assert first["retry"] == 1 and second["retry"] == 0
    assert world.state(oid).failure_count == 1
    world.tick(3600)  # then a long silence (missed ticks): one catch-up, no pile-up
    assert world.state(oid).failure_count == 2
    world.clock.advance(10)
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED


def test_resubmit_of_an_error_order_reaches_processed(world, strict):
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    oid = order(world, workflow=strict)
    world.run()
    assert world.state(oid).process_state is ProcessState.ERROR
    world.tick(60)  # the sweep unindexes the finished order...
    assert world.store.list_live() == []
    again = world.operator.resubmit(oid, actor="alice")  # ...the customer updated the card
    assert (again.process_state, again.failure_count) == (ProcessState.PENDING, 0)
    assert [m.order_id for m in world.store.list_live()] == [oid]  # ...and it is indexed again
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert ("payment", "charge") in world.remote.applied(oid)
    resubmitted = [h for h in world.store.get_history(oid) if h.kind == "resubmitted"]
    assert resubmitted[0].actor == "alice" and resubmitted[0].detail is not None
    assert "card declined" in resubmitted[0].detail
    assert len(world.alerts()) == 1
    with pytest.raises(Exception, match="not Error"):
        world.operator.resubmit(oid, actor="bob")


def test_a_pending_order_whose_schedule_request_was_lost_is_picked_up(world):
    oid = order(world)
    world.drop("agent-inventory")
    world.tick(CLAIMED + 1)  # expired: Pending for a retry, a schedule request on its way
    assert world.state(oid).process_state is ProcessState.PENDING
    world.clock.advance(3)
    assert len(world.drop("scheduler")) == 1  # lost with the process that took it
    world.tick(61)  # past the pickup deadline
    assert world.state(oid).failure_count == 2
    world.clock.advance(5)
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED


def test_a_schedule_request_during_backoff_waits(world):
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")
    world.drop("agent-inventory")
    world.tick(CLAIMED + 1)
    assert world.app.schedule(ScheduleRequest(order_id=oid)) is ScheduleOutcome.NOT_YET
    assert world.state(oid).process_state is ProcessState.PENDING

"""An operator steers a live order, in memory: cancel (what was done is undone, the order ends
Cancelled), suspend and resume, terminate; against a step's late reply, its expiry, a second
cancel and a resubmit. The same races on Azurite: tests/integration/test_steering_races.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from sas.domain import steering
from sas.domain.errors import IllegalTransition, InvalidMessage
from sas.domain.model import ProcessState
from sas.domain.transitions import claim, initial_state
from sas.services.operator import Operator
from sas.services.scheduler import ReplyOutcome
from sas.testing import refuse
from tests.harness import BUDGET, ReadThenYield, World
from tests.unit.test_failure_modes import order
from tests.workflows import SHOP

pytestmark = [pytest.mark.unit, pytest.mark.fast]

NOW = datetime(2026, 1, 1, tzinfo=UTC)
RESERVE, CHARGE, SHIP = ("inventory", "reserve"), ("payment", "charge"), ("shipping", "ship")


@pytest.fixture
def world() -> World:
    return World()


def charging(world: World, workflow: str = "order") -> str:
    """reserve done, charge claimed and its request waiting for the payment agent."""
    oid = order(world, workflow=workflow)
    world.deliver("orders"), world.deliver("scheduler")
    world.deliver("agent-inventory"), world.deliver("replies")
    assert world.state(oid).process_state is ProcessState.PROCESSING
    assert world.state(oid).step == "charge"
    return oid


def cancel(world: World, oid: str, reason: str = "customer asked") -> ProcessState:
    return world.operator.cancel(oid, actor="dana", reason=reason).process_state


def test_a_cancelled_order_lets_its_running_step_finish_then_undoes_it_and_the_rest(world):
    oid = charging(world)
    assert cancel(world, oid) is ProcessState.PROCESSING  # charge is still running
    world.run()
    state = world.state(oid)
    assert state.process_state is ProcessState.CANCELLED
    assert state.cancelled == "cancelled by dana: customer asked"
    # charge's ok was recorded, then undone with reserve; ship was never called.
    assert world.remote.applied(oid) == {RESERVE: True, CHARGE: True}
    assert "completed" in world.history(oid) and world.history(oid)[-1] == "undone"
    assert [e.action for e in world.operator.audit(10)] == ["cancel"]


def test_a_step_refused_after_the_cancel_undoes_only_what_was_done(world):
    world.remote.script("payment", "charge", refuse("HTTP 402 declined"))
    oid = charging(world)
    cancel(world, oid)
    world.run()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert world.remote.applied(oid) == {RESERVE: True}


def test_an_order_whose_first_step_was_never_claimed_ends_cancelled_at_once():
    pending = initial_state("o1", SHOP, reply_to=None, now=NOW)
    cancelled = steering.cancel(pending, now=NOW, workflow=SHOP, why="by dana: mistake")
    assert cancelled.process_state is ProcessState.CANCELLED and cancelled.finished_at == NOW
    with pytest.raises(IllegalTransition, match="cancelled"):
        claim(replace(cancelled, process_state=ProcessState.PENDING), instance_id="s", now=NOW,
              workflow=SHOP)  # fmt: skip


def test_a_cancel_before_the_first_step_ran_undoes_it_after_it_answers(world):
    oid = order(world)  # reserve claimed, its request not yet taken by the agent
    assert cancel(world, oid) is ProcessState.PROCESSING
    world.run()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert world.remote.applied(oid) == {RESERVE: True}


def test_a_cancel_during_a_retry_backoff_undoes_the_step_that_may_have_been_applied(world):
    oid = charging(world)
    world.deliver("agent-payment")  # charge applied; its reply lost
    world.drop("replies")
    world.tick(BUDGET + 3)  # expired: Pending for a retry
    assert world.state(oid).process_state is ProcessState.PENDING
    cancel(world, oid)
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert world.remote.applied(oid) == {RESERVE: True, CHARGE: True}


def test_an_expiry_after_the_cancel_undoes_from_the_expired_step_uncounted(world):
    oid = charging(world)
    world.deliver("agent-payment")  # applied; the reply is lost
    world.drop("replies")
    cancel(world, oid)
    world.tick(BUDGET + 3)
    assert world.state(oid).mode == "undo" and world.state(oid).failure_count == 0
    assert "expired_compensate" in world.history(oid)
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert world.remote.applied(oid) == {RESERVE: True, CHARGE: True}


def test_a_late_ok_after_the_cancels_undo_began_is_dropped_and_its_effect_undone():
    world = World()
    oid = charging(world)
    world.deliver("agent-payment")  # applied, the reply stuck in a backlog
    cancel(world, oid)
    world.clock.advance(BUDGET + 3 + world.policy.queue_wait_limit.total_seconds())
    assert world.tick(0)["compensate"] == 1
    assert world.deliver("replies") == [ReplyOutcome.STALE]
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert world.remote.applied(oid) == {RESERVE: True, CHARGE: True}


def test_a_second_cancel_and_a_cancel_of_a_finished_order_are_refused(world):
    oid = charging(world)
    cancel(world, oid)
    with pytest.raises(IllegalTransition, match="being cancelled already"):
        cancel(world, oid)
    world.run()
    with pytest.raises(IllegalTransition, match="Cancelled"):
        cancel(world, oid)
    assert [e.action for e in world.operator.audit(10)] == ["cancel"]


def test_a_cancel_without_a_reason_is_refused_and_changes_nothing(world):
    oid = charging(world)
    before = world.state(oid)
    with pytest.raises(InvalidMessage, match="needs a reason"):
        cancel(world, oid, reason="  ")
    assert world.state(oid) == before and world.operator.audit(10) == []


def test_an_order_being_compensated_cannot_be_cancelled(world):
    world.remote.script("payment", "charge", refuse("HTTP 402 declined"))
    oid = charging(world)
    world.deliver("agent-payment"), world.deliver("replies")
    assert world.state(oid).mode == "undo"
    with pytest.raises(IllegalTransition, match="being undone already"):
        cancel(world, oid)


def test_an_error_order_stopped_part_way_is_cancelled_and_undone():
    world = World()
    world.remote.script("payment", "charge", refuse("HTTP 402 declined"))
    oid = order(world, workflow="strict")
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.ERROR
    assert cancel(world, oid) is ProcessState.PENDING
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert world.remote.applied(oid) == {RESERVE: True}


def test_cancel_and_resubmit_of_an_error_order_at_once_end_cancelled_with_effects_undone():
    """The resubmit writes between the cancel's read and its write: the cancel reads again
    and undoes the order the resubmit revived."""
    world = World()
    world.remote.script("payment", "charge", refuse("HTTP 402 declined"), refuse("HTTP 402"))
    oid = order(world, workflow="strict")
    world.settle_with_supervision()
    racing = ReadThenYield(world.store, lambda: world.operator.resubmit(oid, actor="eve"))
    mine = Operator(world.app.named("operator", store=racing).ctx)
    assert mine.cancel(oid, actor="dana", reason="refund").process_state is ProcessState.PENDING
    assert racing.meanwhile is not None and world.state(oid).mode == "undo"
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert world.remote.applied(oid) == {RESERVE: True}
    assert [e.action for e in world.operator.audit(10)] == ["cancel", "resubmit"]


def test_a_suspended_order_dispatches_nothing_and_expires_never_until_resumed(world):
    oid = charging(world)
    world.operator.suspend(oid, actor="dana")
    world.run()  # charge, already running, finishes and is recorded
    state = world.state(oid)
    assert (state.process_state, state.step, state.suspended) == (
        ProcessState.PENDING,
        "ship",
        True,
    )
    for _ in range(5):  # Supervisor periods far past any deadline
        world.tick(BUDGET * 4)
        world.run()
    assert SHIP not in world.remote.applied(oid)
    assert world.state(oid).failure_count == 0
    assert not any(kind.startswith("expired") for kind in world.history(oid))
    world.operator.resume(oid, actor="dana")
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert [e.action for e in world.operator.audit(10)] == ["resume", "suspend"]


def test_a_suspended_steps_expiry_holds_it_uncounted_and_the_resume_retries_it(world):
    oid = charging(world)
    world.drop("agent-payment")  # the agent died
    world.operator.suspend(oid, actor="dana")
    world.tick(BUDGET + 3)
    state = world.state(oid)
    assert state.process_state is ProcessState.PENDING and state.failure_count == 0
    assert "expired_held" in world.history(oid)
    world.run()
    assert CHARGE not in world.remote.applied(oid)
    world.operator.resume(oid, actor="dana")
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED


def test_a_suspended_order_can_be_cancelled_and_a_resume_needs_a_suspension(world):
    oid = charging(world)
    with pytest.raises(IllegalTransition, match="not suspended"):
        world.operator.resume(oid, actor="dana")
    world.operator.suspend(oid, actor="dana")
    with pytest.raises(IllegalTransition, match="suspended already"):
        world.operator.suspend(oid, actor="dana")
    cancel(world, oid)
    assert not world.state(oid).suspended
    world.run()
    assert world.state(oid).process_state is ProcessState.CANCELLED


def test_a_terminated_order_ends_now_undoes_nothing_and_drops_its_late_reply(world):
    oid = charging(world)
    assert (
        world.operator.terminate(oid, actor="dana", reason="settled with the bank").process_state
        is ProcessState.TERMINATED
    )
    world.run()
    assert world.state(oid).process_state is ProcessState.TERMINATED
    assert "reply_dropped" in world.history(oid)
    assert world.remote.applied(oid) == {RESERVE: False, CHARGE: False}
    with pytest.raises(IllegalTransition, match="Terminated"):
        world.operator.terminate(oid, actor="dana", reason="again")

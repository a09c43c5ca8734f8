"""The Supervisor's in-flight index on Azurite: only due markers are read, a healthy order's
marker is re-armed to its next deadline; and the reply rule: a step that expired while its
reply (sent in time) waited in a backlog is completed by that reply when it arrives."""

from __future__ import annotations

from typing import Any

import pytest

from sas.domain.model import ProcessState
from sas.services.scheduler import ReplyOutcome
from tests.harness import BUDGET, World, permanent
from tests.integration.test_failure_modes import assert_effects_once, order

pytestmark = pytest.mark.integration

ALL_STEPS = (("inventory", "reserve"), ("payment", "charge"), ("shipping", "ship"))


class CountingStore:
    """Counts the state reads a sweep makes (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.state_reads = 0

    def get_state(self, order_id: str) -> Any:
        self.state_reads += 1
        return self.inner.get_state(order_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_sweep_reads_no_order_whose_marker_is_not_due(world):
    ids = [order(world, f"o{n}") for n in range(5)]
    counting = CountingStore(world.store)
    supervisor = world.new_supervisor("supervisor-2", store=counting)
    world.clock.advance(BUDGET - 1)
    assert supervisor.sweep().total() == 0
    assert counting.state_reads == 0  # one query, no read per in-flight order
    assert {m.order_id for m in world.store.list_live()} == set(ids)


def test_a_healthy_due_order_is_re_armed_to_its_next_deadline(world):
    oid = order(world)
    world.deliver("agent-inventory")
    world.clock.advance(5)
    world.deliver("replies")  # the second step started 5 s in
    state = world.state(oid)
    world.clock.advance(BUDGET - 5)  # the first step's deadline (the marker's due) passed...
    (marker,) = world.store.list_live()
    assert marker.due_at <= world.clock.now()
    assert world.tick(1)["healthy"] == 1  # ...but the order is healthy: re-armed
    (rearmed,) = world.store.list_live()
    assert rearmed.due_at == state.complete_by
    assert world.tick(0).total() == 0  # not due again before that


def test_recovery_still_comes_by_the_deadline_of_a_later_shorter_step(world):
    """The marker is due no later than any deadline a transition can set after it was
    written: an agent that dies on a later step is recovered within its own budget."""
    oid = order(world)
    world.deliver("agent-inventory"), world.deliver("replies")
    world.drop("agent-payment")  # the second step's agent died
    world.tick(BUDGET + 2.5)  # the second step's deadline and the skew allowance
    assert "expired_retry" in world.history(oid)


def first_reply_waits_past_its_expiry(world) -> str:
    """The first step's agent replies in time; the reply waits in a backlog while the step
    expires (the Supervisor does not look at queues)."""
    oid = order(world)
    world.deliver("agent-inventory")
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["retry"] == 1
    return oid


def test_a_reply_sent_in_time_that_arrives_after_its_step_was_claimed_again_applies(world):
    oid = first_reply_waits_past_its_expiry(world)
    (late,) = world.bus.take("replies")
    world.clock.advance(3)
    world.deliver("scheduler")  # the retry: attempt 2 claimed and sent
    assert (world.state(oid).attempt, world.state(oid).step_index) == (2, 0)
    assert world.scheduler.on_reply(late) is ReplyOutcome.ADVANCED  # attempt 1's ok applies
    assert world.state(oid).step_index == 1
    world.run()  # attempt 2's call is answered from the key; its reply is now the stale one
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert world.history(oid).count("reply_dropped") == 1
    assert_effects_once(world, oid, *ALL_STEPS)
    reserve_calls = [c for c in world.remote.calls if c[1] == "reserve"]
    assert len(reserve_calls) == 2  # what the rule costs: one remote call more


def test_an_ok_that_arrives_while_its_step_waits_for_the_retry_completes_it(world):
    oid = first_reply_waits_past_its_expiry(world)
    world.deliver("replies")  # before the retry's backoff ended: applied, nothing runs again
    assert world.state(oid).step_index == 1
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert len([c for c in world.remote.calls if c[1] == "reserve"]) == 1
    assert_effects_once(world, oid, *ALL_STEPS)


def test_a_refusal_that_arrives_after_its_attempt_expired_is_dropped(world):
    """A refusal applied nothing and speaks only for its attempt: the retry decides."""
    world.remote.script[("inventory", "reserve")] = [permanent()]
    oid = first_reply_waits_past_its_expiry(world)
    (refusal,) = world.bus.take("replies")
    world.clock.advance(3)
    world.deliver("scheduler")
    assert world.scheduler.on_reply(refusal) is ReplyOutcome.STALE
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert_effects_once(world, oid, *ALL_STEPS)


def test_an_ok_that_arrives_after_compensation_began_is_dropped_and_the_undo_undoes(table):
    """Past the threshold the step is compensated including itself: its late ok no longer
    applies, and its undo takes the effect back."""
    world = World(table, max_failures=1)
    oid = order(world)
    world.deliver("agent-inventory")  # reserve applied, its reply stuck in a backlog
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["compensate"] == 1
    assert world.deliver("replies") == [ReplyOutcome.STALE]
    world.run()
    assert world.state(oid).process_state is ProcessState.COMPENSATED
    assert world.remote.applied(oid) == {("inventory", "reserve"): True}


def test_a_step_whose_agent_died_expires_at_its_deadline_and_the_allowance(world):
    oid = order(world)
    world.drop("agent-inventory")  # the agent died: no reply anywhere
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["retry"] == 1
    assert world.state(oid).process_state is ProcessState.PENDING


def test_a_parallel_sweep_examines_every_due_order_once(world):
    ids = [order(world, f"p{n:02d}") for n in range(12)]
    world.drop("agent-inventory")  # every agent died
    parallel = world.new_supervisor("supervisor-p")
    world.clock.advance(BUDGET + 1)
    report = parallel.sweep(parallelism=4)
    assert report["retry"] == len(ids)
    assert all(world.state(oid).failure_count == 1 for oid in ids)
    assert parallel.sweep().total() == 0  # every marker re-armed to the retry's deadline


def test_a_finished_orders_marker_goes_with_the_first_sweep_it_is_due_for(world):
    """Nothing touches the marker when the order finishes: the sweep that finds it due reads
    the finished order once and drops the marker (with the sweep's other writes)."""
    oid = order(world)
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    (marker,) = world.store.list_live()
    counting = CountingStore(world.store)
    supervisor = world.new_supervisor("supervisor-2", store=counting)
    assert supervisor.sweep().total() == 0  # not due yet: nothing read
    world.clock.advance((marker.due_at - world.clock.now()).total_seconds())
    assert supervisor.sweep() == {"unindexed": 1} and counting.state_reads == 1
    assert world.store.list_live() == []

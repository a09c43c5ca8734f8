"""When a step expires and what its late reply then does, in memory (the domain decides both):
a step whose agent died expires at its deadline and the allowance, a later shorter step is
recovered within its own budget; a step whose reply (sent in time) waits in a backlog does not
expire while the replies queue holds messages, up to the queue-wait limit; and the reply rule:
a step that expired past that limit is completed by its reply when it arrives; a refusal, or an
ok once compensation began, is dropped. The in-flight index itself (which markers a sweep reads,
re-arms and drops) is checked on Azurite (tests/integration/test_supervisor_index.py)."""

from __future__ import annotations

import pytest

from sas.domain.model import ProcessState
from sas.services.scheduler import ReplyOutcome
from sas.testing import refuse
from tests.harness import BUDGET, World
from tests.unit.test_failure_modes import ALL_STEPS, assert_effects_once, order

pytestmark = [pytest.mark.unit, pytest.mark.fast]


@pytest.fixture
def world() -> World:
    return World()


def test_recovery_still_comes_by_the_deadline_of_a_later_shorter_step(world):
    """The marker is due no later than any deadline a transition can set after it was
    written: an agent that dies on a later step is recovered within its own budget."""
    oid = order(world)
    world.deliver("agent-inventory"), world.deliver("replies")
    world.drop("agent-payment")  # the second step's agent died
    world.tick(BUDGET + 2.5)  # the second step's deadline and the skew allowance
    assert "expired_retry" in world.history(oid)


def first_reply_waits_past_its_expiry(world) -> str:
    """The first step's agent replies in time; the reply waits in a backlog. The step does not
    expire while the replies queue holds messages; past the queue-wait limit (a reply lost
    behind a queue that never empties, for all the Supervisor can tell) it does."""
    oid = order(world)
    world.deliver("agent-inventory")
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["reply_queued"] == 1
    assert world.state(oid).attempt == 1 and world.state(oid).failure_count == 0
    world.clock.advance(world.policy.queue_wait_limit.total_seconds())
    assert world.tick(0)["retry"] == 1
    return oid


def test_a_reply_sent_in_time_that_arrives_after_its_step_was_claimed_again_applies(world):
    oid = first_reply_waits_past_its_expiry(world)
    (late,) = world.bus.take("replies")
    world.clock.advance(3)
    world.deliver("scheduler")  # the retry: attempt 2 claimed and sent
    assert (world.state(oid).attempt, world.state(oid).step_index) == (2, 0)
    assert world.app.on_reply(late) is ReplyOutcome.ADVANCED  # attempt 1's ok applies
    assert world.state(oid).step_index == 1
    world.run()  # attempt 2's call is answered from the key; its reply is now the stale one
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert world.history(oid).count("reply_dropped") == 1
    assert_effects_once(world, oid, *ALL_STEPS)
    reserve_calls = [c for c in world.remote.calls if c.action == "reserve"]
    assert len(reserve_calls) == 2  # what the rule costs: one remote call more


def test_an_ok_that_arrives_while_its_step_waits_for_the_retry_completes_it(world):
    oid = first_reply_waits_past_its_expiry(world)
    world.deliver("replies")  # before the retry's backoff ended: applied, nothing runs again
    assert world.state(oid).step_index == 1
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert len([c for c in world.remote.calls if c.action == "reserve"]) == 1
    assert_effects_once(world, oid, *ALL_STEPS)


def test_a_refusal_that_arrives_after_its_attempt_expired_is_dropped(world):
    """A refusal applied nothing and speaks only for its attempt: the retry decides."""
    world.remote.script("inventory", "reserve", refuse("HTTP 422 refused"))
    oid = first_reply_waits_past_its_expiry(world)
    (refusal,) = world.bus.take("replies")
    world.clock.advance(3)
    world.deliver("scheduler")
    assert world.app.on_reply(refusal) is ReplyOutcome.STALE
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert_effects_once(world, oid, *ALL_STEPS)


def test_an_ok_that_arrives_after_compensation_began_is_dropped_and_the_undo_undoes():
    """Past the threshold the step is compensated including itself: its late ok no longer
    applies, and its undo takes the effect back."""
    world = World(max_failures=1)
    oid = order(world)
    world.deliver("agent-inventory")  # reserve applied, its reply stuck in a backlog
    world.clock.advance(BUDGET + 3 + world.policy.queue_wait_limit.total_seconds())
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

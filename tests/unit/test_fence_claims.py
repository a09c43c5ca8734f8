"""The fence knows each claim: an ``ok`` whose attempt was made before the step it names was
first claimed (in that direction) was another step's, so it is dropped and recorded, never
applied (the reply rule's own cases: tests/unit/test_transitions.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sas.domain.messages import OrderSubmitted, StepReply
from sas.domain.model import ProcessState
from sas.domain.transitions import Fence, fence
from sas.domain.workflow import PythonAgent, Registry, StepDefinition, Workflow
from sas.services.scheduler import ReplyOutcome
from sas.testing import Harness, refuse
from tests.harness import World
from tests.unit.test_services import submitted
from tests.workflows import SHOP

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def forged(world: World, step: str, attempt: int, mode: str = "do") -> StepReply:
    state = world.state("o1")
    index = [s.name for s in SHOP.steps].index(step)
    return StepReply(
        order_id="o1",
        step=step,
        step_index=index,
        attempt=attempt,
        mode=mode,  # type: ignore[arg-type]
        outcome="ok",
        incarnation=state.incarnation,
    )


def assert_dropped(world: World, reply: StepReply) -> None:
    before = world.store.get_state("o1")
    steps = world.store.get_steps("o1")
    assert world.app.on_reply(reply) is ReplyOutcome.STALE
    assert world.store.get_state("o1") == before  # the same ETag: nothing written
    assert world.store.get_steps("o1") == steps
    dropped = [
        h.detail
        for h in world.store.get_history("o1")
        if (h.kind, h.step, h.attempt, h.mode)
        == ("reply_dropped", reply.step, reply.attempt, reply.mode)
    ]
    assert len(dropped) == 1 and Fence.OTHER_STEP.value in (dropped[0] or "")


def test_an_ok_for_ship_with_reserves_attempt_ships_nothing() -> None:
    world = World()
    world.submit(submitted())
    for queue in ("agent-inventory", "replies", "agent-payment", "replies"):
        world.deliver(queue)
    state = world.state("o1")
    assert (state.step, state.attempt, state.first_attempt) == ("ship", 3, 3)
    for attempt in (1, 2):
        assert_dropped(world, forged(world, "ship", attempt))
    world.run()  # ship's own reply still applies
    assert world.state("o1").process_state is ProcessState.PROCESSED


def test_an_undo_waiting_at_attempt_four_takes_no_ok_of_an_earlier_attempt() -> None:
    world = World()
    world.remote.script("shipping", "ship", refuse("no courier"))
    world.submit(submitted())
    for queue in ("agent-inventory", "replies", "agent-payment", "replies"):
        world.deliver(queue)
    world.deliver("agent-shipping")
    world.deliver("replies")  # refused: compensation queued
    world.deliver("scheduler")  # the undo of charge claimed
    state = world.state("o1")
    assert (state.mode, state.step, state.attempt, state.first_attempt) == ("undo", "charge", 4, 4)
    for attempt in (1, 2, 3):
        assert_dropped(world, forged(world, "charge", attempt, "undo"))
    world.run()
    assert world.state("o1").process_state is ProcessState.COMPENSATED
    assert world.remote.applied("o1") == {
        ("inventory", "reserve"): True,
        ("payment", "charge"): True,
    }


def test_an_undo_not_yet_claimed_takes_no_ok_at_all() -> None:
    """Compensation queued (Pending, undo): no attempt of the undo exists yet."""
    world = World()
    world.remote.script("shipping", "ship", refuse("no courier"))
    world.submit(submitted())
    for queue in ("agent-inventory", "replies", "agent-payment", "replies", "agent-shipping"):
        world.deliver(queue)
    world.deliver("replies")
    state = world.state("o1")
    assert (state.process_state, state.mode, state.attempt) == (ProcessState.PENDING, "undo", 3)
    for attempt in (1, 2, 3):
        assert_dropped(world, forged(world, "charge", attempt, "undo"))


def noop(context: object, data: object) -> dict[str, str]:
    return {}


def test_a_python_agents_step_takes_no_ok_of_an_earlier_steps_attempt() -> None:
    steps = tuple(
        StepDefinition(name, "desk", "work", timedelta(seconds=15)) for name in ("one", "two")
    )
    registry = Registry((Workflow("desk", steps),), (PythonAgent("desk", {"work": noop}),))
    harness = Harness(registry)
    order_id = "d1"
    harness.app.submit(OrderSubmitted(order_id=order_id, workflow="desk", details={}))
    harness.app.on_reply(
        StepReply(
            order_id=order_id,
            step="one",
            step_index=0,
            attempt=1,
            outcome="ok",
            incarnation=harness.state(order_id).incarnation,
        )
    )
    state = harness.state(order_id)
    assert state.is_running
    assert (state.step, state.attempt, state.first_attempt) == ("two", 2, 2)
    reply = StepReply(
        order_id=order_id,
        step="two",
        step_index=1,
        attempt=1,
        outcome="ok",
        incarnation=state.incarnation,
    )
    assert harness.app.on_reply(reply) is ReplyOutcome.STALE
    assert harness.state(order_id) == state
    assert "reply_dropped:two" in harness.history(order_id)


def test_an_order_from_before_first_attempts_were_kept_is_fenced_as_before() -> None:
    """A state row without ``FirstAttempt`` reads 0: every earlier attempt of the step and
    direction it waits on counts, as it did."""
    world = World()
    world.submit(submitted())
    from dataclasses import replace

    old = replace(world.state("o1"), first_attempt=0)
    verdict = fence(
        old, SHOP, step_index=0, step="reserve", attempt=1, mode="do",
        incarnation=old.incarnation,
    )  # fmt: skip
    assert verdict is Fence.CURRENT


def test_a_reply_to_an_earlier_incarnation_never_moves_the_order() -> None:
    world = World()
    world.submit(submitted())
    reply = forged(world, "reserve", 1).model_copy(update={"incarnation": "0" * 12})
    before = world.store.get_state("o1")
    assert world.app.on_reply(reply) is ReplyOutcome.STALE
    assert world.store.get_state("o1") == before
    details = [h.detail or "" for h in world.store.get_history("o1") if h.kind == "reply_dropped"]
    assert len(details) == 1 and "other_incarnation" in details[0]

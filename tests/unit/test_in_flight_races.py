"""Bounded work in flight against races, in memory: a let-in whose marker cannot be written
sends nothing and lets no one in past the limit; an order let in that finishes while its sweep
is still sending keeps its finished flag; a submission delivered again after its order finished
flags it again. Each finished order gives the retry budget one share, once (the rules:
tests/unit/test_in_flight_limit.py)."""

from __future__ import annotations

from typing import Any

import pytest

from sas.domain.messages import OrderSubmitted
from sas.domain.model import ProcessState
from sas.services.submission import SubmissionOutcome
from tests.unit.test_in_flight_limit import LIMIT, limited_world, waiting
from tests.unit.test_services import submitted
from tests.workflows import SHOP

pytestmark = [pytest.mark.unit, pytest.mark.fast]


class MarkersFailOnce:
    """The store, whose first marker creation of a let-in fails (a timed-out transaction)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failed = False

    def create_live_all(self, markers: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise ConnectionError("the store timed out")
        return self.inner.create_live_all(markers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def live_orders(world: Any) -> list[str]:
    return sorted(oid for oid, (state, _) in world.store.states.items() if not state.is_terminal)


def test_a_let_in_whose_markers_fail_sends_nothing_and_nothing_goes_past_the_limit():
    world = limited_world()
    for n in range(LIMIT):
        world.submit(submitted(f"o{n}"))
    world.clock.advance(1)
    low = submitted("low").model_copy(update={"priority": "low"})
    assert world.app.submit(low) is SubmissionOutcome.WAITING
    world.run()  # o0, o1 finish: both places free
    flaky = MarkersFailOnce(world.store)
    world.supervisor = world.new_supervisor("supervisor-2", store=flaky)
    world.tick(1)
    assert flaky.failed and waiting(world) == ["low"] and world.bus.pending("orders") == []
    assert world.app.submit(submitted("n1")) is SubmissionOutcome.ACCEPTED  # low's row holds one
    assert world.app.submit(submitted("n2")) is SubmissionOutcome.WAITING
    for _ in range(6):
        world.tick(1)
        world.deliver("orders")
        assert len(live_orders(world)) <= LIMIT, live_orders(world)
        world.run()
    world.settle_with_supervision(ticks=5)
    assert waiting(world) == [] and live_orders(world) == []


def _race():
    world = limited_world()
    for n in range(2 * LIMIT):
        world.submit(submitted(f"o{n}"))
    world.run()  # o0, o1 finish: o2, o3 wait
    assert waiting(world) == ["o2", "o3"]
    budget = world.supervisor.ctx.retry_budget
    send = world.bus.send
    state = {"busy": False}

    def another_host_is_quick(queue: str, message: Any, **kwargs: Any) -> None:
        # o3's send is slow: meanwhile another host takes o2's let-in and runs it to its end
        if (
            isinstance(message, OrderSubmitted)
            and message.order_id == "o3"
            and message.room_turn is not None
            and not state["busy"]
        ):
            state["busy"] = True
            world.run()
            assert world.state("o2").process_state is ProcessState.PROCESSED
            state["busy"] = False
        send(queue, message, **kwargs)

    world.bus.send = another_host_is_quick  # type: ignore[method-assign]
    world.clock.advance(1)
    # first: drop o0, o1's flags (their shares credited) before the let-in
    now = world.clock.now()
    assert world.supervisor.sweep()["let_in"] == 2
    world.bus.send = send  # type: ignore[method-assign]
    while budget.take(now, expired_at=now):  # spent: what o2 gives back shows
        pass
    world.run()  # o3 finishes too
    assert world.state("o3").process_state is ProcessState.PROCESSED
    return world, budget, now


def test_a_let_in_that_finishes_while_the_sweep_still_sends_holds_no_place():
    world, _, _ = _race()
    # Nothing is in flight: no place may be held
    assert world.store.count_live(SHOP.name, 10) == 0, [
        (m.order_id, m.finished) for m in world.store.list_live()
    ]


def test_a_let_in_that_finishes_while_the_sweep_still_sends_gives_the_budget_its_share():
    world, budget, now = _race()
    world.settle_with_supervision(ticks=10, step_seconds=30)  # every marker due and dropped
    assert world.store.list_live() == []
    # o2 and o3 finished well: one share each
    assert budget.tokens(now) == pytest.approx(2 * budget.policy.per_finished)


@pytest.mark.parametrize("let_in", [False, True])
def test_a_redelivered_submission_of_a_finished_order_keeps_its_budget_share(let_in):
    world = limited_world()
    budget = world.supervisor.ctx.retry_budget
    message = submitted("o1")
    if let_in:
        message = message.model_copy(update={"room_turn": world.clock.now()})
    assert world.app.submit(message) is SubmissionOutcome.ACCEPTED
    world.run()
    assert world.state("o1").process_state is ProcessState.PROCESSED
    assert [m.finished for m in world.store.list_live()] == [True]
    now = world.clock.now()
    while budget.take(now, expired_at=now):  # spent: what o1 gives back shows
        pass
    world.clock.advance(1)
    assert world.app.submit(message) is SubmissionOutcome.DUPLICATE  # at-least-once delivery
    world.settle_with_supervision(ticks=5)
    assert world.store.list_live() == []
    assert budget.tokens(now) == pytest.approx(budget.policy.per_finished)

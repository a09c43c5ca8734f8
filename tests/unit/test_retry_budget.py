"""The Supervisor's retry budget, in memory: forward retries an expiry asks for take a token;
orders that finish well and a slow trickle give them back; a retry held back waits for a later
sweep with nothing written and no failure counted, for a bounded time; compensation, an undo's
retry included, is never held back. The same cap against the Table store's ETags and markers:
tests/integration/test_queue_wait_on_azurite.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from sas.domain.model import ProcessState
from sas.domain.recovery import RetryPolicy
from sas.services.retry_budget import RetryBudget, RetryBudgetPolicy
from sas.testing import InMemoryBudgets, refuse
from tests.harness import BUDGET, ReadThenYield, World
from tests.unit.test_failure_modes import ALL_STEPS, assert_effects_once, order

pytestmark = [pytest.mark.unit, pytest.mark.fast]

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def test_the_bucket_spends_refills_and_trickles_up_to_its_capacity():
    budget = RetryBudget(RetryBudgetPolicy(capacity=3, per_finished=0.5, trickle=HOUR))
    assert [budget.take(T0, expired_at=T0) for _ in range(4)] == [True, True, True, False]
    assert budget.saturated(T0) and budget.held_back == 1
    budget.finished()  # half a token: not yet a retry
    assert not budget.take(T0, expired_at=T0)
    budget.finished()
    assert budget.take(T0, expired_at=T0) and not budget.take(T0, expired_at=T0)
    budget.finished(100)  # never more than the capacity
    assert budget.tokens(T0) == 3
    assert not budget.saturated(T0 + budget.policy.saturated_for)


def test_the_trickle_gives_one_token_each_period_even_when_nothing_finishes():
    budget = RetryBudget(
        RetryBudgetPolicy(capacity=2, per_finished=0, trickle=timedelta(seconds=5))
    )
    assert (
        budget.take(T0, expired_at=T0)
        and budget.take(T0, expired_at=T0)
        and not budget.take(T0, expired_at=T0)
    )
    assert not budget.take(T0 + timedelta(seconds=4.9), expired_at=T0)
    assert budget.take(T0 + timedelta(seconds=5), expired_at=T0) and not budget.take(
        T0 + timedelta(seconds=9), expired_at=T0
    )
    assert budget.tokens(T0 + timedelta(minutes=10)) == 2  # capped, however long the lull
    assert budget.tokens(T0 - HOUR) == 2  # a clock set back takes nothing away, adds nothing


@pytest.mark.parametrize(
    "bad", [{"capacity": 0.5}, {"per_finished": -1}, {"trickle": timedelta(0)}]
)
def test_a_budget_that_could_never_retry_is_refused(bad):
    with pytest.raises(ValueError, match="retry budget"):
        RetryBudgetPolicy(**bad)


def world_with_budget(**policy) -> World:
    world = World()
    budget = RetryBudget(RetryBudgetPolicy(**{"trickle": HOUR, **policy}))
    world.supervisor = world.supervisor.named("supervisor-1", retry_budget=budget)
    return world


def three_orders_whose_first_agent_died(world: World) -> list[str]:
    ids = [order(world, f"o{n}") for n in range(3)]
    world.drop("agent-inventory")
    world.clock.advance(BUDGET + 3)  # past the deadline and the allowance
    return ids


def test_retries_beyond_the_budget_wait_unwritten_and_uncounted():
    world = world_with_budget(capacity=1, per_finished=1.0)
    ids = three_orders_whose_first_agent_died(world)
    report = world.tick(0)
    assert (report["retry"], report["retry_held_back"]) == (1, 2)
    retried = [oid for oid in ids if world.state(oid).failure_count == 1]
    held = [oid for oid in ids if oid not in retried]
    for oid in held:  # nothing written: not expired, not counted, no request sent
        state = world.state(oid)
        assert (state.attempt, state.failure_count, state.process_state) == (
            1,
            0,
            ProcessState.PROCESSING,
        )
        assert not any(kind.startswith("expired") for kind in world.history(oid))
    assert world.supervisor.ctx.retry_budget.saturated(world.clock.now())

    # The retried order finishes; its unindexing gives a token back, and the next sweep
    # retries one of the two that waited.
    world.clock.advance(3)  # its backoff
    world.run()
    assert world.state(retried[0]).process_state is ProcessState.PROCESSED
    report = world.tick(BUDGET + 3)  # the finished order's marker comes due, then unindexed
    assert report["unindexed"] == 1 and report["retry"] == 1 and report["retry_held_back"] == 1

    world.settle_with_supervision(ticks=30)
    for oid in ids:  # every order finished, once each, whatever waited
        assert world.state(oid).process_state is ProcessState.PROCESSED
        assert world.history(oid).count("expired_retry") == 1  # counted once, when let through
        assert_effects_once(world, oid, *ALL_STEPS)


def test_the_trickle_alone_lets_every_held_retry_through_in_time():
    world = world_with_budget(capacity=1, per_finished=0, trickle=timedelta(seconds=30))
    ids = three_orders_whose_first_agent_died(world)
    world.settle_with_supervision(ticks=40, step_seconds=20)
    assert {world.state(oid).process_state for oid in ids} == {ProcessState.PROCESSED}
    assert world.supervisor.ctx.retry_budget.held_back >= 2


def test_compensation_is_never_held_back():
    """Past max_failures an expiry undoes: that is no retry, whatever the budget says."""
    world = World(max_failures=1)
    budget = RetryBudget(RetryBudgetPolicy(capacity=1, trickle=HOUR))
    budget.take(T0, expired_at=T0)  # empty
    world.supervisor = world.supervisor.named("supervisor-1", retry_budget=budget)
    oid = order(world)
    world.drop("agent-inventory")
    report = world.tick(BUDGET + 3)
    assert report["compensate"] + report["compensated"] == 1 and not report["retry_held_back"]
    world.run()
    assert world.state(oid).process_state is ProcessState.COMPENSATED


def test_the_supervisor_publishes_what_it_held_back_while_it_does_and_once_after():
    world = world_with_budget(capacity=2, per_finished=1.0)
    budgets = InMemoryBudgets()
    world.supervisor.sweep(budgets=budgets)
    assert budgets.published == []  # nothing held back, nothing written
    three_orders_whose_first_agent_died(world)
    world.supervisor.sweep(budgets=budgets)
    [first] = budgets.published
    assert (first.instance_id, first.held_back) == ("supervisor-1", 1)
    world.clock.advance(5)
    world.supervisor.sweep(budgets=budgets)
    assert budgets.published[-1].held_back == 2  # held again, within the minute
    world.supervisor.ctx.retry_budget.finished()  # a token back: the last one goes
    world.clock.advance(5)
    assert world.supervisor.sweep(budgets=budgets)["retry"] == 1
    assert budgets.published[-1].held_back == 2  # the minute still holds the two
    world.clock.advance(60)
    world.supervisor.sweep(budgets=budgets)
    assert budgets.published[-1].held_back == 0  # none in the last minute: said once
    count = len(budgets.published)
    world.clock.advance(5)
    world.supervisor.sweep(budgets=budgets)
    assert len(budgets.published) == count  # calm: no more writes


def test_a_retry_held_as_long_as_max_hold_goes_whatever_the_bucket_holds():
    budget = RetryBudget(RetryBudgetPolicy(capacity=1, per_finished=0, trickle=HOUR))
    assert budget.take(T0, expired_at=T0)
    hold = budget.policy.max_hold
    assert not budget.take(T0 + hold - timedelta(seconds=1), expired_at=T0)
    assert budget.take(T0 + hold, expired_at=T0)  # its turn: the bucket is still empty
    assert budget.tokens(T0 + hold) == 0


def test_no_order_waits_past_max_hold_under_a_lasting_overload():
    """The bucket never refills (no trickle to speak of, nothing finishes): every held order is
    still retried once it has waited max_hold past its deadline, and finishes."""
    world = world_with_budget(capacity=1, per_finished=0)
    ids = three_orders_whose_first_agent_died(world)
    world.settle_with_supervision(ticks=40, step_seconds=20)
    assert {world.state(oid).process_state for oid in ids} == {ProcessState.PROCESSED}


def test_an_undo_retry_is_never_held_back():
    """Compensation includes an undo's retry: an empty bucket does not stall it."""
    world = World(max_failures=2)
    budget = RetryBudget(RetryBudgetPolicy(capacity=1, trickle=HOUR))
    budget.take(T0, expired_at=T0)  # empty, for good
    world.supervisor = world.supervisor.named("supervisor-1", retry_budget=budget)
    world.remote.script("payment", "charge", refuse("card declined"))
    oid = order(world)
    for queue in ("agent-inventory", "replies", "agent-payment", "replies", "scheduler"):
        world.deliver(queue)  # reserve done, charge refused: the undo of reserve claimed
    assert world.state(oid).mode == "undo"
    world.drop("agent-inventory")  # the undo's agent died
    report = world.tick(BUDGET + 3)
    assert (report["retry"], report["retry_held_back"]) == (1, 0)
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.COMPENSATED
    assert budget.held_back == 0


def test_a_retry_lost_to_another_supervisor_gives_its_token_back():
    world = World()
    oid = order(world)
    world.drop("agent-inventory")
    world.clock.advance(BUDGET + 3)
    other = world.app.named("supervisor-2", retry_budget=RetryBudget())
    racing = ReadThenYield(world.store, other.sweep)  # it recovers the order first
    mine = RetryBudget(RetryBudgetPolicy(capacity=1, trickle=HOUR))
    report = world.app.named("supervisor-1", store=racing, retry_budget=mine).sweep()
    assert racing.meanwhile is not None and report["lost_race"] == 1
    assert world.history(oid).count("expired_retry") == 1
    assert mine.tokens(world.clock.now()) == 1  # it sent nothing: its token is back


def saturated_world(**policy) -> World:
    """A Supervisor that held a retry back just now, with one token left to send one."""
    world = world_with_budget(capacity=1, per_finished=0, **policy)
    budget, now = world.supervisor.ctx.retry_budget, world.clock.now()
    assert budget.take(now, expired_at=now) and not budget.take(now, expired_at=now)
    budget.give_back()
    return world


def test_an_expiry_while_saturated_is_the_loads_and_spends_no_failure():
    world = saturated_world()
    oid = order(world)
    world.drop("agent-inventory")
    assert world.tick(BUDGET + 3)["retry"] == 1
    state = world.state(oid)
    assert (state.process_state, state.failure_count, state.load_expiries) == (
        ProcessState.PENDING,
        0,
        1,
    )
    [expiry] = [e for e in world.store.get_history(oid) if e.kind == "expired_retry"]
    assert expiry.detail is not None and "not counted: saturated (1 of 5)" in expiry.detail
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert world.state(oid).load_expiries == 0  # the next step started afresh
    assert_effects_once(world, oid, *ALL_STEPS)


def test_an_expiry_with_nothing_held_back_lately_counts():
    world = world_with_budget(capacity=5)
    oid = order(world)
    world.drop("agent-inventory")
    world.tick(BUDGET + 3)
    state = world.state(oid)
    assert (state.failure_count, state.load_expiries) == (1, 0)


def test_a_step_that_never_finishes_still_fails_under_a_lasting_saturation():
    """Past max_load_expiries the load is no excuse: the failures count, the order is undone."""
    world = saturated_world()
    world.supervisor = world.supervisor.named(
        "supervisor-1", policy=replace(world.policy, max_load_expiries=2)
    )
    budget = world.supervisor.ctx.retry_budget
    oid = order(world)
    for _ in range(10):
        world.drop("agent-inventory")  # the agent dies on every attempt
        now = world.clock.now()
        while budget.take(now, expired_at=now):  # a retry held back: saturated throughout...
            pass
        budget.give_back()  # ...with a token for this round's retry
        world.tick(BUDGET + 3)
        if world.state(oid).is_terminal or world.state(oid).mode == "undo":
            break
        world.clock.advance(60)  # past any backoff
        world.deliver("scheduler")
    world.run()
    assert world.state(oid).process_state is ProcessState.COMPENSATED
    kinds = [e.detail or "" for e in world.store.get_history(oid) if e.kind == "expired_retry"]
    assert sum("not counted" in k for k in kinds) == 2  # spared twice, then 2 failures counted
    assert sum("failure" in k for k in kinds) == world.policy.max_failures - 1


@pytest.mark.parametrize("bad", [-1])
def test_a_negative_load_expiry_allowance_is_refused(bad):
    with pytest.raises(ValueError, match="max_load_expiries"):
        RetryPolicy(max_load_expiries=bad)

"""Queue wait is never a failure (recovery.queue_wait, the agent's recorded start): a request
still in its queue is not sent again and counts no failure; a step's budget runs from when an
agent starts it; a step is recovered when its agent started it and did not answer in time, when
its queue holds nothing, or past the queue-wait limit, after which no agent starts it. The
queues' and the store's real behaviour: tests/integration/test_queue_wait_on_azurite.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from sas.domain.messages import ScheduleRequest, StepRequest
from sas.domain.model import ProcessState, StepStart
from sas.domain.recovery import RetryPolicy, Waits, queue_wait
from sas.domain.workflow import START_SLACK
from sas.services.agent import AgentOutcome
from sas.testing import too_slow
from sas.testing.memory import InMemoryStore
from tests.harness import BUDGET, CLAIMED, World
from tests.unit.test_failure_modes import ALL_STEPS, assert_effects_once, order
from tests.workflows import BUDGET as STEP_BUDGET

pytestmark = [pytest.mark.unit, pytest.mark.fast]

LANE = "agent-inventory"


@pytest.fixture
def world() -> World:
    return World()


def finishes_with_each_effect_once(world: World, oid: str) -> None:
    """Once the backoff passed, the order runs to Processed, each step's effect applied once."""
    world.clock.advance(60)
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert_effects_once(world, oid, *ALL_STEPS)


def schedule_requests(world: World) -> list[ScheduleRequest]:
    return [m for m in world.bus.to("scheduler") if isinstance(m, ScheduleRequest)]


def test_a_request_waiting_in_its_queue_is_not_sent_again_and_counts_no_failure(world):
    oid = order(world)
    world.bus.waiting_since[LANE] = world.clock.now()  # a backlog ahead of it
    for _ in range(5):  # five budgets in the queue
        assert world.tick(CLAIMED)["request_queued"] == 1
    state = world.state(oid)
    assert (state.attempt, state.failure_count, state.process_state) == (
        1,
        0,
        ProcessState.PROCESSING,
    )
    assert schedule_requests(world) == [] and len(world.bus.pending(LANE)) == 1
    del world.bus.waiting_since[LANE]
    world.run()  # taken at last: it runs, its budget from now
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert len(world.remote.calls) == 3  # one call per step: nothing ran twice
    assert_effects_once(world, oid, *ALL_STEPS)


def test_an_agents_start_moves_the_deadline_and_an_overrun_from_there_is_recovered(world):
    world.remote.script("inventory", "reserve", too_slow(BUDGET * 2))
    oid = order(world)
    world.clock.advance(BUDGET * 3)  # queued three budgets: the claim's deadline long past
    world.deliver(LANE)  # starts now, runs past its budget from the start: no reply
    assert world.tick(0)["retry"] == 1  # started, overran, and nothing in the replies queue
    assert world.state(oid).failure_count == 1


def test_a_started_step_is_not_recovered_before_its_budget_from_the_start(world):
    oid = order(world)
    world.clock.advance(BUDGET * 3)  # queued past the claim's deadline
    [request] = world.bus.take(LANE)
    assert isinstance(request, StepRequest)
    started = world.clock.now()
    world.app.ctx.store.record_start(  # as the agent does first
        _start(oid, request, started, BUDGET, world.app.ctx.instance_id)
    )
    assert world.tick(BUDGET / 2)["running"] == 1  # looked at again by its start's budget
    assert world.tick(BUDGET / 2 - 0.5)["retry"] == 0
    assert world.tick(1)["retry"] == 1  # past its start's budget: recovered
    assert world.state(oid).failure_count == 1


def test_an_agent_that_starts_within_the_claims_slack_records_no_start(world):
    """The claim's deadline leaves it a whole budget: nothing to write, and nothing to wait for
    past that deadline. A later start is recorded, and its budget runs from then."""
    prompt, late = order(world), order(world, "o2")
    [first, second] = world.bus.take(LANE)
    world.clock.advance(START_SLACK.total_seconds())
    assert world.app.run_step("inventory", first) is AgentOutcome.REPLIED
    world.clock.advance(0.001)
    started = world.clock.now()
    assert world.app.run_step("inventory", second) is AgentOutcome.REPLIED
    assert world.store.get_start(prompt, first.idempotency_key, 1) is None
    recorded = world.store.get_start(late, second.idempotency_key, 1)
    assert recorded is not None and recorded.run_by == started + STEP_BUDGET


def test_on_the_happy_path_no_agent_records_a_start(world):
    oid = order(world)
    world.run()  # each message taken a moment after it was sent
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert isinstance(world.store, InMemoryStore) and world.store.starts == {}


def test_a_request_gone_from_an_empty_queue_is_recovered_at_its_deadline(world):
    oid = order(world)
    world.drop(LANE)  # lost with its consumer
    assert world.tick(CLAIMED + 1)["retry"] == 1
    assert world.state(oid).process_state is ProcessState.PENDING


def test_past_the_queue_wait_limit_it_is_recovered_and_the_old_request_never_starts(world):
    oid = order(world)
    world.bus.waiting_since[LANE] = world.clock.now()
    limit = world.policy.queue_wait_limit.total_seconds()
    assert world.tick(CLAIMED + limit - 1)["request_queued"] == 1
    world.make_due(oid)
    assert world.tick(2)["retry"] == 1  # a lost request behind a queue that never empties
    [old] = world.bus.take(LANE)
    assert isinstance(old, StepRequest) and old.attempt == 1
    assert world.app.run_step("inventory", old) is AgentOutcome.EXPIRED  # never started
    assert world.remote.calls == []
    del world.bus.waiting_since[LANE]
    finishes_with_each_effect_once(world, oid)


def test_a_pending_orders_schedule_request_in_a_busy_queue_is_not_expired(world):
    oid = order(world)
    world.drop(LANE)
    assert world.tick(CLAIMED + 1)["retry"] == 1  # Pending, its schedule request queued
    world.bus.waiting_since["scheduler"] = world.clock.now()
    assert world.tick(180)["request_queued"] == 1  # past its pickup deadline
    assert world.state(oid).failure_count == 1 and len(schedule_requests(world)) == 1
    del world.bus.waiting_since["scheduler"]
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED


def _start(oid: str, request: StepRequest, at: datetime, budget: float, instance: str) -> StepStart:
    return StepStart(
        order_id=oid,
        key=request.idempotency_key,
        attempt=request.attempt,
        started_at=at,
        run_by=at + timedelta(seconds=budget),
        instance=instance,
    )


@pytest.mark.parametrize(
    ("started", "request_busy", "reply_busy", "after", "expected"),
    [
        (None, False, False, 1, None),  # nothing queued, never started: lost
        (None, True, False, 1, Waits.REQUEST_QUEUED),
        (None, True, False, 15 * 60 + 2, None),  # past the limit and the allowance
        (None, False, True, 1, Waits.REPLY_QUEUED),  # an agent that ran within the slack
        (None, False, True, 15 * 60 + 2, None),
        (0, False, False, 5, Waits.RUNNING),  # within its budget from the start
        (0, True, False, 11, None),  # overran; its own queue says nothing of its reply
        (0, False, True, 11, Waits.REPLY_QUEUED),
        (0, False, True, 10 + 15 * 60 + 1, None),
    ],
)
def test_queue_wait_decides_from_the_start_and_the_queues(
    world, started, request_busy, reply_busy, after, expected
):
    order(world)
    state = world.state("o1")
    assert state.complete_by is not None
    now = state.complete_by + timedelta(seconds=after)
    start = None
    if started is not None:
        [request] = world.bus.take(LANE)
        start = _start("o1", request, state.complete_by, 10, "agent")
    policy = RetryPolicy(clock_skew=timedelta(seconds=1))
    decided = queue_wait(
        state,
        now=now,
        policy=policy,
        start=start,
        request_lane_busy=request_busy,
        reply_lane_busy=reply_busy,
        recheck=timedelta(seconds=15),
    )
    assert (decided.why if decided else None) == expected
    if decided is not None:
        assert decided.until <= now + timedelta(seconds=15)


class StartsAfterTheRead:
    """The store, with an agent's start landing right after the Supervisor read none."""

    def __init__(self, world: World, request: StepRequest) -> None:
        self._store, self._world, self._request = world.store, world, request
        self.started: StepStart | None = None

    def get_start(self, order_id: str, key: str, attempt: int) -> StepStart | None:
        found = self._store.get_start(order_id, key, attempt)
        if self.started is None:
            now = self._world.clock.now()
            self.started = self._store.record_start(_start(order_id, self._request, now, 10, "a"))
        return found

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


def test_a_request_that_arrives_after_its_attempt_was_given_up_runs_nothing(world):
    oid = order(world)
    [late] = world.bus.take(LANE)  # a slow send, or a consumer that stalled holding it
    assert world.tick(CLAIMED + 1)["retry"] == 1  # nothing queued, nothing started: given up
    assert world.app.run_step("inventory", late) is AgentOutcome.EXPIRED
    assert world.remote.calls == []
    finishes_with_each_effect_once(world, oid)


def test_an_agent_that_starts_as_the_supervisor_gives_up_wins_and_runs(world):
    oid = order(world)
    [request] = world.bus.take(LANE)
    assert isinstance(request, StepRequest)
    world.clock.advance(CLAIMED + 1)
    racing = StartsAfterTheRead(world, request)
    supervisor = world.new_supervisor("supervisor-2", racing)
    assert supervisor.sweep()["running"] == 1  # its give-up found the agent's start
    assert racing.started is not None and not racing.started.abandoned
    assert world.state(oid).attempt == 1 and world.state(oid).failure_count == 0


def test_an_attempt_given_up_by_a_sweep_cut_short_is_recovered_by_the_next(world):
    oid = order(world)
    [request] = world.bus.pending(LANE)  # still queued: the lane stays busy
    assert isinstance(request.message, StepRequest)
    gone = _start(oid, request.message, world.clock.now(), 0, "supervisor-0")
    world.store.record_start(replace(gone, abandoned=True))  # then that Supervisor died
    assert world.tick(CLAIMED + 1)["retry"] == 1  # no agent will run it: nothing to wait for

"""Hostile tests of the order path, in memory (the domain decides them; the store here has
Table Storage's semantics): the Submission's claim, the in-flight index with its due times, and
the Supervisor that lists only due markers.

They pin ways an accepted order could leave the Supervisor's sight (I1: "visibly in flight:
indexed in the in-flight table, due no later than its deadline"), a best-effort status send
that could spend a step's budget, and duplicate-submission paths no other test covers.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from sas.domain.messages import StepReply, StepRequest
from sas.domain.model import ProcessState
from sas.domain.recovery import RetryPolicy
from sas.domain.wire import idempotency_key
from sas.services.submission import SubmissionOutcome
from sas.testing import Instance, instance
from tests.harness import BUDGET, CLAIMED, ROUTES, World
from tests.unit.test_failure_modes import ALL_STEPS, assert_effects_once, order
from tests.unit.test_services import submitted
from tests.workflows import REGISTRY

pytestmark = [pytest.mark.unit, pytest.mark.fast]


@pytest.fixture
def world() -> World:
    return World()


class AheadClock:
    """Another instance's clock: the shared fake clock plus a fixed offset."""

    def __init__(self, base, seconds: float) -> None:
        self._base = base
        self._offset = timedelta(seconds=seconds)

    def now(self):
        return self._base.now() + self._offset


class SweepBeforeTheInsertCommits:
    """The world's store, whose submission insert is slow to commit (the SDK retrying a 503
    ServerBusy on the $batch POST, a paused worker): a Supervisor sweep runs between its index
    touch and the moment its order + state rows exist (everything else passes through)."""

    def __init__(self, inner: Any, world: World, supervisor: Instance, stall: float) -> None:
        self.inner = inner
        self.world, self.supervisor, self.stall = world, supervisor, stall
        self.report: Counter[str] | None = None

    def create_order(self, order, state, history=None):
        self.world.clock.advance(self.stall)
        self.report = self.supervisor.sweep()
        return self.inner.create_order(order, state, history)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_an_insert_committed_after_a_sweep_saw_no_order_is_still_supervised_by_its_deadline(
    world,
):
    """A sweep that finds a marker without an order (its insert not committed yet) must look
    again by the order's first deadline, not only after the orphan's 5-minute grace."""
    skew = timedelta(seconds=10)  # SAS_CLOCK_SKEW_SECONDS at its maximum
    # A Supervisor whose clock is 8 s ahead (inside the allowance): a 9 s stall is enough.
    supervisor = instance(
        world.store,
        world.bus,
        ROUTES,
        AheadClock(world.clock, 8),
        REGISTRY,
        "supervisor-ahead",
        policy=RetryPolicy(max_failures=3, base_backoff=timedelta(seconds=2), clock_skew=skew),
    )
    slow = SweepBeforeTheInsertCommits(world.store, world, supervisor, stall=9)
    outcome = instance(slow, world.bus, ROUTES, world.clock, REGISTRY).submit(submitted("o1"))
    assert outcome is SubmissionOutcome.ACCEPTED
    assert slow.report is not None and slow.report["orphan_waiting"] == 1
    state = world.state("o1")
    assert state.process_state is ProcessState.PROCESSING and state.complete_by is not None
    world.drop("agent-inventory")  # the agent died with the first step's request
    world.clock.advance(30)  # the deadline and the skew allowance are well past
    report = supervisor.sweep()
    (marker,) = world.store.list_live()
    assert report["retry"] == 1, (
        f"order unsupervised: deadline {state.complete_by}, marker due {marker.due_at}"
    )


def test_a_duplicate_during_a_retry_backoff_neither_claims_early_nor_counts_a_failure(world):
    """Pins: a redelivered submission that finds the order Pending (its first attempt
    expired) asks a Scheduler, which waits out the backoff; the marker stays due by the
    pickup deadline, and the order then runs to the end with each effect once."""
    oid = order(world)
    world.drop("agent-inventory")
    world.tick(CLAIMED + 1)  # expired: Pending, backoff 2 s
    assert world.state(oid).process_state is ProcessState.PENDING
    assert world.app.submit(submitted(oid)) is SubmissionOutcome.DUPLICATE
    world.deliver("scheduler")  # the duplicate's request, early: NOT_YET, asks again later
    state = world.state(oid)
    assert (state.process_state, state.failure_count, state.attempt) == (
        ProcessState.PENDING,
        1,
        1,
    )
    (marker,) = world.store.list_live()
    assert state.complete_by is not None and marker.due_at <= state.complete_by
    world.clock.advance(3)
    world.run()
    final = world.state(oid)
    assert final.process_state is ProcessState.PROCESSED and final.failure_count == 0
    assert_effects_once(world, oid, *ALL_STEPS)
    key = idempotency_key(oid, final.incarnation, "reserve", "do")
    assert [s.message_id for s in world.bus.sent if s.queue == "agent-inventory"] == [
        f"{key}:1",
        f"{key}:2",
    ]


def test_a_late_duplicate_of_a_finished_order_leaves_no_marker_after_one_sweep(world):
    """Pins: the duplicate's index touch re-creates a marker for a Processed order (due at
    once); one sweep removes it again and nothing is re-run."""
    oid = order(world)
    world.run()
    world.tick(CLAIMED)
    assert world.store.list_live() == []
    sent = len(world.bus.sent)
    assert world.app.submit(submitted(oid)) is SubmissionOutcome.DUPLICATE
    assert [m.order_id for m in world.store.list_live()] == [oid]
    assert world.tick(0)["unindexed"] == 1
    assert world.store.list_live() == []
    assert len(world.bus.sent) == sent


SLOW_STATUS_SEND = 25.0
"""One status send to a queue whose partition does not answer: three tries of a 3 s connect
and 7 s read, backing off about 1 s and 3 s (``adapters.clients.bounded_queue_options``,
"under about 36 s"), before Notifier logs it and gives up."""


def test_a_slow_status_queue_never_spends_a_steps_budget(world):
    """A submitter that asked for every step's progress names a status queue that is slow
    (its partition moving, throttled). Best effort means it must not cost the order anything,
    but two status sends sit between a claim (which starts the step's deadline) and the
    request that tells the agent about it: the Submission's "received" and the Scheduler's
    "step_completed" (sent after the reply's transaction claimed the next step, before its
    request). The request then leaves with
    its budget spent: the agent drops it as expired, the step counts a failure, and three
    such sends in a row compensate an order whose every remote call would have succeeded.

    Only the time at which each request is *sent* is judged here: sends after the request
    (step_started) delay nobody, since the agent runs elsewhere."""
    original = world.bus.send

    def send(queue, message, **kwargs):
        if queue == "status-q":
            world.clock.advance(SLOW_STATUS_SEND)
            raise TimeoutError("status queue did not answer")
        return original(queue, message, **kwargs)

    world.bus.send = send
    world.submit(submitted("o1", status_events="steps"))
    world.app.on_reply(
        StepReply(
            order_id="o1",
            step="reserve",
            step_index=0,
            attempt=1,
            outcome="ok",
            incarnation=world.state("o1").incarnation,
        )
    )
    left = {}
    for sent in world.bus.sent:
        if isinstance(sent.message, StepRequest):
            left[sent.queue] = (sent.message.complete_by - sent.due).total_seconds()
    assert set(left) == {"agent-inventory", "agent-payment"}
    assert all(seconds >= BUDGET - 1 for seconds in left.values()), (
        f"seconds of budget left when each request was sent: {left}"
    )

"""Scheduler and submission services on the real Table store (Azurite)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from sas.adapters.tables import TableStateStore
from sas.domain.messages import ScheduleRequest, StepReply, StepRequest
from sas.domain.model import ProcessState
from sas.services.scheduler import ReplyOutcome, ScheduleOutcome, Scheduler
from sas.services.submission import Submission, SubmissionOutcome
from tests.fakes import FakeClock, RecordingTransport
from tests.unit.test_services import ROUTES, submitted

pytestmark = pytest.mark.integration


class BarrierStore(TableStateStore):
    """Makes every racer read the state before any of them writes: a guaranteed race."""

    def __init__(self, table, racers: int) -> None:
        super().__init__(table)
        self._barrier = threading.Barrier(racers, timeout=10)
        self._thread = threading.local()

    def get_state(self, order_id):
        found = super().get_state(order_id)
        if not getattr(self._thread, "synchronised", False):
            self._thread.synchronised = True  # later re-reads (after a conflict) run freely
            self._barrier.wait()
        return found


def test_two_schedulers_racing_for_one_order_exactly_one_wins(table):
    clock, transport = FakeClock(), RecordingTransport()
    Submission(TableStateStore(table), transport, ROUTES, clock).submit(submitted())
    store = BarrierStore(table, racers=2)
    schedulers = [Scheduler(store, transport, ROUTES, clock, f"s{n}") for n in (1, 2)]
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda s: s.schedule(ScheduleRequest(order_id="o1")), schedulers))
    assert sorted(outcomes) == sorted([ScheduleOutcome.CLAIMED, ScheduleOutcome.LOST_RACE])
    winner = f"s{outcomes.index(ScheduleOutcome.CLAIMED) + 1}"
    found = TableStateStore(table).get_state("o1")
    assert found is not None
    state = found.value
    assert (state.locked_by, state.attempt, state.process_state) == (
        winner,
        1,
        ProcessState.PROCESSING,
    )
    assert len([m for m in transport.to("agent-inventory") if isinstance(m, StepRequest)]) == 1


def test_a_redelivered_submission_is_a_no_op(table):
    clock, transport = FakeClock(), RecordingTransport()
    store = TableStateStore(table)
    submission = Submission(store, transport, ROUTES, clock)
    assert submission.submit(submitted()) is SubmissionOutcome.ACCEPTED
    Scheduler(store, transport, ROUTES, clock, "s1").schedule(ScheduleRequest(order_id="o1"))
    before = store.get_state("o1")
    clock.advance(5)
    assert submission.submit(submitted()) is SubmissionOutcome.DUPLICATE
    assert store.get_state("o1") == before  # same ETag: nothing was written
    assert len(transport.to("scheduler")) == 1  # already claimed, so not rescheduled


def test_a_redelivery_after_a_crash_before_scheduling_schedules_again(table):
    clock, transport = FakeClock(), RecordingTransport()
    store = TableStateStore(table)
    Submission(store, RecordingTransport(), ROUTES, clock).submit(submitted())  # its sends "lost"
    before = store.get_state("o1")
    assert (
        Submission(store, transport, ROUTES, clock).submit(submitted())
        is SubmissionOutcome.DUPLICATE
    )
    assert store.get_state("o1") == before
    assert transport.to("scheduler") == [ScheduleRequest(order_id="o1")]


def test_a_conflicting_duplicate_is_rejected_and_the_original_kept(table):
    clock, transport = FakeClock(), RecordingTransport()
    store = TableStateStore(table)
    submission = Submission(store, transport, ROUTES, clock)
    submission.submit(submitted())
    before_state, before_order = store.get_state("o1"), store.get_order("o1")
    assert submission.submit(submitted(address="2 Other Rd")) is SubmissionOutcome.CONFLICT
    assert store.get_state("o1") == before_state
    assert store.get_order("o1") == before_order
    assert before_order is not None and before_order.details["address"] == "1 Main St"


def test_a_reply_for_an_old_attempt_is_ignored_after_a_newer_claim(table):
    clock, transport = FakeClock(), RecordingTransport()
    store = TableStateStore(table)
    Submission(store, transport, ROUTES, clock).submit(submitted())
    scheduler = Scheduler(store, transport, ROUTES, clock, "s1")
    scheduler.schedule(ScheduleRequest(order_id="o1"))
    # What the Supervisor does to an expired attempt (issue 4): back to Pending, unlocked.
    current = store.get_state("o1")
    assert current is not None
    store.update_state(
        replace(current.value, process_state=ProcessState.PENDING, locked_by=None), current.etag
    )
    scheduler.schedule(ScheduleRequest(order_id="o1"))
    newer = store.get_state("o1")
    assert newer is not None and newer.value.attempt == 2
    old = StepReply(order_id="o1", step="reserve", step_index=0, attempt=1, outcome="ok")
    assert scheduler.on_reply(old) is ReplyOutcome.STALE
    assert store.get_state("o1") == newer
    assert store.get_steps("o1") == []
    current_reply = StepReply(order_id="o1", step="reserve", step_index=0, attempt=2, outcome="ok")
    assert scheduler.on_reply(current_reply) is ReplyOutcome.ADVANCED
    advanced = store.get_state("o1")
    assert advanced is not None and advanced.value.step_index == 1


def test_duplicate_replies_racing_apply_once(table):
    clock, transport = FakeClock(), RecordingTransport()
    Submission(TableStateStore(table), transport, ROUTES, clock).submit(submitted())
    Scheduler(TableStateStore(table), transport, ROUTES, clock, "s0").schedule(
        ScheduleRequest(order_id="o1")
    )
    store = BarrierStore(table, racers=2)
    schedulers = [Scheduler(store, transport, ROUTES, clock, f"s{n}") for n in (1, 2)]
    reply = StepReply(order_id="o1", step="reserve", step_index=0, attempt=1, outcome="ok")
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda s: s.on_reply(reply), schedulers))
    assert sorted(outcomes) == sorted([ReplyOutcome.ADVANCED, ReplyOutcome.STALE])
    assert len(transport.to("agent-payment")) == 1
    after = TableStateStore(table).get_state("o1")
    assert after is not None and after.value.attempt == 2

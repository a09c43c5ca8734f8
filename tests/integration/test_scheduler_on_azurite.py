"""Scheduler and submission services on the real Table store (Azurite): what its ETags and
transactions decide (I2, I3, I5). How a redelivered submission resumes, which the domain
decides, is proved in memory: tests/unit/test_submission_redelivery.py."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from sas.adapters.table_store import TableStateStore
from sas.domain.messages import ScheduleRequest, StepReply, StepRequest
from sas.domain.model import ProcessState
from sas.services.ports import StateStore
from sas.services.scheduler import ReplyOutcome, ScheduleOutcome
from sas.services.submission import SubmissionOutcome
from sas.testing import FakeClock, InMemoryQueues, Instance, instance
from tests.harness import live_table_of, store_on
from tests.unit.test_services import ROUTES, submitted
from tests.workflows import REGISTRY

pytestmark = pytest.mark.integration


class BarrierStore(TableStateStore):
    """Makes every racer read the state before any of them writes: a guaranteed race."""

    def __init__(self, table, racers: int) -> None:
        super().__init__(table, live_table_of(table))
        self._barrier = threading.Barrier(racers, timeout=10)
        self._thread = threading.local()

    def get_state(self, order_id):
        found = super().get_state(order_id)
        if not getattr(self._thread, "synchronised", False):
            self._thread.synchronised = True  # later re-reads (after a conflict) run freely
            self._barrier.wait()
        return found


def parts() -> tuple[FakeClock, InMemoryQueues]:
    clock = FakeClock()
    return clock, InMemoryQueues(clock)


def on(
    store: StateStore, transport: InMemoryQueues, clock: FakeClock, name: str = "instance-1"
) -> Instance:
    """An instance of the app named ``name`` running the tests' workflows."""
    return instance(store, transport, ROUTES, clock, REGISTRY, name)


def expired_back_to_pending(store: TableStateStore) -> None:
    """What the Supervisor does to an expired attempt: back to Pending, unlocked."""
    current = store.get_state("o1")
    assert current is not None
    store.update_state(
        replace(current.value, process_state=ProcessState.PENDING, locked_by=None), current.etag
    )


def test_two_schedulers_racing_for_one_order_exactly_one_wins(table):
    clock, transport = parts()
    on(store_on(table), transport, clock).submit(submitted())
    expired_back_to_pending(store_on(table))
    store = BarrierStore(table, racers=2)
    schedulers = [on(store, transport, clock, f"s{n}") for n in (1, 2)]
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda s: s.schedule(ScheduleRequest(order_id="o1")), schedulers))
    assert sorted(outcomes) == sorted([ScheduleOutcome.CLAIMED, ScheduleOutcome.LOST_RACE])
    winner = f"s{outcomes.index(ScheduleOutcome.CLAIMED) + 1}"
    found = store_on(table).get_state("o1")
    assert found is not None
    state = found.value
    assert (state.locked_by, state.attempt, state.process_state) == (
        winner,
        2,
        ProcessState.PROCESSING,
    )
    requests = [m for m in transport.to("agent-inventory") if isinstance(m, StepRequest)]
    assert [r.attempt for r in requests] == [1, 2]  # the submission's, then the winner's


def test_the_submission_claims_the_first_step_in_its_insert(table):
    clock, transport = parts()
    store = store_on(table)
    assert on(store, transport, clock, "h1").submit(submitted()) is (SubmissionOutcome.ACCEPTED)
    found = store.get_state("o1")
    assert found is not None
    state = found.value
    assert (state.process_state, state.attempt, state.locked_by) == (
        ProcessState.PROCESSING,
        1,
        "h1",
    )
    assert [(h.kind, h.attempt) for h in store.get_history("o1")] == [
        ("submitted", 0),
        ("claimed", 1),
    ]
    assert transport.to("scheduler") == []  # no hop through the Scheduler
    [request] = transport.to("agent-inventory")
    assert isinstance(request, StepRequest) and request.attempt == 1
    assert request.payload["address"] == "1 Main St"
    [marker] = store.list_live()
    assert marker.due_at == state.complete_by  # due no later than the step's deadline


def test_a_redelivered_submission_changes_nothing(table):
    clock, transport = parts()
    store = store_on(table)
    submission = on(store, transport, clock)
    assert submission.submit(submitted()) is SubmissionOutcome.ACCEPTED
    before = store.get_state("o1")
    clock.advance(5)
    assert submission.submit(submitted()) is SubmissionOutcome.DUPLICATE
    assert store.get_state("o1") == before  # same ETag: nothing was written
    assert transport.to("scheduler") == []


def test_a_conflicting_duplicate_is_rejected_and_the_original_kept(table):
    clock, transport = parts()
    store = store_on(table)
    submission = on(store, transport, clock)
    submission.submit(submitted())
    before_state, before_order = store.get_state("o1"), store.get_order("o1")
    assert submission.submit(submitted(address="2 Other Rd")) is SubmissionOutcome.CONFLICT
    assert store.get_state("o1") == before_state
    assert store.get_order("o1") == before_order
    assert before_order is not None and before_order.details["address"] == "1 Main St"


def test_an_old_attempts_ok_applies_after_a_newer_claim_and_its_refusal_does_not(table):
    clock, transport = parts()
    store = store_on(table)
    on(store, transport, clock).submit(submitted())
    scheduler = on(store, transport, clock, "s1")
    expired_back_to_pending(store)
    scheduler.schedule(ScheduleRequest(order_id="o1"))
    newer = store.get_state("o1")
    assert newer is not None and newer.value.attempt == 2
    incarnation = newer.value.incarnation
    refused = StepReply(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=1,
        outcome="error",
        error="no",
        incarnation=incarnation,
    )
    assert scheduler.on_reply(refused) is ReplyOutcome.STALE
    assert store.get_state("o1") == newer
    old = StepReply(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=1,
        outcome="ok",
        incarnation=incarnation,
    )
    assert scheduler.on_reply(old) is ReplyOutcome.ADVANCED
    advanced = store.get_state("o1")
    assert advanced is not None and (advanced.value.step_index, advanced.value.attempt) == (1, 3)
    current_reply = StepReply(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=2,
        outcome="ok",
        incarnation=incarnation,
    )
    assert scheduler.on_reply(current_reply) is ReplyOutcome.STALE
    assert [s.attempt for s in store.get_steps("o1")] == [1]


def test_duplicate_replies_racing_apply_once(table):
    clock, transport = parts()
    on(store_on(table), transport, clock).submit(submitted())
    store = BarrierStore(table, racers=2)
    schedulers = [on(store, transport, clock, f"s{n}") for n in (1, 2)]
    state = store_on(table).get_state("o1")
    assert state is not None
    reply = StepReply(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=1,
        outcome="ok",
        incarnation=state.value.incarnation,
    )
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda s: s.on_reply(reply), schedulers))
    assert sorted(outcomes) == sorted([ReplyOutcome.ADVANCED, ReplyOutcome.STALE])
    assert len(transport.to("agent-payment")) == 1
    after = store_on(table).get_state("o1")
    assert after is not None and after.value.attempt == 2

"""Scheduler and submission services on the real Table store (Azurite)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from sas.adapters.tables import TableStateStore
from sas.domain.carried import carried_state
from sas.domain.errors import ConfigurationError
from sas.domain.messages import ScheduleRequest, StepReply, StepRequest, decode, encode
from sas.domain.model import ProcessState
from sas.services.scheduler import ReplyOutcome, ScheduleOutcome, Scheduler
from sas.services.submission import Submission, SubmissionOutcome
from tests.fakes import FakeClock, RecordingTransport
from tests.harness import live_table_of, store_on
from tests.unit.test_carried import agent_reply
from tests.unit.test_services import ROUTES, submitted

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


def expired_back_to_pending(store: TableStateStore) -> None:
    """What the Supervisor does to an expired attempt: back to Pending, unlocked."""
    current = store.get_state("o1")
    assert current is not None
    store.update_state(
        replace(current.value, process_state=ProcessState.PENDING, locked_by=None), current.etag
    )


def test_two_schedulers_racing_for_one_order_exactly_one_wins(table):
    clock, transport = FakeClock(), RecordingTransport()
    Submission(store_on(table), transport, ROUTES, clock).submit(submitted())
    expired_back_to_pending(store_on(table))
    store = BarrierStore(table, racers=2)
    schedulers = [Scheduler(store, transport, ROUTES, clock, f"s{n}") for n in (1, 2)]
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
    clock, transport = FakeClock(), RecordingTransport()
    store = store_on(table)
    assert Submission(store, transport, ROUTES, clock, instance_id="h1").submit(submitted()) is (
        SubmissionOutcome.ACCEPTED
    )
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
    clock, transport = FakeClock(), RecordingTransport()
    store = store_on(table)
    submission = Submission(store, transport, ROUTES, clock)
    assert submission.submit(submitted()) is SubmissionOutcome.ACCEPTED
    before = store.get_state("o1")
    clock.advance(5)
    assert submission.submit(submitted()) is SubmissionOutcome.DUPLICATE
    assert store.get_state("o1") == before  # same ETag: nothing was written
    assert transport.to("scheduler") == []


def test_a_redelivery_after_a_crash_before_the_send_sends_the_same_request(table):
    clock, transport = FakeClock(), RecordingTransport()
    store = store_on(table)
    Submission(store, RecordingTransport(), ROUTES, clock).submit(submitted())  # its sends "lost"
    before = store.get_state("o1")
    assert (
        Submission(store, transport, ROUTES, clock).submit(submitted())
        is SubmissionOutcome.DUPLICATE
    )
    assert store.get_state("o1") == before
    [sent] = transport.sent
    assert (sent.queue, sent.message_id) == ("agent-inventory", "o1:reserve:1")


def test_a_redelivery_once_the_first_step_moved_on_sends_nothing(table):
    clock, transport = FakeClock(), RecordingTransport()
    store = store_on(table)
    Submission(store, transport, ROUTES, clock).submit(submitted())
    Scheduler(store, transport, ROUTES, clock, "s1").on_reply(
        StepReply(order_id="o1", step="reserve", step_index=0, attempt=1, outcome="ok")
    )
    sent = len(transport.sent)
    assert Submission(store, transport, ROUTES, clock).submit(submitted()) is (
        SubmissionOutcome.DUPLICATE
    )
    assert len(transport.sent) == sent


def test_a_conflicting_duplicate_is_rejected_and_the_original_kept(table):
    clock, transport = FakeClock(), RecordingTransport()
    store = store_on(table)
    submission = Submission(store, transport, ROUTES, clock)
    submission.submit(submitted())
    before_state, before_order = store.get_state("o1"), store.get_order("o1")
    assert submission.submit(submitted(address="2 Other Rd")) is SubmissionOutcome.CONFLICT
    assert store.get_state("o1") == before_state
    assert store.get_order("o1") == before_order
    assert before_order is not None and before_order.details["address"] == "1 Main St"


def test_an_old_attempts_ok_applies_after_a_newer_claim_and_its_refusal_does_not(table):
    clock, transport = FakeClock(), RecordingTransport()
    store = store_on(table)
    Submission(store, transport, ROUTES, clock).submit(submitted())
    scheduler = Scheduler(store, transport, ROUTES, clock, "s1")
    expired_back_to_pending(store)
    scheduler.schedule(ScheduleRequest(order_id="o1"))
    newer = store.get_state("o1")
    assert newer is not None and newer.value.attempt == 2
    refused = StepReply(
        order_id="o1", step="reserve", step_index=0, attempt=1, outcome="error", error="no"
    )
    assert scheduler.on_reply(refused) is ReplyOutcome.STALE
    assert store.get_state("o1") == newer
    old = StepReply(order_id="o1", step="reserve", step_index=0, attempt=1, outcome="ok")
    assert scheduler.on_reply(old) is ReplyOutcome.ADVANCED
    advanced = store.get_state("o1")
    assert advanced is not None and (advanced.value.step_index, advanced.value.attempt) == (1, 3)
    current_reply = StepReply(order_id="o1", step="reserve", step_index=0, attempt=2, outcome="ok")
    assert scheduler.on_reply(current_reply) is ReplyOutcome.STALE
    assert [s.attempt for s in store.get_steps("o1")] == [1]


def test_duplicate_replies_racing_apply_once(table):
    clock, transport = FakeClock(), RecordingTransport()
    Submission(store_on(table), transport, ROUTES, clock).submit(submitted())
    store = BarrierStore(table, racers=2)
    schedulers = [Scheduler(store, transport, ROUTES, clock, f"s{n}") for n in (1, 2)]
    reply = StepReply(order_id="o1", step="reserve", step_index=0, attempt=1, outcome="ok")
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda s: s.on_reply(reply), schedulers))
    assert sorted(outcomes) == sorted([ReplyOutcome.ADVANCED, ReplyOutcome.STALE])
    assert len(transport.to("agent-payment")) == 1
    after = store_on(table).get_state("o1")
    assert after is not None and after.value.attempt == 2


def test_a_late_duplicate_leaves_the_marker_due_by_the_existing_deadline(table):
    """The duplicate's index touch (made before it knows it is one) would move the marker's
    due time past the order's deadline, hiding the order from the Supervisor's query."""
    clock, transport = FakeClock(), RecordingTransport()
    store = store_on(table)
    submission = Submission(store, transport, ROUTES, clock)
    submission.submit(submitted())
    clock.advance(10)
    assert submission.submit(submitted()) is SubmissionOutcome.DUPLICATE
    assert submission.submit(submitted(address="elsewhere")) is SubmissionOutcome.CONFLICT
    found = store.get_state("o1")
    assert found is not None and found.value.complete_by is not None
    (marker,) = store.list_live()
    assert marker.due_at <= found.value.complete_by


def test_a_reply_taken_by_another_process_starts_from_the_state_it_carries(table):
    """sas/domain/carried.py on the real store: what a request carries is the row as stored
    (equal to a read, at the read's ETag), so the other process's write needs no read."""
    clock, transport = FakeClock(), RecordingTransport()
    Submission(store_on(table), transport, ROUTES, clock).submit(submitted())
    reads: list[str] = []

    class CountingStore(TableStateStore):
        def get_state(self, order_id):
            reads.append(order_id)
            return super().get_state(order_id)

    other = Scheduler(CountingStore(table, live_table_of(table)), transport, ROUTES, clock, "s2")
    for _ in range(3):
        clock.advance(1)
        latest = [m.message for m in transport.sent if isinstance(m.message, StepRequest)][-1]
        request = decode(StepRequest, encode(latest))
        carried = carried_state(request.carried_state, "o1", store_on(table).carry_key())
        stored = store_on(table).get_state("o1")
        assert carried == stored  # the same state, at the same ETag
        assert other.on_reply(agent_reply(request)) in (
            ReplyOutcome.ADVANCED,
            ReplyOutcome.FINISHED,
        )
        other._recent.clear()  # the next reply comes to it as to a stranger
    assert reads == []
    found = store_on(table).get_state("o1")
    assert found is not None
    assert found.value.process_state is ProcessState.PROCESSED


def test_every_instance_signs_with_the_one_key_the_first_made(table):
    """The carried-state key (sas/domain/carried.py): made once, at random, kept in the table,
    read (not made again) by every other store; the same for a store that starts later."""
    with ThreadPoolExecutor(4) as pool:
        keys = list(pool.map(lambda _: store_on(table).carry_key(), range(4)))
    assert len(set(keys)) == 1
    assert len(keys[0]) == 32
    assert store_on(table).carry_key() == keys[0]
    (row,) = table.query_entities("PartitionKey eq '~keys'")
    assert row["RowKey"] == "carried-state"


def test_a_key_row_that_holds_no_key_is_read_once_a_minute_not_on_every_message(table, monkeypatch):
    table.create_entity({"PartitionKey": "~keys", "RowKey": "carried-state", "Key": "c2hvcnQ="})
    store = store_on(table)
    reads: list[object] = []
    get_entity = table.get_entity

    def counting(*args, **kwargs):
        reads.append(args)
        return get_entity(*args, **kwargs)

    monkeypatch.setattr(table, "get_entity", counting)
    with pytest.raises(ValueError, match="no usable key"):
        store.carry_key()
    for _ in range(3):
        with pytest.raises(ConfigurationError):
            store.carry_key()
    assert len(reads) == 1

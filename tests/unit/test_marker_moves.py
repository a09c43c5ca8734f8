"""The Scheduler moves an order's in-flight marker on when the marker is due, a batch at a time
(sas/services/marker_moves.py); in a quiet system it moves nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from sas.domain.messages import StepRequest
from sas.domain.model import OrderState, ProcessState, Settled
from sas.domain.transitions import claim, initial_state, look_again_at, resubmit
from sas.domain.workflow import ORDER_WORKFLOW
from sas.services.marker_moves import MarkerMoves
from sas.services.scheduler import Scheduler
from sas.services.submission import Submission
from tests.fakes import FakeClock, InMemoryStore, RecordingTransport
from tests.unit.test_services import ROUTES, submitted
from tests.unit.test_services import ok_reply as ok

pytestmark = pytest.mark.unit

BUDGET = ORDER_WORKFLOW.steps[0].budget.total_seconds()


class RecordingIndex:
    def __init__(self, inner: InMemoryStore, *, fail: bool = False) -> None:
        self.inner = inner
        self.fail = fail
        self.calls: list[list[tuple[str, datetime]]] = []
        self.drops: list[list[tuple[str, str]]] = []
        self.finishes: list[list[tuple[str, datetime, str]]] = []

    def settle_live(
        self,
        moves: Sequence[tuple[str, datetime]],
        drops: Sequence[tuple[str, str]],
        finishes: Sequence[tuple[str, datetime, str]] = (),
    ) -> Settled:
        self.calls.append(list(moves))
        self.drops.append(list(drops))
        self.finishes.append(list(finishes))
        if self.fail:
            raise ConnectionError("storage unreachable")
        return self.inner.settle_live(moves, drops, finishes)


@pytest.fixture
def world():
    store, transport, clock = InMemoryStore(), RecordingTransport(), FakeClock()
    index = RecordingIndex(store)
    moves = MarkerMoves(index, clock)
    scheduler = Scheduler(store, transport, ROUTES, clock, "s1", moves=moves)
    submission = Submission(store, transport, ROUTES, clock)
    return store, transport, clock, index, scheduler, submission


def last_request(transport: RecordingTransport, order_id: str = "o1") -> StepRequest:
    return [
        s.message
        for s in transport.sent
        if isinstance(s.message, StepRequest) and s.message.order_id == order_id
    ][-1]


def test_in_a_quiet_system_no_marker_is_moved_and_the_finished_order_drops_its_own(world):
    store, transport, clock, index, scheduler, submission = world
    submission.submit(submitted())
    (marker,) = store.list_live()
    for _ in range(3):
        clock.advance(1)  # each step answers long before the marker is due
        scheduler.on_reply(ok(last_request(transport)))
    state = store.get_state("o1").value
    assert state.process_state is ProcessState.PROCESSED
    assert state.marker_etag == marker.etag  # as the submission's touch left it
    assert index.calls == [[]]  # one request, at the end: no move, the drop
    assert index.drops == [[("o1", marker.etag)]]
    assert store.list_live() == []  # nothing left for the Supervisor to read


def test_only_orders_that_can_never_run_again_drop_their_marker():
    """Processed and Compensated are final; an Error keeps its marker (the Supervisor sees
    its alert sent, and an operator may resubmit it); a state that does not know the marker's
    ETag (written before it was kept, or resubmitted since) leaves it to the Supervisor."""
    clock = FakeClock()
    index = RecordingIndex(InMemoryStore())
    moves = MarkerMoves(index, clock, window=timedelta(0))
    running = replace(
        claim(
            initial_state("o1", ORDER_WORKFLOW, reply_to=None, now=clock.now()),
            instance_id="s1",
            now=clock.now(),
            workflow=ORDER_WORKFLOW,
        ),
        marker_etag='W/"m1"',
        marker_touch="t1",
    )
    for ending, dropped in (
        (ProcessState.PROCESSED, True),
        (ProcessState.COMPENSATED, True),
        (ProcessState.ERROR, False),
    ):
        sent = len(index.drops)
        moves.after_write(running, replace(running, process_state=ending), clock.now())
        assert index.drops[sent:] == ([[("o1", 'W/"m1"')]] if dropped else []), ending
    assert not any(index.finishes)
    sent = len(index.drops)
    unknown = replace(
        running, process_state=ProcessState.PROCESSED, marker_etag=None, marker_touch=None
    )
    moves.after_write(running, unknown, clock.now())
    assert index.drops[sent:] == []  # nothing to send at all
    clock.advance(ORDER_WORKFLOW.shortest_budget.total_seconds())  # past any drop's time
    for ending, marked in (
        (ProcessState.PROCESSED, True),
        (ProcessState.COMPENSATED, True),
        (ProcessState.ERROR, False),
    ):
        sent = len(index.finishes)
        moves.after_write(running, replace(running, process_state=ending), clock.now())
        expected = [[("o1", running.submitted_at, "t1")]] if marked else []
        assert index.finishes[sent:] == expected, ending
    sent = len(index.finishes)
    moves.after_write(running, unknown, clock.now())
    assert index.finishes[sent:] == []
    failed = replace(running, process_state=ProcessState.ERROR, alert_pending=False)
    again = resubmit(failed, now=clock.now(), workflow=ORDER_WORKFLOW)
    assert again.marker_etag is None  # the operator touches the marker again


def test_a_step_that_ends_when_the_marker_is_due_moves_it_to_the_next_look(world):
    store, transport, clock, index, scheduler, submission = world
    submission.submit(submitted())
    (marker,) = store.list_live()
    clock.advance(BUDGET + 1)  # past the marker's due: the reply came late in a backlog
    scheduler.on_reply(ok(last_request(transport)))
    state = store.get_state("o1").value
    expected = look_again_at(state, now=clock.now(), workflow=ORDER_WORKFLOW)
    assert index.calls == [[("o1", expected)]]
    (moved,) = store.list_live()
    assert moved.due_at == expected == state.complete_by > marker.due_at
    assert moved.touched_at == marker.touched_at


def test_moves_go_together_at_most_once_per_window(world):
    store, transport, clock, index, scheduler, submission = world
    for n in range(3):
        submission.submit(submitted(f"o{n}"))
    clock.advance(BUDGET - 2)  # within the lookahead of the markers' due
    for n in range(3):
        scheduler.on_reply(ok(last_request(transport, f"o{n}")))
    assert [sorted(dict(call)) for call in index.calls] == [["o0"]]  # at once; two wait
    clock.advance(1)
    scheduler.on_reply(ok(last_request(transport, "o0")))  # any write sends what waits
    assert [sorted(dict(call)) for call in index.calls] == [["o0"], ["o1", "o2"]]
    assert dict(index.calls[1])["o1"] == store.get_state("o1").value.complete_by


def test_a_finished_order_cancels_its_waiting_move(world):
    store, transport, clock, index, scheduler, submission = world
    for n in range(3):
        submission.submit(submitted(f"o{n}"))
    clock.advance(BUDGET - 2)
    scheduler.on_reply(ok(last_request(transport, "o0")))  # sent at once
    scheduler.on_reply(ok(last_request(transport, "o1")))  # waits for the window...
    for _ in range(2):
        clock.advance(0.1)
        scheduler.on_reply(ok(last_request(transport, "o1")))
    assert store.get_state("o1").value.process_state is ProcessState.PROCESSED  # ...and goes
    clock.advance(1)
    scheduler.on_reply(ok(last_request(transport, "o2")))
    assert [sorted(dict(call)) for call in index.calls] == [["o0"], ["o2"]]
    assert index.drops[-1] == []  # o1 finished too near its marker's due: no drop either


def test_a_state_with_a_far_deadline_moves_the_marker_only_a_shortest_budget_on(world):
    """Compensation starts with a pickup deadline (a minute): the marker moves no further
    than the write time plus the shortest budget, the earliest deadline a claim can set."""
    store, transport, clock, index, scheduler, submission = world
    submission.submit(submitted())
    clock.advance(1)
    scheduler.on_reply(ok(last_request(transport)))  # long before the marker is due: no move
    clock.advance(BUDGET - 3)  # the marker (the first deadline) is due in 2 s
    refused = ok(last_request(transport)).model_copy(
        update={"outcome": "error", "result": {}, "error": "HTTP 422 refused"}
    )
    scheduler.on_reply(refused)
    state = store.get_state("o1").value
    assert state.mode == "undo" and state.complete_by - clock.now() > timedelta(seconds=BUDGET)
    assert index.calls == [[("o1", clock.now() + ORDER_WORKFLOW.shortest_budget)]]


def test_a_failed_move_never_fails_the_reply(world, caplog):
    store, transport, clock, index, scheduler, submission = world
    index.fail = True
    submission.submit(submitted())
    clock.advance(BUDGET + 1)
    scheduler.on_reply(ok(last_request(transport)))
    assert store.get_state("o1").value.step_index == 1  # applied and dispatched
    assert isinstance(last_request(transport).step_index, int)
    assert "sas.marker_moves_failed" in caplog.text


def test_a_move_never_sets_a_marker_past_the_state_it_was_computed_from():
    """The bound that makes late and lost moves harmless: no later than the state's deadline,
    nor than the write time plus the shortest budget."""
    clock = FakeClock()
    store = InMemoryStore()
    index = RecordingIndex(store)
    moves = MarkerMoves(index, clock, lookahead=timedelta(days=1))
    scheduler = Scheduler(store, RecordingTransport(), ROUTES, clock, "s1", moves=moves)
    transport = RecordingTransport()
    Submission(store, transport, ROUTES, clock).submit(submitted())
    clock.advance(3)
    scheduler.on_reply(ok(last_request(transport)))
    ((order_id, due),) = index.calls[0]
    found = store.get_state(order_id)
    assert found is not None and found.value.complete_by is not None
    assert due <= found.value.complete_by
    assert due <= clock.now() + ORDER_WORKFLOW.shortest_budget


def _finished(clock: FakeClock, order_id: str) -> tuple[OrderState, OrderState]:
    running = replace(
        claim(
            initial_state(order_id, ORDER_WORKFLOW, reply_to=None, now=clock.now()),
            instance_id="s1",
            now=clock.now(),
            workflow=ORDER_WORKFLOW,
        ),
        marker_etag=f'W/"{order_id}"',
        marker_touch=f"touch-{order_id}",
    )
    return running, replace(running, process_state=ProcessState.PROCESSED)


def test_no_drop_is_sent_once_the_marker_may_have_been_moved_or_re_armed():
    """A drop is worth sending only while the marker is surely as the submission wrote it:
    until its first due time (the submission + the shortest budget) less a move's lookahead
    (or a clock allowance, if larger) and a second for the drop to land. After that it would
    fail its condition (one request more, and the Supervisor's read and delete still to
    come): the marker is marked finished instead, for the Supervisor to drop unread."""
    clock = FakeClock()
    index = RecordingIndex(InMemoryStore())
    moves = MarkerMoves(index, clock)  # lookahead 5 s, window 1 s, clock skew 2 s
    last_useful = ORDER_WORKFLOW.shortest_budget - timedelta(seconds=6)
    running, finished = _finished(clock, "in-time")
    clock.advance(last_useful.total_seconds() - 0.01)
    moves.after_write(running, finished, clock.now())
    assert index.drops == [[("in-time", 'W/"in-time"')]]  # just in time: sent at once
    running, finished = _finished(clock, "late")
    clock.advance(last_useful.total_seconds() + 1)  # finished in a backlog: marked instead
    moves.after_write(running, finished, clock.now())
    assert index.drops[1:] == [[]]
    assert index.finishes[1:] == [[("late", running.submitted_at, "touch-late")]]
    held_running, held = _finished(clock, "held")  # submitted now
    clock.advance(last_useful.total_seconds() - 0.5)
    running, finished = _finished(clock, "first")
    moves.after_write(running, finished, clock.now())  # sent at once
    clock.advance(0.1)
    moves.after_write(held_running, held, clock.now())  # in time, but waits for the window...
    clock.advance(1)  # ...and nothing writes until it is too late: marked, not dropped
    moves.send_waiting()
    assert index.drops[2:] == [[("first", 'W/"first"')], []]
    assert index.finishes[2:] == [[], [("held", held.submitted_at, "touch-held")]]


def test_a_larger_clock_allowance_ends_drops_sooner():
    """With Supervisors allowed to run 10 s ahead (``SAS_CLOCK_SKEW_SECONDS``), a sweep may
    re-arm a marker 10 s before it is due: drops stop 11 s before it."""
    clock = FakeClock()
    index = RecordingIndex(InMemoryStore())
    moves = MarkerMoves(index, clock, window=timedelta(0), clock_skew=timedelta(seconds=10))
    last_useful = ORDER_WORKFLOW.shortest_budget - timedelta(seconds=11)
    for order_id, after in (("in-time", -0.01), ("late", 0.0)):
        running, finished = _finished(clock, order_id)
        moves.after_write(running, finished, clock.now() + last_useful + timedelta(seconds=after))
    assert index.drops == [[("in-time", 'W/"in-time"')], []]
    assert [[order_id for order_id, _, _ in sent] for sent in index.finishes] == [[], ["late"]]


def test_a_marker_gets_one_operation_per_transaction_whatever_waits_for_it():
    """A mark held for an order's marker while the order is purged and a new order under its
    id finishes in time on this Scheduler: only the new order's drop goes (two operations on
    one row would fail the whole transaction, and every other move in it)."""
    clock = FakeClock()
    index = RecordingIndex(InMemoryStore())
    moves = MarkerMoves(index, clock)
    index.calls.clear()
    moves.after_write(*_finished(clock, "other"), clock.now())  # starts the window
    old_running, old = _finished(clock, "o1")
    moves.after_write(old_running, old, clock.now() + ORDER_WORKFLOW.shortest_budget)  # held
    new_running, new = _finished(clock, "o1")
    new = replace(new, marker_etag='W/"new"', marker_touch="touch-new")
    clock.advance(0.5)
    moves.after_write(new_running, new, clock.now())  # in time: a drop, held too
    clock.advance(1)
    moves.send_waiting()
    assert index.drops[-1] == [("o1", 'W/"new"')] and index.finishes[-1] == []

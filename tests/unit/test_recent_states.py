"""Replies that come back to the process that claimed the step start from the state it wrote
(sas/services/recent.py): no read, the same decisions, never a refusal on a remembered state."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sas.domain.messages import StepRequest
from sas.domain.model import ProcessState
from sas.services.recent import RecentStates
from sas.services.scheduler import ReplyOutcome, Scheduler
from sas.services.submission import Submission
from tests.fakes import FakeClock, InMemoryStore, RecordingTransport
from tests.unit.test_services import ROUTES, submitted
from tests.unit.test_services import ok_reply as ok

pytestmark = pytest.mark.unit


class CountingStore(InMemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.state_reads = 0

    def get_state(self, order_id):
        self.state_reads += 1
        return super().get_state(order_id)


def requests(transport: RecordingTransport) -> list[StepRequest]:
    return [s.message for s in transport.sent if isinstance(s.message, StepRequest)]


@pytest.fixture
def one_process():
    store, transport, clock, recent = (
        CountingStore(),
        RecordingTransport(),
        FakeClock(),
        RecentStates(),
    )
    submission = Submission(store, transport, ROUTES, clock, recent=recent)
    scheduler = Scheduler(store, transport, ROUTES, clock, "s1", recent=recent)
    return store, transport, clock, recent, submission, scheduler


def test_an_order_whose_replies_come_back_here_is_never_read(one_process):
    store, transport, clock, recent, submission, scheduler = one_process
    submission.submit(submitted())
    for _ in range(3):
        clock.advance(1)
        assert scheduler.on_reply(ok(requests(transport)[-1])) in (
            ReplyOutcome.ADVANCED,
            ReplyOutcome.FINISHED,
        )
    assert store.get_state("o1").value.process_state is ProcessState.PROCESSED
    assert store.state_reads == 1  # the one above
    assert len(recent) == 0  # a finished order is forgotten


def test_a_reply_for_a_state_another_instance_moved_is_decided_on_a_fresh_read(one_process):
    store, transport, _, _, submission, scheduler = one_process
    submission.submit(submitted())
    first = requests(transport)[-1]
    # Another instance's Supervisor expired attempt 1 and another Scheduler claimed attempt 2.
    current = store.get_state("o1")
    retried = replace(current.value, attempt=2)
    store.update_state(retried, current.etag)
    second = first.model_copy(update={"attempt": 2})
    reads = store.state_reads
    # Remembered here: attempt 1. Never refused from memory: read, and applied.
    assert scheduler.on_reply(ok(second)) is ReplyOutcome.ADVANCED
    assert store.state_reads == reads + 1
    assert store.get_state("o1").value.step_index == 1
    assert scheduler.on_reply(ok(first)) is ReplyOutcome.STALE  # the late one changes nothing
    assert store.get_state("o1").value.step_index == 1


def test_a_remembered_state_that_went_stale_costs_a_failed_write_then_the_usual_path(one_process):
    store, transport, _, recent, submission, scheduler = one_process
    submission.submit(submitted())
    request = requests(transport)[-1]
    current = store.get_state("o1")
    store.update_state(replace(current.value, details=current.value.details), current.etag)
    assert scheduler.on_reply(ok(request)) is ReplyOutcome.ADVANCED
    assert store.get_state("o1").value.step_index == 1
    assert recent.get("o1").etag == store.get_state("o1").etag  # what it wrote last


def test_the_oldest_are_forgotten_past_the_capacity():
    recent, store, transport, clock = (
        RecentStates(capacity=2),
        InMemoryStore(),
        RecordingTransport(),
        FakeClock(),
    )
    submission = Submission(store, transport, ROUTES, clock, recent=recent)
    for order_id in ("a", "b", "c"):
        submission.submit(submitted(order_id=order_id))
    assert [recent.get(o) is not None for o in ("a", "b", "c")] == [False, True, True]
    with pytest.raises(ValueError, match="capacity"):
        RecentStates(capacity=0)


def test_a_reply_for_an_order_purged_since_this_process_wrote_it_is_parked(one_process):
    store, transport, _, recent, submission, scheduler = one_process
    submission.submit(submitted())
    request = requests(transport)[-1]
    del store.states["o1"]  # finished elsewhere, then purged by an operator
    assert scheduler.on_reply(ok(request)) is ReplyOutcome.UNKNOWN_ORDER
    assert recent.get("o1") is None
    assert len(store.parked) == 1

"""A submission delivered again, in memory: what it resends, what it leaves alone, and where it
leaves the order's in-flight marker. The submission decides these; that a redelivery writes
nothing and a conflicting one is refused on the real store's transaction (I5) is proved on
Azurite: tests/integration/test_scheduler_on_azurite.py."""

from __future__ import annotations

import pytest

from sas.domain.messages import StepReply
from sas.domain.wire import idempotency_key
from sas.services.submission import SubmissionOutcome
from sas.testing import FakeClock, InMemoryQueues, InMemoryStore, Instance, instance
from tests.unit.test_services import ROUTES, submitted
from tests.workflows import REGISTRY

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def on(
    store: InMemoryStore, transport: InMemoryQueues, clock: FakeClock, name: str = "instance-1"
) -> Instance:
    return instance(store, transport, ROUTES, clock, REGISTRY, name)


def test_a_redelivery_after_a_crash_before_the_send_sends_the_same_request() -> None:
    clock, store = FakeClock(), InMemoryStore()
    transport = InMemoryQueues(clock)
    on(store, InMemoryQueues(clock), clock).submit(submitted())  # its sends "lost"
    before = store.get_state("o1")
    assert on(store, transport, clock).submit(submitted()) is SubmissionOutcome.DUPLICATE
    assert store.get_state("o1") == before  # the same ETag: nothing was written
    [sent] = transport.sent
    assert before is not None
    key = idempotency_key("o1", before.value.incarnation, "reserve", "do")
    assert (sent.queue, sent.message_id) == ("agent-inventory", f"{key}:1")


def test_a_redelivery_once_the_first_step_moved_on_sends_nothing() -> None:
    clock, store = FakeClock(), InMemoryStore()
    transport = InMemoryQueues(clock)
    on(store, transport, clock).submit(submitted())
    first = store.get_state("o1")
    assert first is not None
    on(store, transport, clock, "s1").on_reply(
        StepReply(
            order_id="o1",
            step="reserve",
            step_index=0,
            attempt=1,
            outcome="ok",
            incarnation=first.value.incarnation,
        )
    )
    sent = len(transport.sent)
    assert on(store, transport, clock).submit(submitted()) is SubmissionOutcome.DUPLICATE
    assert len(transport.sent) == sent


def test_a_late_duplicate_leaves_the_marker_due_by_the_existing_deadline() -> None:
    """The duplicate's index touch (made before it knows it is one) would move the marker's
    due time past the order's deadline, hiding the order from the Supervisor's query."""
    clock, store = FakeClock(), InMemoryStore()
    submission = on(store, InMemoryQueues(clock), clock)
    submission.submit(submitted())
    clock.advance(10)
    assert submission.submit(submitted()) is SubmissionOutcome.DUPLICATE
    assert submission.submit(submitted(address="elsewhere")) is SubmissionOutcome.CONFLICT
    found = store.get_state("o1")
    assert found is not None and found.value.complete_by is not None
    (marker,) = store.list_live()
    assert marker.due_at <= found.value.complete_by

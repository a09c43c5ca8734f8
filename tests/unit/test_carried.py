"""The state a step request carries and its reply brings back (sas/domain/carried.py): a reply
taken by another process than the one that claimed the step starts from it, reads nothing on
the happy path, and is never refused or applied on its word alone."""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sas.domain import carried
from sas.domain.messages import (
    MAX_MESSAGE_BYTES,
    MAX_RESULT_BYTES,
    StepReply,
    StepRequest,
    decode,
    encode,
)
from sas.domain.model import OrderState, ProcessState
from sas.domain.wire import idempotency_key
from sas.domain.workflow import WORKFLOWS, workflow_named
from sas.services.agent import AgentRunner
from sas.services.recent import RecentStates
from sas.services.scheduler import ReplyOutcome, Scheduler
from sas.services.submission import Submission
from tests.fakes import FakeClock, RecordingTransport, ScriptedRemote
from tests.unit.test_recent_states import CountingStore, requests
from tests.unit.test_services import ROUTES, submitted

pytestmark = pytest.mark.unit

ZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)
TIMES = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=ZONES
)
TEXT = st.text(min_size=1, max_size=30)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)

STATES = st.builds(
    OrderState,
    order_id=st.just("o1"),
    workflow=st.sampled_from(sorted(WORKFLOWS)),
    process_state=st.sampled_from(ProcessState),
    submitted_at=TIMES,
    updated_at=TIMES,
    locked_by=st.none() | TEXT,
    complete_by=st.none() | TIMES,
    failure_count=st.integers(0, 50),
    attempt=st.integers(0, 99),
    step_index=st.integers(0, 99),
    mode=st.sampled_from(["do", "undo"]),
    reply_to=st.none() | TEXT,
    finished_at=st.none() | TIMES,
    last_error=st.none() | st.text(max_size=200),
    not_before=st.none() | TIMES,
    alert_pending=st.booleans(),
    alert_claimed_by=st.none() | TEXT,
    alert_claimed_until=st.none() | TIMES,
    status_events=st.sampled_from(["outcome", "steps"]),
    details=st.none() | st.dictionaries(st.text(max_size=10), JSON, max_size=4),
    priority=st.sampled_from(["high", "normal", "low"]),
    endpoint=st.none() | TEXT,
    deferrals=st.integers(0, 20),
    traceparent=st.none() | TEXT,
)


KEY = bytes(range(32))


def resigned(value: dict[str, Any], key: bytes = KEY) -> dict[str, Any]:
    """``value`` changed and signed again: what only a holder of the key can make."""
    unsigned = {name: value[name] for name in ("v", "etag", "state")}
    return {**unsigned, "sig": carried._signature(unsigned, key)}


@given(STATES)
def test_a_carried_state_comes_back_equal_with_every_time_in_utc(state):
    back = carried.carried_state(decode_json(carried.carry(state, 'W/"e1"', KEY)), "o1", KEY)
    assert back is not None
    assert back.value == state
    assert back.etag == 'W/"e1"'
    for field in fields(back.value):
        value = getattr(back.value, field.name)
        if isinstance(value, datetime):
            assert value.tzinfo is UTC  # as a read gives it


def decode_json(value):
    """Through a message and back, as a queue carries it."""
    reply = StepReply(
        order_id="o1", step="reserve", step_index=0, attempt=1, outcome="ok", carried_state=value
    )
    return decode(StepReply, encode(reply)).carried_state


WIDE = "\U0001f600"  # 4 bytes in UTF-8


def largest_order_state() -> OrderState:
    lines = [
        {"sku": "S" * 40, "quantity": 10_000, "unit_price_cents": 100_000_000} for _ in range(100)
    ]
    details = {
        "customer_id": "C" * 64,
        "currency": "EUR",
        "address": "\u00e9" * 200,
        "lines": lines,
    }
    now = datetime(2026, 11, 23, tzinfo=UTC)
    return OrderState(
        order_id="o" * 64,
        workflow="order",
        process_state=ProcessState.PROCESSING,
        submitted_at=now,
        updated_at=now,
        complete_by=now,
        locked_by="instance-" + "x" * 100,
        attempt=99,
        reply_to="status-" + "q" * 56,
        last_error=WIDE * 1000,
        details=details,
        traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        endpoint="e" * 40,
    )


def test_the_largest_order_is_carried_and_its_messages_fit():
    state = largest_order_state()
    value = carried.carry(state, "W/\"datetime'2026-11-23T00%3A00%3A00.1234567Z'\"", KEY)
    assert value is not None  # carried: within MAX_CARRIED_BYTES
    largest_result = {"r": "x" * (MAX_RESULT_BYTES - 10)}
    details = state.details
    assert details is not None
    undo = StepRequest(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=99,
        mode="undo",
        action="release",
        complete_by=state.updated_at,
        idempotency_key=idempotency_key("o1", "reserve", "undo"),
        payload={
            "order_id": "o1",
            **details,
            "original_action": "reserve",
            "original_key": idempotency_key("o1", "reserve", "do"),
            "original_result": largest_result,
        },
        carried_state=value,
    )
    reply = StepReply(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=99,
        outcome="error",
        result=largest_result,
        error=WIDE * 1000,
        carried_state=value,
    )
    for message in (undo, reply):
        assert len(encode(message)) < MAX_MESSAGE_BYTES
        assert decode(type(message), encode(message)).carried_state == value


def test_what_it_cannot_start_from_is_ignored():
    value = carried.carry(largest_order_state(), "W/1", KEY)
    assert value is not None
    oid = "o" * 64
    assert carried.carried_state(value, oid, KEY) is not None
    assert carried.carried_state(value, "another", KEY) is None
    assert carried.carried_state(resigned({**value, "v": 1}), oid, KEY) is None  # unsigned era
    assert carried.carried_state(resigned({**value, "etag": ""}), oid, KEY) is None
    assert carried.carried_state(resigned({**value, "state": {"order_id": oid}}), oid, KEY) is None
    naive = {**value, "state": {**value["state"], "updated_at": "2026-11-23T00:00:00"}}
    assert carried.carried_state(resigned(naive), oid, KEY) is None
    unknown = {**value, "state": {**value["state"], "workflow": "nosuchflow"}}
    assert carried.carried_state(resigned(unknown), oid, KEY) is None
    assert carried.carried_state(None, "o1", KEY) is None
    assert carried.carried_state({}, "o1", KEY) is None
    assert carried.carried_state(resigned({**value, "state": "text"}), oid, KEY) is None


def test_only_what_the_key_signed_is_believed():
    value = carried.carry(largest_order_state(), "W/1", KEY)
    assert value is not None
    oid = "o" * 64
    rewritten = {**value, "state": {**value["state"], "reply_to": "someone-elses-queue"}}
    assert carried.carried_state(rewritten, oid, KEY) is None  # changed after signing
    assert carried.carried_state(value, oid, bytes(32)) is None  # another deployment's key
    assert carried.carried_state({**value, "sig": ""}, oid, KEY) is None
    assert carried.carried_state({**value, "sig": "\u00e9" * 64}, oid, KEY) is None  # no raise
    assert carried.carried_state({**value, "sig": value["sig"].upper()}, oid, KEY) is None
    assert carried.carried_state({k: v for k, v in value.items() if k != "sig"}, oid, KEY) is None
    assert carried.carried_state({**value, "etag": "W/2"}, oid, KEY) is None
    # The order of the keys is not part of what is signed: a decoder may reorder them.
    reordered = dict(reversed(list(value.items())))
    assert carried.carried_state(reordered, oid, KEY) is not None


def test_an_oversize_carried_state_is_dropped_and_the_message_stands():
    huge = {"v": 1, "etag": "W/1", "state": {"pad": "x" * carried.MAX_CARRIED_BYTES}}
    reply = StepReply(
        order_id="o1", step="reserve", step_index=0, attempt=1, outcome="ok", carried_state=huge
    )
    assert reply.carried_state is None
    too_long = replace(largest_order_state(), last_error="x" * 20_000)
    assert carried.carry(too_long, "W/1", KEY) is None


# --- the Scheduler: two processes, each with its own memory --------------------------------


@pytest.fixture
def two_processes():
    store, transport, clock = CountingStore(), RecordingTransport(), FakeClock()
    submission = Submission(store, transport, ROUTES, clock, recent=RecentStates())
    scheduler = Scheduler(store, transport, ROUTES, clock, "s2", recent=RecentStates())
    return store, transport, clock, submission, scheduler


def agent_reply(request: StepRequest) -> StepReply:
    """What the agent (``AgentRunner``) sends for ``request`` when the remote succeeds, as it
    comes off the wire."""
    transport, clock = RecordingTransport(), FakeClock()
    agent = workflow_named("order").step(request.step_index).agent
    remote = ScriptedRemote([{"ref": request.step}])
    AgentRunner(agent, remote, transport, ROUTES, clock, sleep=clock.sleep).handle(request)
    (sent,) = transport.sent
    assert isinstance(sent.message, StepReply)
    return decode(StepReply, encode(sent.message))


def test_replies_taken_by_another_process_read_nothing(two_processes):
    store, transport, clock, submission, scheduler = two_processes
    submission.submit(submitted())
    for _ in range(3):
        clock.advance(1)
        request = requests(transport)[-1]
        assert request.carried_state is not None
        assert scheduler.on_reply(agent_reply(request)) in (
            ReplyOutcome.ADVANCED,
            ReplyOutcome.FINISHED,
        )
        # The scheduler takes the next reply as a process that never saw this order.
        scheduler._recent.clear()
    assert store.state_reads == 0
    found = store.get_state("o1")
    assert found is not None
    assert found.value.process_state is ProcessState.PROCESSED


def test_a_carried_state_that_went_stale_costs_a_failed_write_then_a_read(two_processes):
    store, transport, _, submission, scheduler = two_processes
    submission.submit(submitted())
    request = requests(transport)[-1]
    current = store.get_state("o1")
    assert current is not None
    store.update_state(current.value, current.etag)  # someone wrote it since: a new ETag
    reads = store.state_reads
    assert scheduler.on_reply(agent_reply(request)) is ReplyOutcome.ADVANCED
    assert store.state_reads == reads + 1
    found = store.get_state("o1")
    assert found is not None
    assert found.value.step_index == 1


def test_a_reply_is_never_refused_on_a_carried_state(two_processes):
    """A carried state is what the row held at the claim: a fence that would drop the reply
    on it is decided again on a read."""
    store, transport, _, submission, scheduler = two_processes
    submission.submit(submitted())
    request = requests(transport)[-1]
    key = store.carry_key()
    stale = carried.carried_state(request.carried_state, "o1", key)
    assert stale is not None
    # A mixed-up carried state that says the order is at its last step (the reply is for its
    # first).
    forged = carried.carry(replace(stale.value, step_index=2), stale.etag, key)
    reads = store.state_reads
    reply = agent_reply(request).model_copy(update={"carried_state": forged})
    assert scheduler.on_reply(reply) is ReplyOutcome.ADVANCED
    assert store.state_reads == reads + 1


def test_a_forged_carried_state_under_the_real_etag_changes_nothing(two_processes):
    """Whoever reads an agent's queue sees the current ETag. A reply for the last step whose
    carried state says the order is there, with another address and status queue, is not
    signed with the store's key: the Scheduler reads, and the fence refuses the reply."""
    store, transport, _, submission, scheduler = two_processes
    submission.submit(submitted())
    request = requests(transport)[-1]
    seen = request.carried_state
    assert seen is not None
    state = dict(seen["state"], step_index=2, reply_to="evil-q")
    state["details"] = dict(state["details"], address="attacker")
    forged_state = {**seen, "state": state}
    forged_state["sig"] = carried._signature(
        {k: forged_state[k] for k in ("v", "etag", "state")}, bytes(32)
    )
    reply = agent_reply(request).model_copy(
        update={"step": "ship", "step_index": 2, "carried_state": forged_state}
    )
    before = store.get_state("o1")
    reads = store.state_reads
    assert scheduler.on_reply(reply) is ReplyOutcome.STALE
    assert store.state_reads == reads + 1
    assert store.get_state("o1") == before  # nothing written


def test_a_carried_state_of_another_order_is_read_instead(two_processes):
    store, transport, _, submission, scheduler = two_processes
    submission.submit(submitted())
    submission.submit(submitted(order_id="o2"))
    first, second = requests(transport)[-2:]
    reads = store.state_reads
    reply = agent_reply(first).model_copy(update={"carried_state": second.carried_state})
    assert scheduler.on_reply(reply) is ReplyOutcome.ADVANCED
    assert store.state_reads == reads + 1
    found = store.get_state("o1")
    assert found is not None
    assert found.value.step_index == 1

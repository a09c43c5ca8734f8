from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import pytest

from sas.domain.messages import StepReply, StepRequest, decode, encode
from sas.services.agent import AgentOutcome
from sas.services.context import Routes
from sas.testing import (
    FakeClock,
    InMemoryQueues,
    InMemoryRemote,
    InMemoryStore,
    Outcome,
    fault,
    instance,
    ok,
    refuse,
    too_slow,
)
from tests.workflows import REGISTRY

pytestmark = [pytest.mark.unit, pytest.mark.fast]

ROUTES = Routes("orders", "scheduler", "replies", "alerts", {"payment": "agent-payment"})


def request(clock: FakeClock, budget_seconds: float = 30) -> StepRequest:
    return StepRequest(
        order_id="o1",
        step="charge",
        step_index=1,
        attempt=4,
        action="charge",
        complete_by=clock.now() + timedelta(seconds=budget_seconds),
        idempotency_key="o1:charge",
        payload={"order_id": "o1"},
    )


def runner(
    remote: InMemoryRemote, transport: InMemoryQueues, clock: FakeClock, **options: Any
) -> Callable[[StepRequest], AgentOutcome]:
    """The payment agent, as its queue function calls it, of an instance that runs nothing else
    (agents keep no state in the store), calling ``remote`` (``options``: ``Agents``' fields)."""
    app = instance(InMemoryStore(), transport, ROUTES, clock, REGISTRY, "agent-payment")
    return partial(app.with_remote(remote, sleep=clock.sleep, **options).run_step, "payment")


def scripted(clock: FakeClock, *outcomes: Outcome) -> InMemoryRemote:
    """The remote, its payment service's charge answering ``outcomes`` in order."""
    remote = InMemoryRemote(clock)
    remote.script("payment", "charge", *outcomes)
    return remote


def test_success_replies_for_the_same_attempt_with_the_result():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, ok({"effect_id": "e1"}))
    assert runner(remote, transport, clock)(request(clock)) is AgentOutcome.REPLIED
    (sent,) = transport.sent
    reply = sent.message
    assert isinstance(reply, StepReply)
    assert (sent.queue, reply.attempt, reply.step_index, reply.outcome) == ("replies", 4, 1, "ok")
    assert reply.result == {"effect_id": "e1"}
    assert sent.message_id == "o1:charge:4:reply"
    assert remote.calls[0].key == "o1:charge"


def test_transient_faults_are_retried_with_the_same_idempotency_key():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, fault("503"), fault("timeout"), ok({"effect_id": "e"}))
    assert runner(remote, transport, clock)(request(clock)) is AgentOutcome.REPLIED
    assert len(remote.calls) == 3
    assert {call.key for call in remote.calls} == {"o1:charge"}


def test_retry_after_is_honoured():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    start = clock.now()
    remote = scripted(clock, fault("429", retry_after=7), ok({"effect_id": "e"}))
    assert runner(remote, transport, clock)(request(clock)) is AgentOutcome.REPLIED
    assert clock.now() - start >= timedelta(seconds=7)


def test_call_timeout_never_exceeds_the_time_left():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, ok({"effect_id": "e"}))
    runner(remote, transport, clock)(request(clock, budget_seconds=2))
    timeout = remote.calls[0].timeout
    assert timeout is not None and 0 < timeout <= 2


def test_transient_faults_outlasting_the_deadline_send_nothing():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, *[fault("503")] * 1000)
    assert runner(remote, transport, clock)(request(clock, 5)) is AgentOutcome.GAVE_UP
    assert transport.sent == []
    assert clock.now() < request(FakeClock(clock.now()), 0).complete_by + timedelta(seconds=5)


def test_a_permanent_fault_sends_an_error_reply():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, refuse("HTTP 402 card declined"))
    assert runner(remote, transport, clock)(request(clock)) is AgentOutcome.REFUSED
    (sent,) = transport.sent
    assert isinstance(sent.message, StepReply)
    assert sent.message.outcome == "error"
    assert sent.message.error is not None
    assert "card declined" in sent.message.error
    assert len(remote.calls) == 1


def test_a_request_already_past_complete_by_is_dropped_without_calling_the_remote():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = InMemoryRemote(clock)
    stale = request(clock, budget_seconds=1)
    clock.advance(2)
    assert runner(remote, transport, clock)(stale) is AgentOutcome.EXPIRED
    assert remote.calls == [] and transport.sent == []


def test_a_call_that_returns_after_complete_by_sends_nothing():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, too_slow(40, {"effect_id": "e"}))
    assert runner(remote, transport, clock)(request(clock)) is AgentOutcome.LATE
    assert transport.sent == []


@pytest.mark.parametrize("hint", [float("inf"), 1e12])
def test_an_absurd_retry_after_gives_up_cleanly_instead_of_crashing(hint):
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, *[fault("429", retry_after=hint)] * 5)
    assert runner(remote, transport, clock)(request(clock)) is AgentOutcome.GAVE_UP
    assert transport.sent == []


def test_a_huge_remote_result_is_truncated_before_it_travels():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, ok({"blob": "x" * 100_000}))
    assert runner(remote, transport, clock)(request(clock)) is AgentOutcome.REPLIED
    (sent,) = transport.sent
    assert isinstance(sent.message, StepReply)
    assert sent.message.result == {"truncated": True, "reason": "100011 bytes > 8192"}


@pytest.mark.parametrize(
    "answer",
    [
        {"reservation": [[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]},
        {"reservation": "a\ud800b"},
    ],
    ids=["nested", "lone-surrogate"],
)
def test_a_remote_result_no_reply_could_carry_is_replaced_by_a_stand_in(answer):
    """Found by a hostile review: the reply failed to encode (or to parse on arrival), the
    exception escaped the agent and the message was retried into the poison queue."""
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, ok(answer))
    assert runner(remote, transport, clock)(request(clock)) is AgentOutcome.REPLIED
    (sent,) = transport.sent
    assert isinstance(sent.message, StepReply) and sent.message.result["truncated"] is True
    assert decode(StepReply, encode(sent.message)) == sent.message


def test_a_refusal_reason_with_a_lone_surrogate_is_still_sent():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    remote = scripted(clock, refuse("declined \ud800"))
    assert runner(remote, transport, clock)(request(clock)) is AgentOutcome.REFUSED
    (sent,) = transport.sent
    assert isinstance(sent.message, StepReply) and sent.message.error == "declined ?"


def test_a_deadline_far_in_the_future_is_capped_at_the_longest_step_budget():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    started = clock.now()
    far = request(clock).model_copy(update={"complete_by": started + timedelta(days=365 * 900)})
    remote = scripted(clock, *[fault("503")] * 10_000)
    assert runner(remote, transport, clock)(far) is AgentOutcome.GAVE_UP
    assert clock.now() - started <= REGISTRY.longest_step_budget

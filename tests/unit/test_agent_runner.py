from datetime import timedelta

import pytest

from sas.domain.errors import PermanentRemoteError, TransientRemoteError
from sas.domain.messages import StepReply, StepRequest, decode, encode
from sas.services.agent import AgentOutcome
from sas.services.context import Routes
from tests.fakes import FakeClock, RecordingTransport, ScriptedRemote
from tests.instances import TEST_WORKFLOWS, AgentOf, agent_runner

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


def runner(remote: ScriptedRemote, transport: RecordingTransport, clock: FakeClock) -> AgentOf:
    return agent_runner("payment", remote, transport, ROUTES, clock, sleep=clock.sleep)


def test_success_replies_for_the_same_attempt_with_the_result():
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote([{"effect_id": "e1"}])
    assert runner(remote, transport, clock).handle(request(clock)) is AgentOutcome.REPLIED
    (sent,) = transport.sent
    reply = sent.message
    assert isinstance(reply, StepReply)
    assert (sent.queue, reply.attempt, reply.step_index, reply.outcome) == ("replies", 4, 1, "ok")
    assert reply.result == {"effect_id": "e1"}
    assert sent.message_id == "o1:charge:4:reply"
    assert remote.calls[0]["key"] == "o1:charge"


def test_transient_faults_are_retried_with_the_same_idempotency_key():
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote(
        [TransientRemoteError("503"), TransientRemoteError("timeout"), {"effect_id": "e"}]
    )
    assert runner(remote, transport, clock).handle(request(clock)) is AgentOutcome.REPLIED
    assert len(remote.calls) == 3
    assert {call["key"] for call in remote.calls} == {"o1:charge"}


def test_retry_after_is_honoured():
    clock, transport = FakeClock(), RecordingTransport()
    start = clock.now()
    remote = ScriptedRemote([TransientRemoteError("429", retry_after=7), {"effect_id": "e"}])
    assert runner(remote, transport, clock).handle(request(clock)) is AgentOutcome.REPLIED
    assert clock.now() - start >= timedelta(seconds=7)


def test_call_timeout_never_exceeds_the_time_left():
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote([{"effect_id": "e"}])
    runner(remote, transport, clock).handle(request(clock, budget_seconds=2))
    assert 0 < remote.calls[0]["timeout"] <= 2


def test_transient_faults_outlasting_the_deadline_send_nothing():
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote([TransientRemoteError("503")] * 1000)
    assert runner(remote, transport, clock).handle(request(clock, 5)) is AgentOutcome.GAVE_UP
    assert transport.sent == []
    assert clock.now() < request(FakeClock(clock.now()), 0).complete_by + timedelta(seconds=5)


def test_a_permanent_fault_sends_an_error_reply():
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote([PermanentRemoteError("HTTP 402 card declined")])
    assert runner(remote, transport, clock).handle(request(clock)) is AgentOutcome.REFUSED
    (sent,) = transport.sent
    assert isinstance(sent.message, StepReply)
    assert sent.message.outcome == "error"
    assert sent.message.error is not None
    assert "card declined" in sent.message.error
    assert len(remote.calls) == 1


def test_a_request_already_past_complete_by_is_dropped_without_calling_the_remote():
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote()
    stale = request(clock, budget_seconds=1)
    clock.advance(2)
    assert runner(remote, transport, clock).handle(stale) is AgentOutcome.EXPIRED
    assert remote.calls == [] and transport.sent == []


def test_a_call_that_returns_after_complete_by_sends_nothing():
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote([{"effect_id": "e"}], clock=clock, call_seconds=40)
    assert runner(remote, transport, clock).handle(request(clock)) is AgentOutcome.LATE
    assert transport.sent == []


@pytest.mark.parametrize("hint", [float("inf"), 1e12])
def test_an_absurd_retry_after_gives_up_cleanly_instead_of_crashing(hint):
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote([TransientRemoteError("429", retry_after=hint)] * 5)
    assert runner(remote, transport, clock).handle(request(clock)) is AgentOutcome.GAVE_UP
    assert transport.sent == []


def test_a_huge_remote_result_is_truncated_before_it_travels():
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote([{"blob": "x" * 100_000}])
    assert runner(remote, transport, clock).handle(request(clock)) is AgentOutcome.REPLIED
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
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote([answer])
    assert runner(remote, transport, clock).handle(request(clock)) is AgentOutcome.REPLIED
    (sent,) = transport.sent
    assert isinstance(sent.message, StepReply) and sent.message.result["truncated"] is True
    assert decode(StepReply, encode(sent.message)) == sent.message


def test_a_refusal_reason_with_a_lone_surrogate_is_still_sent():
    clock, transport = FakeClock(), RecordingTransport()
    remote = ScriptedRemote([PermanentRemoteError("declined \ud800")])
    assert runner(remote, transport, clock).handle(request(clock)) is AgentOutcome.REFUSED
    (sent,) = transport.sent
    assert isinstance(sent.message, StepReply) and sent.message.error == "declined ?"


def test_a_deadline_far_in_the_future_is_capped_at_the_longest_step_budget():
    clock, transport = FakeClock(), RecordingTransport()
    started = clock.now()
    far = request(clock).model_copy(update={"complete_by": started + timedelta(days=365 * 900)})
    remote = ScriptedRemote([TransientRemoteError("503")] * 10_000)
    assert runner(remote, transport, clock).handle(far) is AgentOutcome.GAVE_UP
    assert clock.now() - started <= TEST_WORKFLOWS.longest_step_budget

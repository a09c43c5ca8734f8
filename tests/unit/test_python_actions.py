"""Agent actions written as the app's Python functions run under the same guarantees as a
remote call: the step's idempotency key, deadline and time left, retries with backoff, the
shared breaker, refusals, late results dropped (sas/services/actions.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sas.actions import ActionContext, PythonAgent, Refused, Transient
from sas.domain.breaker import BreakerPolicy
from sas.domain.endpoints import Endpoint
from sas.domain.messages import StepReply, StepRequest
from sas.domain.workflow import Registry, StepDefinition, Workflow
from sas.services.agent import AgentOutcome
from sas.services.breaker import CircuitBreaker
from sas.services.routing import Router
from sas.testing import FakeClock, InMemoryQueues, InMemoryRemote
from tests.unit.test_agent_runner import request
from tests.unit.test_agent_runner import runner as payment_agent
from tests.unit.test_breaker import FakeBreakerStore

pytestmark = [pytest.mark.unit, pytest.mark.fast]


class Payments:
    """A payment provider inside the app: each effect applied once per idempotency key."""

    def __init__(self, clock: FakeClock, script: list[Any] | None = None) -> None:
        self.clock = clock
        self.script = list(script or [])
        self.seen: list[ActionContext] = []
        self.data: list[dict[str, Any]] = []
        self.effects: dict[str, str] = {}

    def charge(self, context: ActionContext, data: dict[str, Any]) -> dict[str, Any] | None:
        self.seen.append(context)
        self.data.append(data)
        step = self.script.pop(0) if self.script else None
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, (int, float)):
            self.clock.advance(step)  # the action took this long
        effect = self.effects.setdefault(context.idempotency_key, f"e{len(self.effects) + 1}")
        return {"effect_id": effect}

    def agent(self) -> PythonAgent:
        return PythonAgent("payment", {"charge": self.charge})


Agent = Callable[[StepRequest], AgentOutcome]


def runner(payments: Payments, transport: InMemoryQueues, **options: Any) -> Agent:
    return python_runner(payments.agent(), transport, payments.clock, **options)


def python_runner(
    agent: PythonAgent, transport: InMemoryQueues, clock: FakeClock, **options: Any
) -> Agent:
    """The payment agent as ``agent``'s functions; its remote is never called."""
    return payment_agent(
        InMemoryRemote(clock), transport, clock, python={agent.name: agent}, **options
    )


def reply_of(transport: InMemoryQueues) -> StepReply:
    (sent,) = transport.sent
    assert isinstance(sent.message, StepReply)
    return sent.message


def test_the_action_is_told_the_step_and_its_result_is_the_reply():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    payments = Payments(clock)
    outcome = runner(payments, transport)(request(clock, budget_seconds=10))
    assert outcome is AgentOutcome.REPLIED
    assert reply_of(transport).result == {"effect_id": "e1"}
    (context,) = payments.seen
    assert (context.order_id, context.step, context.action, context.mode, context.attempt) == (
        "o1",
        "charge",
        "charge",
        "do",
        4,
    )
    assert context.idempotency_key == "o1:charge"
    assert 9 < context.time_left() < 10  # the deadline, less the agent's safety margin
    assert payments.data == [{"order_id": "o1"}]


def test_transient_faults_and_unexpected_exceptions_are_retried_under_the_same_key():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    payments = Payments(clock, [Transient("busy", retry_after=3), KeyError("bug"), None])
    start = clock.now()
    assert runner(payments, transport)(request(clock)) is AgentOutcome.REPLIED
    assert [c.idempotency_key for c in payments.seen] == ["o1:charge"] * 3
    assert clock.now() - start >= timedelta(seconds=3)  # the action's hint was honoured
    assert payments.effects == {"o1:charge": "e1"}


def test_a_refusal_is_an_error_reply_with_its_reason():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    payments = Payments(clock, [Refused("card declined")])
    assert runner(payments, transport)(request(clock)) is AgentOutcome.REFUSED
    reply = reply_of(transport)
    assert (reply.outcome, reply.error) == ("error", "card declined")
    assert len(payments.seen) == 1


def test_faults_outlasting_the_deadline_send_nothing():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    payments = Payments(clock, [Transient("down")] * 1000)
    assert runner(payments, transport)(request(clock, 5)) is AgentOutcome.GAVE_UP
    assert transport.sent == []


def test_an_action_that_returns_after_the_deadline_sends_no_reply():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    payments = Payments(clock, [10])  # takes 10 s of a 5 s budget
    assert runner(payments, transport)(request(clock, 5)) is AgentOutcome.LATE
    assert transport.sent == []


def test_a_result_that_is_not_a_dict_is_retried_and_none_is_an_empty_result():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    answers = iter(["not a dict", None])
    agent = PythonAgent("payment", {"charge": lambda context, data: next(answers)})
    run = python_runner(agent, transport, clock)
    assert run(request(clock)) is AgentOutcome.REPLIED
    assert reply_of(transport).result == {}


def test_the_shared_breaker_guards_a_python_agent_too():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    policy = BreakerPolicy(minimum_calls=2, open_for=timedelta(seconds=60))
    breaker = CircuitBreaker(FakeBreakerStore(), clock, "payment", policy, cache_ttl=0)
    payments = Payments(clock, [Transient("down")] * 1000)
    outcome = runner(payments, transport, breaker=lambda target: breaker)(request(clock, 20))
    assert outcome is AgentOutcome.GAVE_UP
    assert len(payments.seen) == 2  # then the open breaker refused every try, not the action
    assert breaker.last_status() == "open"


def test_a_fault_the_order_owns_is_retried_but_counts_as_the_service_answering():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    store = FakeBreakerStore()
    policy = BreakerPolicy(minimum_calls=2, open_for=timedelta(seconds=60))
    breaker = CircuitBreaker(store, clock, "payment", policy, cache_ttl=0)
    bounced = Transient("address bounced", order_scoped=True)
    payments = Payments(clock, [bounced] * 1000)
    outcome = runner(payments, transport, breaker=lambda target: breaker)(request(clock, 20))
    assert outcome is AgentOutcome.GAVE_UP  # retried to the deadline, as any transient fault
    assert len(payments.seen) > 2  # the breaker never refused a try
    assert breaker.last_status() == "closed"
    breaker.record_failure()  # the service's own fault: written with the calls counted so far
    assert (store.state().calls, store.state().failures) == (len(payments.seen) + 1, 1)


def test_a_result_too_large_is_the_order_s_fault_not_the_service_s():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    store = FakeBreakerStore()
    breaker = CircuitBreaker(store, clock, "payment", BreakerPolicy(minimum_calls=1))
    agent = PythonAgent("payment", {"charge": lambda context, data: {"x": "y" * 9000}})
    run = python_runner(agent, transport, clock, breaker=lambda target: breaker)
    assert run(request(clock, 3)) is AgentOutcome.GAVE_UP
    assert breaker.last_status() == "closed" and store.writes == 0


def test_a_python_agent_runs_beside_the_router_of_the_http_agents():
    """Capacity-aware routing is for HTTP agents' endpoints: a Python agent has none, and its
    steps run while a router (some HTTP agent declares endpoints) is in place."""
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    west = Endpoint("inventory", "west", "http://west", capacity=2)
    north = Endpoint("inventory", "north", "http://north", capacity=2)
    router = Router({"inventory": (west, north)}, clock, "me", healthy=lambda e: True)
    payments = Payments(clock)
    outcome = runner(payments, transport, router=router)(request(clock))
    assert outcome is AgentOutcome.REPLIED
    assert reply_of(transport).result == {"effect_id": "e1"}


def test_an_action_reads_its_own_settings_and_no_other():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    seen: list[str] = []

    def charge(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
        seen.append(context.setting("PAY_URL"))
        return {"other": context.setting("SHIP_URL")}  # another agent's: a failed call

    agent = PythonAgent("payment", {"charge": charge}, settings={"PAY_URL": "local"})
    values = {"PAY_URL": "https://pay.example", "SHIP_URL": "https://ship.example"}
    run = python_runner(agent, transport, clock, settings=values)
    assert run(request(clock, 3)) is AgentOutcome.GAVE_UP
    assert seen and set(seen) == {"https://pay.example"}
    assert transport.sent == []


def test_a_registry_checks_its_python_agents_against_the_steps():
    charge = StepDefinition("charge", "payment", "charge", timedelta(seconds=5), undo="refund")
    workflow = Workflow("pay", (charge,))
    noop = {"charge": lambda context, data: None}
    with pytest.raises(ValueError, match="agent 'payment' has no action 'refund'"):
        Registry((workflow,), python_agents=(PythonAgent("payment", noop),))
    with pytest.raises(ValueError, match="Python agent 'billing': no step names it"):
        Registry((workflow,), python_agents=(PythonAgent("billing", noop),))
    with pytest.raises(ValueError, match="not a function"):
        PythonAgent("payment", {"charge": "charge"})  # type: ignore[dict-item]
    both = {**noop, "refund": noop["charge"]}
    registry = Registry((workflow,), python_agents=(PythonAgent("payment", both),))
    assert (registry.agents, registry.http_agents) == (("payment",), ())


def test_an_undo_is_told_its_mode_and_gets_the_original_result():
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    seen: list[tuple[ActionContext, dict[str, Any]]] = []

    def refund(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
        seen.append((context, data))
        return {"refunded": data["original_result"]["effect_id"]}

    agent = PythonAgent("payment", {"refund": refund})
    undo = StepRequest(
        **{
            **request(clock).model_dump(exclude={"trace"}),
            "mode": "undo",
            "action": "refund",
            "idempotency_key": "o1:charge:undo",
            "payload": {"order_id": "o1", "original_result": {"effect_id": "e1"}},
        }
    )
    run = python_runner(agent, transport, clock)
    assert run(undo) is AgentOutcome.REPLIED
    ((context, _),) = seen
    assert (context.mode, context.idempotency_key) == ("undo", "o1:charge:undo")
    assert reply_of(transport).result == {"refunded": "e1"}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({404: "found", "nested": {1: True}}, {"404": "found", "nested": {"1": True}}),
        ({"ok": (1, 2)}, {"ok": [1, 2]}),
    ],
)
def test_a_result_is_the_json_a_reply_carries(answer, expected):
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    agent = PythonAgent("payment", {"charge": lambda context, data: answer})
    run = python_runner(agent, transport, clock)
    assert run(request(clock)) is AgentOutcome.REPLIED
    assert reply_of(transport).result == expected


@pytest.mark.parametrize(
    "answer",
    [{"at": object()}, {"n": float("nan")}, {"big": "x" * 9000}, {1.5: {"set": {1}}}],
    ids=["not json", "nan", "over 8 KiB", "set"],
)
def test_a_result_no_reply_can_carry_fails_the_call_and_is_never_replaced(answer, caplog):
    clock = FakeClock()
    transport = InMemoryQueues(clock)
    agent = PythonAgent("payment", {"charge": lambda context, data: answer})
    run = python_runner(agent, transport, clock)
    assert run(request(clock, 5)) is AgentOutcome.GAVE_UP  # retried, never completed
    assert transport.sent == []
    assert "sas.action_failed" in caplog.text


def test_an_action_failure_is_logged_with_where_never_with_the_data(caplog):
    clock = FakeClock()
    transport = InMemoryQueues(clock)

    def leaky(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
        raise ValueError(f"cannot use {data}")

    agent = PythonAgent("payment", {"charge": leaky})
    run = python_runner(agent, transport, clock)
    secret = request(clock, 5).model_copy(update={"payload": {"card": "4111-SECRET"}})
    run(secret)
    assert "sas.action_failed action=payment.charge error=ValueError at=" in caplog.text
    assert "test_python_actions.py" in caplog.text
    assert "SECRET" not in caplog.text

"""Routing an agent's calls to remote endpoints by health and capacity, in memory with messages
played by hand: away from an open circuit, away from a full endpoint, deferred when no endpoint
has room (no failure counted), failed over within an attempt, and never an effect applied twice
when a retry changes endpoint. The load other processes publish through the table is checked
on Azurite (tests/integration/test_routing.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from sas.domain.endpoints import Endpoint, single_endpoint
from sas.domain.errors import TransientRemoteError
from sas.domain.messages import OrderSubmitted, StepReply, StepRequest
from sas.domain.model import ProcessState
from sas.domain.transitions import DEFERRAL
from sas.services.agent import AgentOutcome
from sas.services.routing import Router
from sas.services.scheduler import ReplyOutcome
from sas.testing import FakeClock, InMemoryLoads, InMemoryRemote, InMemoryStore, instance
from tests.harness import World
from tests.workflows import REGISTRY, basket

pytestmark = [pytest.mark.unit, pytest.mark.fast]

WEST = Endpoint("payment", "west", "http://west.invalid/payment", capacity=2)
NORTH = Endpoint("payment", "north", "http://north.invalid/payment", capacity=2)
ENDPOINTS = {
    "inventory": (single_endpoint("inventory", "http://inventory.invalid"),),
    "payment": (WEST, NORTH),
    "shipping": (single_endpoint("shipping", "http://shipping.invalid"),),
}


@dataclass
class Regions(InMemoryRemote):
    """Regional endpoints of one provider: one idempotency ledger (the provider's effects, by
    key, whichever endpoint applied them), calls recorded per endpoint."""

    endpoint_calls: list[str] = field(default_factory=list)
    down: set[str] = field(default_factory=set)
    """Endpoints that answer 503 (nothing applied)."""

    def perform(self, agent: str, action: str, **kwargs: Any) -> dict[str, Any]:
        service, _, endpoint = agent.partition("@")
        self.endpoint_calls.append(endpoint or "primary")
        if endpoint in self.down:
            raise TransientRemoteError(f"{agent}: HTTP 503")
        return super().perform(service, action, **kwargs)


class Health:
    def __init__(self) -> None:
        self.down: set[str] = set()

    def __call__(self, endpoint: Endpoint) -> bool:
        return endpoint.name not in self.down


@pytest.fixture
def health() -> Health:
    return Health()


@pytest.fixture
def world(health) -> World:
    def router(clock: FakeClock) -> Router:
        return Router(ENDPOINTS, clock, "this-process", healthy=health, loads=InMemoryLoads())

    return World(router=router, remote=Regions)


def order(order_id: str) -> OrderSubmitted:
    return OrderSubmitted(
        order_id=order_id,
        details=basket(address="1 Route Road", sku="s1"),
    )


def to_payment(world: World, order_id: str) -> StepRequest:
    """Submit and run the order until its payment request is queued; return that request."""
    world.submit(order(order_id))
    world.deliver("agent-inventory")
    world.deliver("replies")
    (request,) = [m for m in world.bus.take("agent-payment") if isinstance(m, StepRequest)]
    return request


def endpoint_history(world: World, order_id: str) -> list[tuple[str, str | None, str | None]]:
    return [(e.kind, e.step, e.endpoint) for e in world.store.get_history(order_id)]


def test_a_step_goes_to_the_first_healthy_endpoint_with_room_and_says_so(world):
    request = to_payment(world, "r1")
    world.app.run_step("payment", request)
    world.run()
    assert world.state("r1").process_state is ProcessState.PROCESSED
    assert world.remote.endpoint_calls.count("west") == 1  # both empty: the first declared
    assert ("completed", "charge", "west") in endpoint_history(world, "r1")


def test_a_step_is_routed_away_from_an_open_circuit(world, health):
    health.down.add("west")
    world.app.run_step("payment", to_payment(world, "r2"))
    assert world.remote.endpoint_calls[-1] == "north"


def test_a_step_is_routed_away_from_a_full_endpoint(world):
    router = world.router
    assert router is not None
    held = [router.acquire("payment", avoid="north") for _ in range(2)]  # west is full
    assert [e.name for e in held if e] == ["west", "west"]
    world.app.run_step("payment", to_payment(world, "r3"))
    assert world.remote.endpoint_calls[-1] == "north"


def test_a_step_is_deferred_when_no_endpoint_has_room_and_no_failure_is_counted(world):
    request = to_payment(world, "r6")
    router = world.router
    assert router is not None
    held = [router.acquire("payment") for _ in range(4)]  # west and north both full
    assert world.app.run_step("payment", request) is AgentOutcome.DEFERRED
    assert world.remote.endpoint_calls.count("west") == 0  # nothing called
    (reply,) = world.bus.to("replies")[-1:]
    assert isinstance(reply, StepReply)
    assert reply.outcome == "deferred"
    world.deliver("replies")
    state = world.state("r6")
    assert state.process_state is ProcessState.PENDING
    assert (state.step_index, state.failure_count, state.deferrals) == (1, 0, 1)
    assert state.not_before == state.updated_at + timedelta(seconds=1)  # the first backoff
    for endpoint in held:
        assert endpoint is not None
        router.release(endpoint)
    world.clock.advance(2)
    world.run()
    assert world.state("r6").process_state is ProcessState.PROCESSED
    assert world.state("r6").failure_count == 0


def test_a_retry_on_another_endpoint_never_applies_the_effect_twice(world, health):
    request = to_payment(world, "r8")
    world.app.run_step("payment", request)  # west applies the charge...
    world.drop("replies")  # ...and its reply is lost
    health.down.add("west")  # then west's circuit opens
    world.clock.advance(20)
    world.make_due("r8")
    world.tick()
    world.clock.advance(3)
    world.run()
    state = world.state("r8")
    assert state.process_state is ProcessState.PROCESSED
    assert world.remote.endpoint_calls == ["primary", "west", "north", "primary"]
    effects = world.remote.effects.values()
    charges = [e for e in effects if (e.agent, e.action) == ("payment", "charge")]
    assert len(charges) == 1  # one effect, whichever endpoint was asked
    assert ("completed", "charge", "north") in endpoint_history(world, "r8")


def test_a_try_that_fails_on_one_endpoint_fails_over_within_the_attempt(world):
    request = to_payment(world, "r9")
    world.remote.down.add("west")  # west is down, its breaker not open yet: 503 on every call
    assert world.app.run_step("payment", request) is AgentOutcome.REPLIED
    assert world.remote.endpoint_calls[-2:] == ["west", "north"]
    (reply,) = world.bus.to("replies")[-1:]
    assert isinstance(reply, StepReply)
    assert (reply.outcome, reply.endpoint, reply.attempt) == ("ok", "north", request.attempt)
    world.run()
    assert world.state("r9").process_state is ProcessState.PROCESSED
    assert ("completed", "charge", "north") in endpoint_history(world, "r9")
    assert world.router is not None
    assert world.router.in_flight(WEST) == world.router.in_flight(NORTH) == 0  # all released


def test_deferrals_made_by_the_agent_back_off_longer_each_time(world):
    """The endpoints are full at each call: every deferral of the step waits longer than the
    one before (1, 2, 4, 8, then the 10 s cap), past the bound on a circuit's deferrals (want
    of room is load, which the calls in flight free)."""
    router = world.router
    assert router is not None
    request = to_payment(world, "r10")
    delays = []
    for _ in range(DEFERRAL.most + 5):
        held = [router.acquire("payment") for _ in range(4)]  # both full now
        assert world.app.run_step("payment", request) is AgentOutcome.DEFERRED
        assert world.deliver("replies") == [ReplyOutcome.DEFERRED]
        state = world.state("r10")
        assert state.not_before is not None
        delays.append((state.not_before - state.updated_at).total_seconds())
        for endpoint in held:
            assert endpoint is not None
            router.release(endpoint)
        world.clock.advance(delays[-1] + 0.1)
        world.deliver("scheduler")  # room again: claimed
        (request,) = [m for m in world.bus.take("agent-payment") if isinstance(m, StepRequest)]
    assert delays == [1, 2, 4, 8] + [10] * (DEFERRAL.most + 1)
    assert world.state("r10").failure_count == 0


def test_no_room_after_a_failed_try_defers_the_step_instead_of_failing_it(world):
    """One 503, then other calls take every endpoint while this agent backs off: the step is
    deferred (a deferred reply), not given up (which the Supervisor would count)."""
    router = world.router
    assert router is not None
    request = to_payment(world, "r11")
    others: list[Endpoint] = []
    world.remote.down.update({"west", "north"})

    def sleep(seconds: float) -> None:
        while (endpoint := router.acquire("payment")) is not None:
            others.append(endpoint)
        world.clock.advance(seconds)

    agent = instance(
        InMemoryStore(), world.bus, world.routes, world.clock, REGISTRY, "agent-payment"
    ).with_remote(world.remote, sleep=sleep, router=router)
    assert agent.run_step("payment", request) is AgentOutcome.DEFERRED
    for endpoint in others:
        router.release(endpoint)
    world.remote.down.clear()
    world.deliver("replies")
    state = world.state("r11")
    assert (state.process_state, state.failure_count, state.deferrals) == (
        ProcessState.PENDING,
        0,
        1,
    )
    world.clock.advance(2)
    world.run()
    assert world.state("r11").process_state is ProcessState.PROCESSED

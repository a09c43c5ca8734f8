"""Fair breakers, end to end in the harness with the deployed breaker policy: one order's own
faults never open its agent's breaker for the others, an endpoint failing most of its calls
does, and an order deferred by an open breaker spends none of its ``max_failures``."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from sas.actions import ActionContext, PythonAgent, Transient
from sas.domain.breaker import BreakerStatus, closed_breaker
from sas.domain.model import ProcessState
from sas.domain.workflow import Registry, StepDefinition, Workflow
from sas.testing import Harness, fault, ok

pytestmark = [pytest.mark.unit, pytest.mark.fast]

SEND = StepDefinition("send", "post", "send", timedelta(seconds=15))
MAIL = Workflow("mail", (SEND,), pickup_budget=timedelta(seconds=60))


def post_office(order_scoped: bool) -> Registry:
    """A Python agent whose post bounces, every time, for an address starting ``bounce``."""

    def send(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
        if data["to"].startswith("bounce"):
            raise Transient("address bounced", order_scoped=order_scoped)
        return {"sent": data["to"]}

    return Registry((MAIL,), python_agents=(PythonAgent("post", {"send": send}),))


def opened(harness: Harness, target: str) -> bool:
    """Whether the target's breaker was ever open."""
    return any(
        s.name == target and s.status is BreakerStatus.OPEN for s in harness.breakers.written
    )


@pytest.mark.parametrize("order_scoped", [True, False])
def test_four_orders_own_faults_leave_thirty_others_processed_and_the_breaker_closed(
    order_scoped: bool,
):
    """Four orders' addresses bounce on every try while thirty others are posted. Marked as
    the orders' own, the bounces never open the breaker and the others never wait for it;
    unmarked (the control), the same run opens it and most of the others are deferred."""
    harness = Harness(post_office(order_scoped), breakers=True)
    bad = [harness.submit("mail", {"to": f"bounce-{n}"}) for n in range(4)]
    harness.run(for_seconds=20)  # the bad orders' first attempts retry meanwhile
    good = []
    for n in range(30):
        good.append(harness.submit("mail", {"to": f"friend-{n}"}))
        harness.run(for_seconds=1)
    harness.run()
    for order_id in bad:  # each spent its own max_failures (3), then was compensated
        assert harness.state(order_id).process_state is ProcessState.COMPENSATED
        assert harness.history(order_id).count("expired_retry:send") == 2
    for order_id in good:
        state = harness.state(order_id)
        assert (state.process_state, state.failure_count) == (ProcessState.PROCESSED, 0)
    deferred = [o for o in good if "deferred:send" in harness.history(o)]
    if order_scoped:
        assert not opened(harness, "post") and deferred == []
    else:
        assert opened(harness, "post") and len(deferred) > 15


def test_an_endpoint_failing_60_percent_of_its_calls_opens_the_breaker():
    harness = Harness(Registry((MAIL,)), breakers=True, max_failures=10)
    rng = random.Random(44)
    harness.script("post", "send", *(fault() if rng.random() < 0.6 else ok() for _ in range(400)))
    for n in range(20):
        harness.submit("mail", {"to": f"friend-{n}"})
    harness.run()
    assert opened(harness, "post")


def test_an_order_deferred_by_an_open_breaker_spends_none_of_its_max_failures():
    """Other instances keep the breaker open for two minutes (the service itself is up):
    ten orders are deferred again and again, and finish with no failure counted."""
    harness = Harness(post_office(order_scoped=False), breakers=True)
    orders = [harness.submit("mail", {"to": f"friend-{n}"}) for n in range(10)]
    for _ in range(60):  # 2 min: opened for 10 s from now, every 2 s
        found = harness.breakers.get("post")
        now = harness.clock.now()
        breaker = closed_breaker("post", now) if found is None else found.value
        held = replace(breaker, status=BreakerStatus.OPEN, opened_until=now + timedelta(seconds=10))
        harness.breakers.put(held, None if found is None else found.etag)
        harness.run(for_seconds=2)
    assert harness.calls == []
    for order_id in orders:
        state = harness.state(order_id)
        assert state.process_state is ProcessState.PENDING
        assert (state.failure_count, state.deferrals >= 5) == (0, True)
    harness.run()  # no longer held open: a probe goes through, and closes it
    for order_id in orders:
        state = harness.state(order_id)
        assert (state.process_state, state.failure_count) == (ProcessState.PROCESSED, 0)

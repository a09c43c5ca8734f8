"""One alert per Error, whoever notices it: the Scheduler that wrote Error and any number of
Supervisors sweeping at the same moment (found broken by an adversarial run: 17 alerts for
14 Error orders). The claim to send is a conditional write made before the send. In memory:
the store's ETags behave as Table Storage's; the claim's columns read back from the real table
are checked on Azurite (tests/integration/test_alerts.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sas.domain.messages import Message, OperatorAlert
from sas.domain.model import ProcessState
from sas.services.context import ALERT_LEASE
from sas.testing import refuse
from tests.harness import ROUTES, World
from tests.unit.test_failure_modes import order
from tests.workflows import STRICT

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def during_first_alert_send(world: World, action: Callable[[], Any]) -> None:
    """Run ``action`` while the first alert is being sent: after the claim, before the clear."""
    original = world.bus.send
    armed = [True]

    def send(queue: str, message: Message, **kwargs: Any) -> None:
        original(queue, message, **kwargs)
        if queue == ROUTES.alerts and armed[0]:
            armed[0] = False
            action()

    world.bus.send = send  # type: ignore[method-assign]


def alerts_for(world: World, order_id: str) -> list[OperatorAlert]:
    return [a for a in world.alerts() if isinstance(a, OperatorAlert) and a.order_id == order_id]


def refused_for_good(world: World) -> str:
    world.remote.script("payment", "charge", refuse("HTTP 402 declined"))
    return "o1"


@pytest.mark.parametrize("lease", [ALERT_LEASE, timedelta(0)], ids=["claimed", "no-claim"])
def test_supervisors_sweeping_while_the_scheduler_sends_add_no_alert(lease):
    world = World()
    oid = order(world, refused_for_good(world), workflow=STRICT.name)
    # What consumes the queues (the Scheduler among them) and what ticks, with this lease.
    world.app = world.app.named("scheduler-1", alert_lease=lease)
    world.supervisor = world.supervisor.named("supervisor-1", alert_lease=lease)
    others = [world.app.named(f"supervisor-{n}", alert_lease=lease) for n in (2, 3)]
    sweeps: list[Any] = []

    def sweep_all() -> None:
        for other in others:
            world.make_due(oid)  # each sweeps as if its marker were due (one re-arms it)
            sweeps.append(other.sweep())

    during_first_alert_send(world, sweep_all)
    world.run()
    assert world.state(oid).process_state is ProcessState.ERROR
    alerts = alerts_for(world, oid)
    if lease == timedelta(0):
        # Without an exclusive claim a sweeper that sees the debt sends again.
        assert len(alerts) == 2
        return
    assert len(alerts) == 1
    assert [s["alert_claimed_elsewhere"] for s in sweeps] == [1, 1]
    assert world.state(oid).alert_pending is False
    world.tick(1)
    world.tick(ALERT_LEASE.total_seconds() + 1)
    assert len(alerts_for(world, oid)) == 1
    assert world.store.list_live() == []  # unindexed once nothing is owed


def test_an_expired_step_turned_error_by_two_supervisors_alerts_once():
    world = World(max_failures=1)
    oid = order(world, workflow=STRICT.name)
    world.deliver("orders"), world.deliver("scheduler")
    world.drop("agent-inventory")  # the agent died: the step expires
    second = world.new_supervisor("supervisor-2")
    sweeps: list[Any] = []
    during_first_alert_send(world, lambda: sweeps.append(second.sweep()))
    world.tick(60)
    assert world.state(oid).process_state is ProcessState.ERROR
    assert len(alerts_for(world, oid)) == 1
    assert sweeps[0]["alert_claimed_elsewhere"] == 1


def test_a_sweep_in_the_scheduler_own_instance_does_not_send_under_its_claim():
    """The Scheduler and the ``supervise`` timer share one instance id in a Functions host (the
    CI campaign caught a sweep re-claiming its own process's live claim 0.4 s after it was
    written, and sending the alert a second time)."""
    world = World()
    oid = order(world, refused_for_good(world), workflow=STRICT.name)
    same_instance = world.new_supervisor("scheduler-1")
    sweeps: list[Any] = []

    def sweep() -> None:
        world.make_due(oid)
        sweeps.append(same_instance.sweep())

    during_first_alert_send(world, sweep)
    world.run()
    assert world.state(oid).process_state is ProcessState.ERROR
    assert len(alerts_for(world, oid)) == 1
    assert sweeps[0]["alert_claimed_elsewhere"] == 1
    assert "alert_claimed" not in world.history(oid)  # nobody re-claimed a live claim

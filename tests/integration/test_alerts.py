"""One alert per Error, whoever notices it: the Scheduler that wrote Error and any number of
Supervisors sweeping at the same moment (found broken by an adversarial run: 17 alerts for
14 Error orders). The claim to send is a conditional write made before the send."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sas.domain.messages import Message, OperatorAlert
from sas.domain.model import ProcessState
from sas.services.context import ALERT_LEASE
from tests.harness import ROUTES, World, permanent
from tests.integration.test_failure_modes import order

pytestmark = pytest.mark.integration


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
    world.remote.script[("payment", "charge")] = [permanent("HTTP 402 declined")]
    return "o1"


@pytest.mark.parametrize("lease", [ALERT_LEASE, timedelta(0)], ids=["claimed", "no-claim"])
def test_supervisors_sweeping_while_the_scheduler_sends_add_no_alert(table, strict, lease):
    world = World(table)
    oid = order(world, refused_for_good(world), workflow=strict)
    world.scheduler = world.scheduler.named("scheduler-1", alert_lease=lease)
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


def test_an_expired_step_turned_error_by_two_supervisors_alerts_once(table, strict):
    world = World(table, max_failures=1)
    oid = order(world, workflow=strict)
    world.deliver("orders"), world.deliver("scheduler")
    world.drop("agent-inventory")  # the agent died: the step expires
    second = world.new_supervisor("supervisor-2")
    sweeps: list[Any] = []
    during_first_alert_send(world, lambda: sweeps.append(second.sweep()))
    world.tick(60)
    assert world.state(oid).process_state is ProcessState.ERROR
    assert len(alerts_for(world, oid)) == 1
    assert sweeps[0]["alert_claimed_elsewhere"] == 1


def test_a_sender_that_died_is_replaced_after_the_lease_with_the_same_alert_id(table, strict):
    world = World(table)
    oid = order(world, refused_for_good(world), workflow=strict)
    world.bus.fail_next_send_to.add("alerts")
    with pytest.raises(ConnectionError):
        world.run()  # Error and the claim written, then the process died before the send
    state = world.state(oid)
    assert state.alert_pending and state.alert_claimed_by == "scheduler-1"
    world.make_due(oid)
    assert world.tick(1)["alert_claimed_elsewhere"] == 1  # the claim holds: nobody else sends
    assert alerts_for(world, oid) == []
    assert [m.order_id for m in world.store.list_live()] == [oid]  # still watched
    world.tick(ALERT_LEASE.total_seconds())
    (alert,) = alerts_for(world, oid)
    assert world.state(oid).alert_pending is False
    assert "alert_claimed" in world.history(oid)
    (sent,) = [e for q, e in world.bus.sent if q == ROUTES.alerts]
    assert sent.message_id == alert.alert_id  # the id a consumer de-duplicates on
    world.tick(ALERT_LEASE.total_seconds() + 1)
    assert len(alerts_for(world, oid)) == 1


def test_a_sweep_in_the_scheduler_own_instance_does_not_send_under_its_claim(table, strict):
    """The Scheduler and the ``supervise`` timer share one instance id in a Functions host (the
    CI campaign caught a sweep re-claiming its own process's live claim 0.4 s after it was
    written, and sending the alert a second time)."""
    world = World(table)
    oid = order(world, refused_for_good(world), workflow=strict)
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

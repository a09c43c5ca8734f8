"""Operator alerts with a lifecycle, in memory: each Error's alert is open until acknowledged
or until its order leaves Error; open ones come grouped by workflow, step and reason. The
conditional writes on Azurite: tests/integration/test_alerts.py."""

from __future__ import annotations

import pytest

from sas.domain.errors import InvalidMessage
from sas.domain.model import ProcessState
from sas.services import alert_book
from sas.testing import InMemoryStore, refuse
from tests.harness import World
from tests.unit.test_failure_modes import order

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def stopped(world: World, *ids: str) -> None:
    """Each order stops in Error on a refused charge (the strict workflow), its alert sent."""
    for oid in ids:
        world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
        order(world, oid, workflow="strict")
    world.settle_with_supervision()
    assert all(world.state(oid).process_state is ProcessState.ERROR for oid in ids)


def groups(world: World) -> list[tuple[str, str, list[str]]]:
    found = alert_book.open_groups(world.store, world.clock.now())
    return [(g.step, g.reason, [a.order_id for a in g.alerts]) for g in found]


def test_alerts_of_one_cause_are_one_group_until_acknowledged():
    world = World()
    stopped(world, "o1", "o2")
    ((step, reason, orders),) = groups(world)
    assert (step, orders) == ("charge", ["o1", "o2"]) and "card declined" in reason
    ids = [a.alert_id for a in alert_book.open_groups(world.store, world.clock.now())[0].alerts]
    outcomes = alert_book.acknowledge(
        world.store, world.clock.now(), [*ids, ids[0], "nonesuch"], actor="dana", note="bank"
    )
    assert outcomes == {ids[0]: "acknowledged", ids[1]: "acknowledged", "nonesuch": "not found"}
    assert groups(world) == []
    again = alert_book.acknowledge(world.store, world.clock.now(), ids[:1], actor="eve")
    assert again == {ids[0]: "acknowledged already"}
    audited = world.operator.audit(10, action="acknowledge")
    assert [(e.target, e.actor, e.reason) for e in audited] == [
        (ids[1], "dana", "bank"),
        (ids[0], "dana", "bank"),
    ]


def test_an_alert_clears_itself_when_its_order_leaves_error():
    world = World()
    stopped(world, "o1", "o2", "o3")
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    world.operator.resubmit("o1", actor="dana")  # fails again: a new alert, the old one cleared
    world.settle_with_supervision()
    world.operator.close("o2", actor="dana", reason="refunded")
    world.operator.cancel("o3", actor="dana", reason="customer asked")
    world.settle_with_supervision()
    ((_, _, orders),) = groups(world)
    assert orders == ["o1"]
    (kept,) = world.store.list_alerts()
    assert kept.value.attempt == world.state("o1").attempt  # the second episode's
    assert isinstance(world.store, InMemoryStore)
    cleared = [v.value for v in world.store.alert_records.values() if v.value.cleared_at]
    assert sorted(r.order_id for r in cleared) == ["o1", "o2", "o3"]


def test_acknowledging_nothing_or_too_much_is_refused():
    world = World()
    with pytest.raises(InvalidMessage, match="1 to 100"):
        alert_book.acknowledge(world.store, world.clock.now(), [], actor="dana")
    with pytest.raises(InvalidMessage, match="1 to 100"):
        ids = [f"a{n}" for n in range(101)]
        alert_book.acknowledge(world.store, world.clock.now(), ids, actor="dana")

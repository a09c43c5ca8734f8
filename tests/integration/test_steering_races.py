"""Cancel racing what else may move the order at the same moment, on Azurite (the store's
ETags decide who wrote first): a late ``ok``, the Supervisor's expiry, a resubmit, a second
cancel. Both racers read the order before either writes; whichever wins, the order ends
Cancelled and the remote's ledger (sas.testing's, applying each effect once per key) shows
every applied effect undone exactly once. One at a time: tests/unit/test_steering.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sas.domain.errors import ConcurrencyConflict, IllegalTransition
from sas.domain.model import ProcessState
from sas.services.operator import Operator
from sas.testing import refuse
from tests.harness import CLAIMED, World
from tests.integration.test_failure_modes import RacingStore
from tests.unit.test_failure_modes import order

pytestmark = pytest.mark.integration


def charging(world: World) -> str:
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")
    world.deliver("agent-inventory"), world.deliver("replies")
    assert world.state(oid).step == "charge"
    return oid


def race(*racers: Callable[[], Any]) -> list[Any]:
    """Run the racers at once; what each returned, or the domain error it raised."""

    def run(racer: Callable[[], Any]) -> Any:
        try:
            return racer()
        except (ConcurrencyConflict, IllegalTransition) as refused:
            return refused

    with ThreadPoolExecutor(len(racers)) as pool:
        return list(pool.map(run, racers))


def canceller(world: World, store: RacingStore, oid: str, name: str = "dana") -> Callable[[], Any]:
    operator = Operator(world.app.named(f"operator-{name}", store=store).ctx)
    return lambda: operator.cancel(oid, actor=name, reason="customer asked")


def assert_cancelled_and_undone_once(world: World, oid: str) -> None:
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    applied = world.remote.applied(oid)
    assert applied and all(applied.values()), applied
    undos = Counter(
        e.undoes for e in world.remote.effects.values() if e.order_id == oid and e.undoes
    )
    assert all(n == 1 for n in undos.values()), undos


def test_cancel_against_the_running_steps_late_ok(world, table):
    oid = charging(world)
    world.deliver("agent-payment")  # charge applied; its ok waits in the replies queue
    (late,) = world.bus.take("replies")
    store = RacingStore(table, racers=2)
    scheduler = world.app.named("scheduler-2", store=store)
    race(canceller(world, store, oid), lambda: scheduler.on_reply(late))
    assert_cancelled_and_undone_once(world, oid)
    assert world.remote.applied(oid).keys() >= {("inventory", "reserve"), ("payment", "charge")}


def test_cancel_against_the_supervisors_expiry(world, table):
    oid = charging(world)
    world.deliver("agent-payment")  # applied, and the reply lost with its agent
    world.drop("replies")
    world.clock.advance(CLAIMED + 1)
    store = RacingStore(table, racers=2)
    supervisor = world.new_supervisor("supervisor-2", store)
    race(canceller(world, store, oid), supervisor.sweep)
    assert_cancelled_and_undone_once(world, oid)
    assert world.state(oid).failure_count <= 1


def test_cancel_against_a_resubmit_of_an_error_order(world, table):
    world.remote.script("payment", "charge", refuse("HTTP 402"), refuse("HTTP 402"))
    oid = order(world, workflow="strict")
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.ERROR
    store = RacingStore(table, racers=2)
    resubmitter = Operator(world.app.named("operator-eve", store=store).ctx)
    outcomes = race(canceller(world, store, oid), lambda: resubmitter.resubmit(oid, actor="eve"))
    assert not isinstance(outcomes[0], Exception)  # the cancel reads again when it loses
    assert_cancelled_and_undone_once(world, oid)


def test_two_cancels_at_once_cancel_once(world, table):
    oid = charging(world)
    store = RacingStore(table, racers=2)
    outcomes = race(canceller(world, store, oid, "dana"), canceller(world, store, oid, "eve"))
    refused = [o for o in outcomes if isinstance(o, IllegalTransition)]
    assert len(refused) == 1 and "being cancelled already" in str(refused[0])
    assert [e.action for e in world.operator.audit(10)] == ["cancel"]
    assert world.history(oid).count("cancelled") == 1
    assert_cancelled_and_undone_once(world, oid)

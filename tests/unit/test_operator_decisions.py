"""What the operator decides alone, in memory: a bad query refused before anything is read, an
order submitted on its priority's lane (or refused, nothing sent), two operators resubmitting
one order at once resubmit it once. What the real store's queries and purge do with the
operator's requests: tests/integration/test_operator_queries.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sas.domain.errors import ConcurrencyConflict, InvalidMessage
from sas.domain.model import OrderState, ProcessState, Versioned
from sas.domain.wire import submission_message_id
from sas.services.operator import Operator, OrderQuery
from sas.testing import refuse
from tests.harness import World
from tests.unit.test_services import submitted
from tests.workflows import STRICT

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def test_a_bad_query_is_refused_before_anything_is_read() -> None:
    with pytest.raises(ValueError, match="limit"):
        OrderQuery(limit=0)
    with pytest.raises(ValueError, match="older_than"):
        OrderQuery(older_than=timedelta(seconds=-1))


def test_submit_sends_to_the_orders_lane_and_refuses_bad_orders() -> None:
    world = World()
    operator = Operator(world.app.ctx)
    high = submitted("sub-1").model_copy(update={"priority": "high"})
    assert operator.submit(high) == submission_message_id("sub-1")
    (sent,) = world.bus.take(world.routes.lane(world.routes.orders, "high"))
    assert sent == high
    with pytest.raises(InvalidMessage, match="unknown workflow"):
        operator.submit(submitted("sub-2").model_copy(update={"workflow": "nope"}))
    with pytest.raises(InvalidMessage, match="deferred_since"):
        operator.submit(submitted("sub-3").model_copy(update={"deferred_since": world.clock.now()}))
    for lane in world.routes.all_lanes(world.routes.orders):
        assert world.bus.take(lane) == []
    assert world.store.get_state("sub-2") is None


def test_two_operators_resubmitting_at_once_resubmit_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both read the Error order before either writes: Bob's resubmit runs whole between Ann's
    read and her write, whose ETag is then stale."""
    world = World()
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    world.submit(submitted("err").model_copy(update={"workflow": STRICT.name}))
    world.run()
    assert world.state("err").process_state is ProcessState.ERROR
    real_get_state = world.store.get_state
    outcomes: list[str] = []

    def press(actor: str) -> None:
        try:
            world.operator.resubmit("err", actor=actor)
            outcomes.append("resubmitted")
        except ConcurrencyConflict:
            outcomes.append("conflict")

    def read_then_the_other_presses(order_id: str) -> Versioned[OrderState] | None:
        found = real_get_state(order_id)
        monkeypatch.setattr(world.store, "get_state", real_get_state)  # Bob reads freely
        press("bob")
        return found

    monkeypatch.setattr(world.store, "get_state", read_then_the_other_presses)
    press("ann")
    assert outcomes == ["resubmitted", "conflict"]  # Bob's, then Ann's
    assert world.history("err").count("resubmitted") == 1
    requests = [
        m for lane in world.routes.all_lanes(world.routes.scheduler) for m in world.bus.take(lane)
    ]
    assert len(requests) == 1

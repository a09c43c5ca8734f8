"""Bounded work in flight on Azurite: the count of markers and the waiting room are the
store's, so the limit holds and every order that waited goes through (the rules in memory:
tests/unit/test_in_flight_limit.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sas.domain.model import ProcessState
from sas.services.in_flight import InFlight
from sas.services.submission import SubmissionOutcome
from tests.harness import World
from tests.unit.test_failure_modes import ALL_STEPS, assert_effects_once
from tests.unit.test_in_flight_limit import LIMIT, LIMITED
from tests.unit.test_services import submitted
from tests.workflows import SHOP

pytestmark = pytest.mark.integration


def test_past_the_limit_orders_wait_in_the_room_and_all_go_through(table):
    world = World(table, workflows=LIMITED)
    world.app = world.app.named(
        "scheduler-1", in_flight=InFlight(world.store, world.clock, ttl=timedelta(0))
    )
    outcomes = [world.app.submit(submitted(f"o{n}")) for n in range(5)]
    assert outcomes.count(SubmissionOutcome.WAITING) == 5 - LIMIT
    assert [w.order_id for w in world.store.list_waiting(SHOP.name, 10)] == ["o2", "o3", "o4"]
    world.run()
    assert world.tick(20)["let_in"] == LIMIT  # the finished two dropped, two let in
    assert world.store.count_live(SHOP.name, 10) == LIMIT
    world.settle_with_supervision(ticks=6)
    assert world.store.list_waiting(SHOP.name, 10) == []
    for n in range(5):
        assert world.state(f"o{n}").process_state is ProcessState.PROCESSED
        assert_effects_once(world, f"o{n}", *ALL_STEPS)

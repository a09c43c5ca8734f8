"""Routing across processes through the real table (Azurite): the calls in flight another
process publishes to the in-flight table count against an endpoint's capacity until its row
goes stale. Routing within one process (health, capacity, deferral, failover, one effect
whichever endpoint), decided by the domain, runs in memory (tests/unit/test_endpoint_routing.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from azure.data.tables import TableClient

from sas.adapters.load_table import TableBudgetStore, TableLoadStore
from sas.domain.endpoints import HeldRetries
from sas.domain.errors import NotFound
from sas.services.routing import Router
from sas.testing import FakeClock
from tests.harness import World, live_table_of
from tests.unit.test_endpoint_routing import ENDPOINTS, WEST, Health, Regions, to_payment

pytestmark = pytest.mark.integration


@pytest.fixture
def world(table) -> World:
    live = live_table_of(table)

    def router(clock: FakeClock) -> Router:
        return Router(
            ENDPOINTS, clock, "this-process", healthy=Health(), loads=TableLoadStore(live)
        )

    return World(table, router=router, remote=Regions)


def test_another_process_calls_count_through_the_published_load(world, table):
    # Another process published two calls in flight to west a moment ago.
    TableLoadStore(live_table_of(table)).publish(
        "other-process", {WEST.target: 2}, world.clock.now()
    )
    world.app.run_step("payment", to_payment(world, "r4"))
    assert world.remote.endpoint_calls[-1] == "north"
    # Once its row is stale (the process stopped publishing), west counts as empty again.
    world.clock.advance(10)
    assert world.router is not None
    assert world.router.in_flight(WEST) == 0


def test_measurements_written_to_a_table_that_is_not_there_are_not_found(azurite):
    """Both measurement rows (loads, the Supervisor's held retries) name the missing table."""
    missing = TableClient.from_connection_string(azurite.connection_string, "nosuchtable")
    with pytest.raises(NotFound, match="nosuchtable does not exist"):
        TableLoadStore(missing).publish("p1", {"payment": 1}, datetime.now(UTC))
    with pytest.raises(NotFound, match="nosuchtable does not exist"):
        TableBudgetStore(missing).publish(HeldRetries("s1", 3, datetime.now(UTC)))

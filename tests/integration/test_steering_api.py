"""Steering through the HTTP API on Azurite: what a route answers, and that the order it
names moves as the domain says (tests/unit/test_steering.py has the flows in memory)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from sas.domain.model import ProcessState
from sas.entrypoints.http_api import api
from tests.harness import World
from tests.unit.test_failure_modes import order

pytestmark = pytest.mark.integration


@pytest.fixture
def client() -> TestClient:
    return TestClient(api)


def test_an_order_suspended_and_resumed_through_the_api_finishes(app_env, table, client):
    world = World(table)
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")  # reserve claimed, not yet run
    suspended = client.post(f"/api/orders/{oid}/suspend", json={"actor": "dana"})
    assert suspended.status_code == 200, suspended.text
    assert suspended.json()["suspended"] is True
    world.run()  # reserve finishes; charge waits unclaimed
    assert (world.state(oid).process_state, world.state(oid).step) == (
        ProcessState.PENDING,
        "charge",
    )
    again = client.post(f"/api/orders/{oid}/suspend", json={"actor": "dana"})
    assert again.status_code == 409 and "suspended already" in again.json()["detail"]
    resumed = client.post(f"/api/orders/{oid}/resume", json={"actor": "dana", "reason": "ok"})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["suspended"] is False
    state = world.state(oid)  # claimable again (the app's own queue has its schedule request)
    assert state.process_state is ProcessState.PENDING and state.complete_by is not None
    assert "unsuspended" in world.history(oid)


def test_a_cancel_through_the_api_needs_a_reason_and_undoes_the_order(app_env, table, client):
    world = World(table)
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")
    blank = client.post(f"/api/orders/{oid}/cancel", json={"actor": "dana", "reason": " "})
    assert blank.status_code == 422
    cancelled = client.post(f"/api/orders/{oid}/cancel", json={"reason": "customer asked"})
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["cancelled"] == "cancelled by operator: customer asked"
    world.run()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert client.post(f"/api/orders/{oid}/terminate", json={"reason": "x"}).status_code == 409

"""The operator's HTTP API and CLI against Azurite: list by state, history, resubmit, rejected."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from sas import bootstrap
from sas.adapters.clients import queue_service_client
from sas.domain.model import ProcessState
from sas.entrypoints.http_api import api
from sas_cli.commands import run
from tests.harness import World, permanent
from tests.integration.test_failure_modes import order

pytestmark = pytest.mark.integration


@pytest.fixture
def failed_order(app_env, table, strict) -> str:
    world = World(table)
    world.clock.current = datetime.now(UTC) - timedelta(minutes=5)  # before the API's real clock
    world.remote.script[("payment", "charge")] = [permanent("HTTP 402 card declined")]
    oid = order(world, "err1", workflow=strict)
    world.run()
    assert world.state(oid).process_state is ProcessState.ERROR
    return oid


@pytest.fixture
def client() -> TestClient:
    return TestClient(api)


def test_orders_are_listed_by_state(client, failed_order):
    response = client.get("/api/orders", params={"state": "Error"})
    assert response.status_code == 200
    (listed,) = response.json()
    assert listed["order_id"] == failed_order and "card declined" in listed["last_error"]
    assert client.get("/api/orders", params={"state": "Processed"}).json() == []
    assert client.get("/api/orders", params={"state": "Nonsense"}).status_code == 422


def test_one_orders_history_shows_steps_attempts_errors(client, failed_order):
    body = client.get(f"/api/orders/{failed_order}").json()
    assert body["process_state"] == "Error"
    assert [s["name"] for s in body["steps"]] == ["reserve"]
    assert [h["kind"] for h in body["history"]] == [
        "submitted",
        "claimed",
        "completed",
        "refused",
    ]
    assert body["history"][-1]["attempt"] == 2 and "card declined" in body["history"][-1]["detail"]


def test_resubmit_is_conditional_audited_and_refused_twice(client, failed_order):
    response = client.post(f"/api/orders/{failed_order}/resubmit", json={"actor": "alice"})
    assert response.status_code == 200
    assert response.json()["process_state"] == "Pending"
    assert client.post(f"/api/orders/{failed_order}/resubmit").status_code == 409
    assert client.post("/api/orders/nope/resubmit").status_code == 404
    history = client.get(f"/api/orders/{failed_order}").json()["history"]
    assert history[-1]["kind"] == "resubmitted" and history[-1]["actor"] == "alice"
    scheduler = queue_service_client(bootstrap.settings().storage).get_queue_client("sas-scheduler")
    assert scheduler.get_queue_properties().approximate_message_count == 1  # retry requested


def test_rejected_messages_are_listed_with_reason_and_body(client, app_env):
    bootstrap.store().park_message("sas-orders", "not UTF-8", b"\xff\x00", bootstrap.clock().now())
    bootstrap.store().park_message("sas-orders", "invalid", b'{"a": 1}', bootstrap.clock().now())
    listed = client.get("/api/rejected").json()
    assert {(r["reason"], r["body_text"]) for r in listed} == {
        ("not UTF-8", None),
        ("invalid", '{"a": 1}'),
    }
    assert {r["body_base64"] for r in listed} >= {"/wA="}


def test_the_cli_lists_shows_and_resubmits(client, failed_order, capsys):
    assert run(["--json", "orders", "list", "--state", "Error"], client=client) == 0
    assert json.loads(capsys.readouterr().out)[0]["order_id"] == failed_order
    assert run(["orders", "show", failed_order], client=client) == 0
    shown = capsys.readouterr().out
    assert "refused" in shown and "card declined" in shown
    assert run(["orders", "resubmit", failed_order, "--actor", "bob"], client=client) == 0
    assert "Pending" in capsys.readouterr().out
    assert run(["orders", "resubmit", failed_order], client=client) == 1
    assert "409" in capsys.readouterr().out
    assert run(["rejected", "list"], client=client) == 0


@pytest.mark.parametrize("hostile", ["#", "?state=Error", "/resubmit", "%23", "/../"])
def test_the_cli_never_lets_an_order_id_address_another_order(
    client, failed_order, hostile, capsys
):
    # Unquoted, "err1#x" asked for /api/orders/err1 and showed the wrong order.
    assert run(["--json", "orders", "show", failed_order + hostile], client=client) == 1
    out = capsys.readouterr().out
    assert failed_order not in out or "422" in out or "404" in out
    assert "card declined" not in out
    assert run(["orders", "resubmit", failed_order + hostile], client=client) == 1
    assert client.get(f"/api/orders/{failed_order}").json()["process_state"] == "Error"

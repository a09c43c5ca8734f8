"""What the HTTP API answers that the operator decides, in memory: bad filters and orders are
refused with what is wrong (422, nothing sent, no order changed), orders are found by their step
and their error's text (filters the operator applies, not the table), and a bulk resubmit
reports an order someone else moved. The API's operator is an in-memory app's (``World()``);
anything else it could reach raises AssertionError. The API on the app's real table and queues
(Azurite): tests/integration/test_dashboard_api.py and tests/integration/test_operator.py."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from sas.domain.errors import ConcurrencyConflict
from sas.domain.model import OrderState, ProcessState
from sas.entrypoints.http_api import api
from sas.entrypoints.request_limits import MAX_BODY_BYTES
from sas.services.operator import Operator
from sas.testing import refuse
from tests.harness import World
from tests.unit.test_cli_refusals import on_memory
from tests.unit.test_services import submitted
from tests.workflows import STRICT

pytestmark = [pytest.mark.unit, pytest.mark.fast]

VALID_ORDER: dict[str, Any] = {
    "type": "OrderSubmitted",
    "order_id": "o1",
    "details": submitted().details,
}


@pytest.fixture
def client() -> TestClient:
    return TestClient(api)


@pytest.fixture
def empty(monkeypatch: pytest.MonkeyPatch) -> World:
    world = World()
    on_memory(monkeypatch, world)
    return world


@pytest.fixture
def orders(monkeypatch: pytest.MonkeyPatch) -> World:
    """Submitted 10 min ago: old-high (Processed, high) and failed (Error at charge, card
    declined); 1 min ago: new-normal (Processed) and new-low (Processed, low)."""
    world = World()
    world.submit(submitted("old-high", priority="high"))
    world.run()
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    world.submit(submitted("failed").model_copy(update={"workflow": STRICT.name}))
    world.run()
    world.clock.advance(540)
    world.submit(submitted("new-normal"))
    world.submit(submitted("new-low", priority="low"))
    world.run()
    world.clock.advance(60)
    assert world.state("failed").process_state is ProcessState.ERROR
    on_memory(monkeypatch, world)
    return world


def ids(response: Any) -> set[str]:
    assert response.status_code == 200, response.text
    return {found["order_id"] for found in response.json()}


# --- from the dashboard's API -------------------------------------------------------------


def test_orders_are_filtered_by_their_step_and_their_error_s_text(client, orders):
    assert ids(client.get("/api/orders", params={"step": "charge"})) == {"failed"}
    assert ids(client.get("/api/orders", params={"error": "Card Declined"})) == {"failed"}
    assert ids(client.get("/api/orders", params={"error": "no such text"})) == set()
    assert ids(client.get("/api/orders", params={"step": "nonsense"})) == set()


@pytest.mark.parametrize(
    ("params", "complaint"),
    [
        ({"state": "Nonsense"}, "state"),
        ({"priority": "urgent"}, "priority"),
        ({"older_than_seconds": -1}, "older_than_seconds"),
        ({"newer_than_seconds": "soon"}, "newer_than_seconds"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"error": "x" * 201}, "error"),
        ({"older_than_seconds": 60, "newer_than_seconds": 30}, "no order could match"),
        ({"offset": -1}, "offset"),
        ({"submitted_from": "2026-11-26T10:00:00"}, "timezone"),
        (
            {"submitted_from": "2026-11-26T10:00:00Z", "submitted_until": "2026-11-26T09:00Z"},
            "submitted_until must be after submitted_from",
        ),
        ({"submitted_from": "0001-01-01T00:00:00Z"}, "must be from 1900 to 9000"),
        ({"submitted_until": "9999-12-31T23:59:59Z"}, "must be from 1900 to 9000"),
        ({"submitted_from": "0001-01-01T00:30:00+01:00"}, "must be from 1900 to 9000"),
        ({"submitted_until": "9999-12-31T23:00:00-05:00"}, "must be from 1900 to 9000"),
    ],
)
def test_a_bad_filter_is_refused_with_what_is_wrong(client, empty, params, complaint):
    response = client.get("/api/orders", params=params)
    assert response.status_code == 422
    assert complaint in response.text


@pytest.mark.parametrize("edge", ["0001-01-01T00:00:00Z", "9999-12-31T23:00:00-05:00"])
def test_a_bulk_resubmit_with_an_instant_out_of_range_is_refused(client, orders, edge):
    answer = client.post("/api/orders/resubmit", json={"submitted_from": edge, "dry_run": False})
    assert answer.status_code == 422 and "must be from 1900 to 9000" in answer.text
    assert orders.state("failed").process_state is ProcessState.ERROR


# --- from the operator's API --------------------------------------------------------------


def test_bulk_resubmit_reports_an_order_someone_else_moved(client, orders, monkeypatch):
    def moved(self: Operator, order_id: str, *, actor: str) -> OrderState:
        raise ConcurrencyConflict(f"order {order_id} changed meanwhile")

    monkeypatch.setattr(Operator, "resubmit", moved)
    report = client.post("/api/orders/resubmit", json={"dry_run": False}).json()
    outcome = {e["order_id"]: e["outcome"] for e in report["orders"]}["failed"]
    assert outcome == "not resubmitted: order failed changed meanwhile"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"priority": "urgent"}, "priority"),
        ({"deferred_since": "2026-01-01T00:00:00Z"}, "deferred_since"),
    ],
)
def test_the_api_refuses_a_bad_priority_or_an_app_only_field(client, empty, change, reason):
    response = client.post("/api/orders", json={**VALID_ORDER, "order_id": "bad-1", **change})
    assert response.status_code == 422
    assert reason in response.text
    assert empty.bus.sent == []


@pytest.mark.parametrize(
    ("details", "reason"),
    [
        ({"customer_id": "c1"}, "invalid details"),
        ({**VALID_ORDER["details"], "address": "ж" * 40_000}, "invalid details"),
        ({**VALID_ORDER["details"], "SECRET": {"a": {"b": 1}}}, "<unexpected field>"),
    ],
)
def test_the_api_refuses_details_its_workflow_refuses_and_sends_nothing(
    client, empty, details, reason
):
    response = client.post(
        "/api/orders", json={**VALID_ORDER, "order_id": "bad-2", "details": details}
    )
    assert response.status_code == 422, response.text
    assert reason in response.text and "SECRET" not in response.text
    assert empty.bus.sent == []


def test_orders_are_filtered_by_workflow_and_an_unknown_one_is_refused(client, orders):
    assert ids(client.get("/api/orders", params={"workflow": STRICT.name})) == {"failed"}
    assert "failed" not in ids(client.get("/api/orders", params={"workflow": "order"}))
    refused = client.get("/api/orders", params={"workflow": "ordr"})
    assert refused.status_code == 422 and "no workflow 'ordr' is deployed" in refused.text
    report = client.post("/api/orders/resubmit", json={"workflow": "order"}).json()
    assert report["orders"] == []  # the Error order is of the other workflow


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/orders", {"workflw": "order"}),
        ("/api/orders", {"state": "Error", "sate": "Error"}),
        ("/api/parked", {"by": "app"}),
        ("/api/orders/failed", {"verbose": "1"}),
        ("/api/health", {"x": "1"}),
    ],
)
def test_an_unknown_query_parameter_is_refused_by_name(client, orders, path, params):
    response = client.get(path, params=params)
    assert response.status_code == 422, response.text
    unknown = set(params) - {"state"}
    assert {tuple(e["loc"]) for e in response.json()["detail"]} == {
        ("query", name) for name in unknown
    }
    assert "this route takes" in response.text


def test_the_function_key_parameter_goes_with_every_route(client, orders):
    assert ids(client.get("/api/orders", params={"code": "k", "state": "Error"})) == {"failed"}
    assert client.get("/api/health", params={"code": "k"}).status_code == 200


def test_a_body_over_the_limit_is_refused_unread(client, empty):
    huge = b'{"order_id": "' + b"x" * (MAX_BODY_BYTES + 1) + b'"}'
    response = client.post(
        "/api/orders", content=huge, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and "over 1048576 bytes" in response.text
    assert empty.bus.sent == []

    def streamed() -> Any:  # no content-length (chunked): counted as it comes
        for _ in range(17):
            yield b"x" * 65536

    response = client.post("/api/orders", content=streamed())
    assert response.status_code == 413
    assert empty.bus.sent == []


def test_bulk_resubmit_names_the_ids_it_was_given_that_no_longer_match(client, orders):
    report = client.post(
        "/api/orders/resubmit",
        json={"dry_run": False, "order_ids": ["failed", "new-normal", "nosuch", "failed"]},
    ).json()
    assert {e["order_id"]: e["outcome"] for e in report["orders"]} == {"failed": "done"}
    assert report["not_matched"] == ["new-normal", "nosuch"]
    assert orders.state("new-normal").process_state is ProcessState.PROCESSED


def test_the_audit_log_lists_operators_actions_newest_first(client, orders):
    assert client.post("/api/orders/failed/resubmit", json={"actor": "alice"}).status_code == 200
    answer = client.post("/api/orders", params={"actor": "carol"}, json={**VALID_ORDER})
    assert answer.status_code == 202, answer.text
    log = client.get("/api/audit").json()
    assert [(e["action"], e["target"], e["actor"]) for e in log] == [
        ("submit", "o1", "carol"),
        ("resubmit", "failed", "alice"),
    ]
    signed = client.get("/api/audit", params={"actor": "alice", "action": "resubmit"}).json()
    assert [e["target"] for e in signed] == ["failed"]
    refused = client.get("/api/audit", params={"action": "frobnicate"})
    assert refused.status_code == 422 and "no action 'frobnicate'" in refused.text


def test_a_bulk_run_acts_on_the_ids_its_dry_run_showed_though_newer_ones_match(client, orders):
    """The dashboard's dry run (limit 1) shows `failed`; a newer Error order comes; the run
    with the same limit and `failed`'s id still resubmits it."""
    dry = client.post("/api/orders/resubmit", json={"limit": 1}).json()
    assert [o["order_id"] for o in dry["orders"]] == ["failed"]
    orders.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    orders.submit(submitted("failed-2").model_copy(update={"workflow": STRICT.name}))
    orders.run()
    run = client.post(
        "/api/orders/resubmit", json={"limit": 1, "dry_run": False, "order_ids": ["failed"]}
    ).json()
    assert [(o["order_id"], o["outcome"]) for o in run["orders"]] == [("failed", "done")]
    assert run["not_matched"] == []
    assert orders.state("failed-2").process_state is ProcessState.ERROR  # not shown: left


def test_a_resubmit_is_audited_once_it_took_effect_whatever_fails_after(orders, monkeypatch):
    touch, calls = orders.store.touch_live, []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 2:  # the touch after the write
            raise ConcurrencyConflict("transient")
        return touch(*args, **kwargs)

    monkeypatch.setattr(orders.store, "touch_live", flaky)
    with pytest.raises(ConcurrencyConflict):
        orders.operator.resubmit("failed", actor="alice")
    assert orders.state("failed").process_state is not ProcessState.ERROR
    assert [(e.action, e.actor) for e in orders.operator.audit(10)] == [("resubmit", "alice")]

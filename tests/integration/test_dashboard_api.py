"""The dashboard's API on Azurite: counts by state, orders filtered by state / priority / age
(the real store's queries), paged, parked messages in bulk, and the page itself (self-contained,
its inline code allowed by hash, no key in its source). What the operator decides alone (bad
filters refused, the step and error filters): tests/unit/test_api_requests.py."""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from sas import bootstrap
from sas.domain.model import ProcessState
from sas.entrypoints import http_api
from sas.entrypoints.http_api import api
from sas.testing import refuse
from tests.harness import World
from tests.integration.test_poison import RAW, Poison, empty_poison_queues
from tests.unit.test_services import submitted

pytestmark = pytest.mark.integration


@pytest.fixture
def client() -> TestClient:
    return TestClient(api)


@pytest.fixture
def orders(app_env, table, strict) -> World:
    """Submitted 10 min ago: old-high (Processed, high) and failed (Error); 1 min ago:
    new-normal (Processed) and new-low (Processed, low)."""
    world = World(table)
    now = datetime.now(UTC)
    world.clock.current = now - timedelta(minutes=10)
    world.submit(submitted("old-high", priority="high"))
    world.run()
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    world.submit(submitted("failed").model_copy(update={"workflow": strict}))
    world.run()
    world.clock.current = now - timedelta(minutes=1)
    world.submit(submitted("new-normal"))
    world.submit(submitted("new-low", priority="low"))
    world.run()
    assert world.state("failed").process_state is ProcessState.ERROR
    return world


def ids(response) -> set[str]:
    assert response.status_code == 200, response.text
    return {found["order_id"] for found in response.json()}


@pytest.fixture
def poisoned(app_env, queue_service) -> Poison:
    return empty_poison_queues(queue_service)


def test_stats_count_every_state_and_the_parked_messages(client, orders, poisoned):
    bootstrap.store().park_message("sas-orders", "invalid", b"{}", datetime.now(UTC))
    poisoned.put("sas-orders", "not a message")
    body = client.get("/api/stats").json()
    assert body["states"] == {
        "Pending": 0,
        "Processing": 0,
        "Compensating": 0,
        "Processed": 3,
        "Compensated": 0,
        "Error": 1,
        "Closed": 0,
        "Cancelled": 0,
        "Terminated": 0,
    }
    # One count for both kinds: the message the app parked and the one the host gave up on.
    assert (body["parked"], body["parked_more"]) == (2, False)
    assert not {"rejected", "poisoned"} & set(body)


def test_parked_messages_of_both_kinds_are_counted_up_to_the_cap(client, poisoned, monkeypatch):
    monkeypatch.setattr(http_api, "STATS_LIST_CAP", 2)
    now = datetime.now(UTC)
    bootstrap.store().park_message("sas-orders", "invalid", b"{}", now)
    poisoned.put("sas-replies", "not a message")
    assert client.get("/api/stats").json()["parked"] == 2
    assert client.get("/api/stats").json()["parked_more"] is False
    bootstrap.store().park_message("sas-replies", "unknown order", b"{}", now)
    body = client.get("/api/stats").json()
    assert (body["parked"], body["parked_more"]) == (2, True)


def test_orders_are_filtered_by_state_priority_and_age(client, orders):
    assert ids(client.get("/api/orders")) == {"old-high", "failed", "new-normal", "new-low"}
    assert ids(client.get("/api/orders", params={"state": "Error"})) == {"failed"}
    assert ids(client.get("/api/orders", params={"priority": "low"})) == {"new-low"}
    assert ids(client.get("/api/orders", params={"older_than_seconds": 300})) == {
        "old-high",
        "failed",
    }
    assert ids(client.get("/api/orders", params={"newer_than_seconds": 300})) == {
        "new-normal",
        "new-low",
    }
    both = {"state": "Processed", "priority": "high", "older_than_seconds": 300}
    assert ids(client.get("/api/orders", params=both)) == {"old-high"}


def test_orders_come_most_recently_updated_first_up_to_the_limit(client, orders):
    response = client.get("/api/orders", params={"limit": 2})
    assert [found["order_id"] for found in response.json()] == ["new-low", "new-normal"]
    assert response.headers["x-total-count"] == "4"  # the page, and how many match in all
    only_error = client.get("/api/orders", params={"state": "Error", "limit": 1})
    assert only_error.headers["x-total-count"] == "1"


def test_orders_page_by_offset_and_are_found_between_two_instants(client, orders):
    second = client.get("/api/orders", params={"limit": 2, "offset": 2})
    assert [found["order_id"] for found in second.json()] == ["failed", "old-high"]
    assert second.headers["x-total-count"] == "4"
    assert client.get("/api/orders", params={"offset": 4}).json() == []
    now = datetime.now(UTC)
    window = {
        "submitted_from": (now - timedelta(minutes=15)).isoformat(),
        "submitted_until": (now - timedelta(minutes=5)).isoformat(),
    }
    assert ids(client.get("/api/orders", params=window)) == {"old-high", "failed"}
    recent = {"submitted_from": (now - timedelta(minutes=5)).isoformat(), "priority": "low"}
    assert ids(client.get("/api/orders", params=recent)) == {"new-low"}
    shown = client.post(
        "/api/orders/resubmit", json={**window, "dry_run": True, "actor": "ann"}
    ).json()
    assert [entry["order_id"] for entry in shown["orders"]] == ["failed"]


def test_the_dashboard_is_one_page_whose_inline_code_its_policy_allows(client, app_env):
    response = client.get("/api/dashboard")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    policy = response.headers["content-security-policy"]
    # Nothing is loaded from anywhere: no src= or href= but the API docs links of the footer.
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    for tag in ("script", "style"):
        (inline,) = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.DOTALL)
        digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
        assert f"{tag}-src 'sha256-{digest}'" in policy
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "x-functions-key" in page  # the key comes from the page's URL, never its source
    assert "innerHTML" not in page
    # One view of parked messages, on the one route for them.
    assert "/api/parked" in page and "/api/rejected" not in page and "/api/poison" not in page


def test_parked_messages_matching_are_listed_then_replayed_only_as_the_dry_run_showed(
    client, poisoned
):
    """A message parked between the dry run and the run is not acted on."""
    seen = poisoned.put("sas-agent-shipping", RAW)
    shown = client.post(
        "/api/parked/replay", json={"queue": "sas-agent-shipping", "parked_by": "host"}
    )
    assert shown.status_code == 200, shown.text
    assert shown.json()["dry_run"] is True
    assert [(m["id"], m["outcome"]) for m in shown.json()["messages"]] == [
        (seen, "would be replayed")
    ]
    came_since = poisoned.put("sas-agent-shipping", RAW)
    listed = client.get("/api/parked", params={"queue": "sas-agent-shipping", "limit": 1})
    assert listed.headers["x-total-count"] == "2" and len(listed.json()) == 1
    assert client.get("/api/parked", params={"parked_by": "app"}).json() == []
    done = client.post(
        "/api/parked/replay",
        json={"queue": "sas-agent-shipping", "dry_run": False, "ids": [seen], "actor": "ann"},
        headers={"x-ms-client-principal-name": "ann@example.com"},
    )
    assert done.status_code == 200, done.text
    assert (done.json()["matched"], done.json()["total"]) == (1, 2)
    assert done.json()["messages"][0]["outcome"] == "done"
    assert poisoned.peek("sas-agent-shipping") == [RAW]
    left = client.get("/api/parked").json()
    assert [m["id"] for m in left] == [came_since]
    gone = client.post("/api/parked/discard", json={"dry_run": False, "reason": "functions HOST"})
    assert gone.status_code == 200, gone.text
    assert [m["outcome"] for m in gone.json()["messages"]] == ["done"]
    assert client.get("/api/parked").json() == []


@pytest.mark.parametrize(
    "body",
    [{"parked_by": "nobody"}, {"limit": 0}, {"older_than_seconds": -1}, {"ids": "x"}],
)
def test_a_bad_bulk_parked_request_is_refused_and_touches_nothing(client, poisoned, body):
    kept = poisoned.put("sas-orders", RAW)
    answer = client.post("/api/parked/discard", json={"dry_run": False, **body})
    assert answer.status_code == 422
    assert [m["id"] for m in client.get("/api/parked").json()] == [kept]

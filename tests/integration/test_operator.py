"""The operator's HTTP API against Azurite: list by state, history, resubmit, close, submit, and
the messages the app parked (list with age, replay, discard); the host's:
tests/integration/test_poison.py. What the API refuses before the app acts, and a bulk
resubmit's report of an order someone else moved: tests/unit/test_api_requests.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import UpdateMode
from fastapi.testclient import TestClient

from sas import bootstrap
from sas.adapters.clients import queue_service_client
from sas.domain.errors import NotFound
from sas.domain.messages import MAX_MESSAGE_BYTES
from sas.domain.model import ProcessState
from sas.domain.wire import REJECTED_PARTITION, rejected_row_key
from sas.entrypoints.http_api import api
from sas.testing import refuse
from sas_cli.commands import run
from sas_local.devhost.queues import decode_body
from tests.harness import World
from tests.integration.test_bad_input import VALID_ORDER, body, deliver
from tests.integration.test_poison import empty_poison_queues
from tests.unit.test_services import submitted

pytestmark = pytest.mark.integration


@pytest.fixture
def failed_order(app_env, table, strict) -> str:
    world = World(table)
    world.clock.current = datetime.now(UTC) - timedelta(minutes=5)  # before the API's real clock
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    oid = "err1"
    world.submit(submitted(oid).model_copy(update={"workflow": strict}))
    world.run()
    assert world.state(oid).process_state is ProcessState.ERROR
    return oid


@pytest.fixture
def client(app_env, queue_service) -> TestClient:
    # The host's parked messages (poison queues) outlive a test: start with none, so what is
    # listed here is what this test's table holds.
    empty_poison_queues(queue_service)
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
        "claimed",
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


def test_parked_messages_are_listed_with_reason_and_body(client, app_env):
    bootstrap.store().park_message("sas-orders", "not UTF-8", b"\xff\x00", bootstrap.clock().now())
    bootstrap.store().park_message("sas-orders", "invalid", b'{"a": 1}', bootstrap.clock().now())
    listed = client.get("/api/parked").json()
    assert {(r["reason"], r["body_text"]) for r in listed} == {
        ("not UTF-8", None),
        ("invalid", '{"a": 1}'),
    }
    assert {r["body_base64"] for r in listed} >= {"/wA="}
    assert {(r["parked_by"], r["queue"], r["function"]) for r in listed} == {
        ("app", "sas-orders", "submit")
    }


# --- messages the app parked: age, replay, discard -----------------------------------------


def park(body: bytes, *, queue: str = "sas-orders", reason: str = "invalid", ago: float = 0) -> str:
    at = datetime.now(UTC) - timedelta(seconds=ago)
    return bootstrap.store().park_message(queue, reason, body, at)


def listed(client: TestClient) -> dict[str, dict[str, Any]]:
    """Every parked message (the host's poison queues were emptied: all are the app's)."""
    response = client.get("/api/parked")
    assert response.status_code == 200
    found = {r["id"]: r for r in response.json()}
    assert {r["parked_by"] for r in found.values()} <= {"app"}
    return found


def deliver_from_queue(queue: str, function: str) -> int:
    """What the Functions host does: take each message of ``queue``, decode it as host.json
    says (Base64), hand the bytes to ``function``, and delete the message once it returns."""
    raw = queue_service_client(bootstrap.settings().storage).get_queue_client(queue)
    delivered = 0
    for message in raw.receive_messages(max_messages=32):
        deliver(function, decode_body(message.content, "base64"))
        raw.delete_message(message)
        delivered += 1
    return delivered


def raw_contents(queue: str) -> list[str]:
    raw = queue_service_client(bootstrap.settings().storage).get_queue_client(queue)
    return [m.content for m in raw.peek_messages(max_messages=32)]


def test_parked_messages_show_their_age(client, app_env):
    old = park(b"{}", ago=3600)
    new = park(b"{}", ago=0)
    found = listed(client)
    assert 3590 < found[old]["age_seconds"] < 3700
    assert 0 <= found[new]["age_seconds"] < 60


def test_discard_removes_a_parked_message_for_good(client, app_env):
    gone, kept = park(b'{"a": 1}'), park(b'{"b": 2}')

    response = client.delete(f"/api/parked/{gone}")

    assert response.status_code == 200, response.text
    assert response.json() == {"id": gone, "status": "discarded"}
    assert set(listed(client)) == {kept}
    assert bootstrap.store().get_parked(gone) is None
    assert client.delete(f"/api/parked/{gone}").status_code == 404
    assert client.post(f"/api/parked/{gone}/replay").status_code == 404
    assert raw_contents("sas-orders") == []


def test_replaying_a_still_malformed_order_parks_it_again_under_a_new_id(client, app_env):
    payload = b"{this is not json"
    deliver("submit", payload)
    ((old, first),) = listed(client).items()

    response = client.post(f"/api/parked/{old}/replay")

    assert response.status_code == 200, response.text
    assert response.json() == {"id": old, "status": "replayed"}
    assert listed(client) == {}  # gone from parked before the app has seen it again
    # On the wire exactly as an application's message: Base64 of the original bytes.
    assert raw_contents("sas-orders") == [base64.b64encode(payload).decode()]
    assert deliver_from_queue("sas-orders", "submit") == 1
    ((new, again),) = listed(client).items()
    assert new != old
    assert again["body_base64"] == first["body_base64"]
    assert (again["queue"], again["reason"]) == (first["queue"], first["reason"])
    assert client.post(f"/api/parked/{old}/replay").status_code == 404


def test_a_replayed_valid_order_is_processed_by_the_app(client, app_env):
    # Parked by hand: say the submitter's status queue was refused before it was allowed.
    payload = body(order_id="replayed-1")
    parked = park(payload, reason="reply_to must match status-*")

    assert client.post(f"/api/parked/{parked}/replay").status_code == 200

    assert bootstrap.store().get_order("replayed-1") is None  # not yet: it is on the queue
    assert deliver_from_queue("sas-orders", "submit") == 1
    order = bootstrap.store().get_order("replayed-1")
    assert order is not None and order.details == VALID_ORDER["details"]
    state = bootstrap.store().get_state("replayed-1")
    assert state is not None and state.value.process_state is ProcessState.PROCESSING
    assert listed(client) == {}


def test_a_replayed_reply_reaches_its_order_once_the_order_exists(client, app_env):
    # The reply came before its order was known (parked); replayed once the order exists, the
    # app takes it: the scheduler fences it off (no step runs) and records it, parks nothing.
    reply = {
        "type": "StepReply",
        "order_id": "late-1",
        "step": "charge",
        "step_index": 1,
        "attempt": 1,
        "outcome": "ok",
    }
    deliver("on_reply", json.dumps(reply).encode())
    ((parked, first),) = listed(client).items()
    assert first["queue"] == "sas-replies" and "unknown order" in first["reason"]
    deliver("submit", body(order_id="late-1"))

    assert client.post(f"/api/parked/{parked}/replay").status_code == 200

    assert deliver_from_queue("sas-replies", "on_reply") == 1
    assert listed(client) == {}
    kinds = [entry.kind for entry in bootstrap.store().get_history("late-1")]
    assert kinds == ["submitted", "claimed", "reply_dropped"]


def test_a_truncated_body_cannot_be_replayed(client, app_env):
    huge = b"x" * (60 * 1024 * 14 + 1)  # one byte more than a parked entity keeps
    parked = park(huge, reason="oversize")
    assert listed(client)[parked]["body_truncated"] is True

    response = client.post(f"/api/parked/{parked}/replay")

    assert response.status_code == 409 and "body" in response.json()["detail"]
    assert parked in listed(client) and raw_contents("sas-orders") == []
    assert client.delete(f"/api/parked/{parked}").status_code == 200


def test_an_oversize_body_is_not_replayed_only_to_be_parked_again(client, app_env):
    parked = park(b" " * (MAX_MESSAGE_BYTES + 1), reason="oversize")
    assert client.post(f"/api/parked/{parked}/replay").status_code == 409
    assert parked in listed(client) and raw_contents("sas-orders") == []


@pytest.mark.parametrize("queue", ["sas-alerts", "someone-elses-queue", "sas-orders-poison"])
def test_replay_goes_only_to_a_queue_the_app_consumes(client, app_env, queue):
    parked = park(body(), queue=queue)
    response = client.post(f"/api/parked/{parked}/replay")
    assert response.status_code == 409 and "not a queue the app consumes" in response.text
    assert parked in listed(client)
    assert raw_contents("sas-alerts") == []


def test_a_failed_send_leaves_the_message_parked(client, app_env, monkeypatch):
    parked = park(body())

    def gone(queue: str, body: bytes, *, message_id: str) -> None:
        raise NotFound(f"queue {queue} does not exist")

    monkeypatch.setattr(bootstrap.poison(), "requeue", gone)
    response = client.post(f"/api/parked/{parked}/replay")
    assert response.status_code == 404 and "does not exist" in response.text
    assert parked in listed(client)  # sent first, dropped after: nothing lost


def test_unknown_and_malformed_parked_ids_are_404_and_only_real_ids_reach_the_store(
    client, app_env, monkeypatch
):
    real = park(body())
    missing = rejected_row_key(datetime.now(UTC), "0" * 12)
    store = bootstrap.store()
    asked: list[str] = []

    def recorded(method: Callable[[str], Any]) -> Callable[[str], Any]:
        def call(parked_id: str) -> Any:
            asked.append(parked_id)
            return method(parked_id)

        return call

    monkeypatch.setattr(store, "get_parked", recorded(store.get_parked))
    monkeypatch.setattr(store, "drop_parked", recorded(store.drop_parked))
    poison = bootstrap.poison()  # the host's: no id here is one of its ids
    monkeypatch.setattr(poison, "replay", recorded(poison.replay))
    monkeypatch.setattr(poison, "discard", recorded(poison.discard))
    malformed = (
        "nope",
        real + "x",
        real[:-1] + "G",
        real.upper(),
        real + "%0A",  # a trailing newline
        "%20" + real,
        real.replace("T", "t", 1),  # strptime would take it; one spelling per id
        real.replace("-", "--", 1),
        "a%27b",
        "%23",
    )
    for unknown in (missing, *malformed):
        for response in (
            client.post(f"/api/parked/{unknown}/replay"),
            client.delete(f"/api/parked/{unknown}"),
        ):
            assert response.status_code == 404, unknown
            assert response.json()["detail"] == "no such parked message", unknown
    assert set(asked) == {missing}  # nothing malformed was ever looked up
    assert set(listed(client)) == {real}
    assert client.delete(f"/api/parked/{real}").status_code == 200


def test_dropping_a_parked_message_is_conditional_on_what_was_read(app_env, table, monkeypatch):
    store = bootstrap.store()
    parked = park(body())
    stale = table.get_entity(REJECTED_PARTITION, parked)
    table.update_entity(
        {"PartitionKey": REJECTED_PARTITION, "RowKey": parked, "Reason": "changed"},
        mode=UpdateMode.MERGE,
    )
    monkeypatch.setattr(store, "_get", lambda partition, row: stale)  # read before the change
    assert store.drop_parked(parked) is False
    monkeypatch.undo()
    assert store.get_parked(parked) is not None  # the change won
    assert store.drop_parked(parked) is True
    assert store.drop_parked(parked) is False and store.get_parked(parked) is None


def test_the_api_queues_an_order_on_its_priority_lane_and_shows_its_priority(
    client, app_env, azurite, capsys
):
    settings = bootstrap.settings()
    urgent = {**VALID_ORDER, "order_id": "urgent-api", "priority": "high"}
    response = client.post("/api/orders", json=urgent)
    assert response.status_code == 202
    queues = queue_service_client(settings.storage)
    high = queues.get_queue_client(settings.lane("SAS_QUEUE_ORDERS", "high"))
    normal = queues.get_queue_client(settings.queue("SAS_QUEUE_ORDERS"))
    (message,) = high.receive_messages(max_messages=1)
    raw = decode_body(message.content, "base64")
    assert json.loads(raw)["priority"] == "high"
    assert list(normal.peek_messages(max_messages=5)) == []
    deliver("submit_high", raw)  # the high lane's own function, as its trigger would run it
    shown = client.get("/api/orders/urgent-api").json()
    assert shown["priority"] == "high"
    assert shown["history"][1]["kind"] == "claimed"
    assert "endpoint" in shown["history"][1]
    assert run(["status", "urgent-api"]) == 0  # the CLI reads the same store
    assert "priority high" in capsys.readouterr().out
    # The id taken by another order: refused now, not parked later; nothing sent.
    other = {**urgent, "details": {**VALID_ORDER["details"], "customer_id": "someone-else"}}
    refused = client.post("/api/orders", json=other)
    assert refused.status_code == 409 and "already used for a different order" in refused.text
    assert list(high.peek_messages(max_messages=5)) == []
    assert client.post("/api/orders", json=urgent).status_code == 202  # the same order: taken


def test_bulk_resubmit_is_a_dry_run_first_then_reports_each_order(client, failed_order):
    dry = client.post("/api/orders/resubmit", json={"actor": "ops"})
    assert dry.status_code == 200, dry.text
    listed = {entry["order_id"]: entry["outcome"] for entry in dry.json()["orders"]}
    assert dry.json()["dry_run"] is True and listed[failed_order] == "would be resubmitted"
    assert dry.json()["total"] >= dry.json()["matched"] >= 1
    # The run acts on what the dry run showed: an id it did not show is left alone.
    others = client.post(
        "/api/orders/resubmit", json={"dry_run": False, "order_ids": ["someone-else"]}
    ).json()
    assert others["orders"] == []
    assert client.get(f"/api/orders/{failed_order}").json()["process_state"] == "Error"

    # Signed in through App Service authentication: the audit trail names the user, not what
    # the page says.
    signed_in = {"x-ms-client-principal-name": "ada@contoso.com"}
    done = client.post(
        "/api/orders/resubmit",
        json={"actor": "dashboard", "dry_run": False, "order_ids": [failed_order]},
        headers=signed_in,
    ).json()
    assert {e["order_id"]: e["outcome"] for e in done["orders"]}[failed_order] == "done"
    shown = client.get(f"/api/orders/{failed_order}").json()
    assert shown["process_state"] == "Pending"
    resubmitted = [e["actor"] for e in shown["history"] if e["kind"] == "resubmitted"]
    assert resubmitted == ["ada@contoso.com"]
    again = client.post("/api/orders/resubmit", json={"dry_run": False}).json()
    assert failed_order not in {e["order_id"] for e in again["orders"]}
    for bad in ({"limit": 0}, {"priority": "urgent"}, {"older_than_seconds": -1}):
        assert client.post("/api/orders/resubmit", json=bad).status_code == 422


def test_an_error_order_is_closed_with_a_reason_once(client, failed_order):
    assert client.post(f"/api/orders/{failed_order}/close", json={}).status_code == 422
    blank = client.post(f"/api/orders/{failed_order}/close", json={"reason": "   "})
    assert blank.status_code == 422 and "reason" in blank.text
    closed = client.post(
        f"/api/orders/{failed_order}/close",
        json={"reason": "refunded by hand"},
        headers={"x-ms-client-principal-name": "ada@contoso.com"},
    )
    assert closed.status_code == 200 and closed.json()["process_state"] == "Closed"
    shown = client.get(f"/api/orders/{failed_order}").json()
    entries = [(e["actor"], e["detail"]) for e in shown["history"] if e["kind"] == "closed"]
    assert entries == [("ada@contoso.com", "refunded by hand")]
    again = client.post(f"/api/orders/{failed_order}/close", json={"reason": "again"})
    assert again.status_code == 409
    refused = client.post(f"/api/orders/{failed_order}/resubmit", json={})
    assert refused.status_code == 409  # closed means no more work
    assert client.get("/api/stats").json()["states"]["Closed"] >= 1


def test_text_that_cannot_be_written_as_utf8_is_refused_with_422_not_500(
    client, app_env, failed_order
):
    """A lone surrogate in a JSON string (``\\ud800``, as JSON may carry it): refused with the
    field named, nothing written."""

    def post(url: str, document: dict[str, Any]) -> Any:
        escaped = json.dumps(document)  # ASCII only: the surrogate travels as an escape
        return client.post(url, content=escaped, headers={"content-type": "application/json"})

    response = post("/api/orders", {**VALID_ORDER, "order_id": "h1-\ud800"})
    assert response.status_code == 422 and "order_id" in response.text
    queue = queue_service_client(bootstrap.settings().storage).get_queue_client("sas-orders")
    assert queue.peek_messages() == []
    before = client.get(f"/api/orders/{failed_order}").json()
    response = post(f"/api/orders/{failed_order}/resubmit", {"actor": "\ud800"})
    assert response.status_code == 422 and "actor" in response.text
    assert client.get(f"/api/orders/{failed_order}").json() == before

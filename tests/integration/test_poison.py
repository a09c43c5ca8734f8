"""Messages parked by the host (poison queues) in the operator view, against Azurite: list (age,
reason, body), replay, discard, through the HTTP API's parked messages (the CLI's own:
tests/integration/test_cli.py), listed together with the app's own parked messages; end to end
through the local dev host's poison path (the Functions host's behaviour: the raw message text
moved to ``<queue>-poison``); and the Storage adapter's requeue of a raw body, which replays a
message the app parked."""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueClient, QueueServiceClient
from fastapi.testclient import TestClient

from sas import bootstrap
from sas.adapters.poison_storage import StoragePoisonQueues
from sas.adapters.storage_queues import StorageQueueTransport
from sas.domain.errors import IllegalTransition, NotFound
from sas.domain.parked import poison_id
from sas.domain.wire import POISON_SUFFIX
from sas.entrypoints.http_api import api
from sas.testing import FakeClock
from sas_local.devhost.config import QueueOptions
from sas_local.devhost.loader import QueueFunction
from sas_local.devhost.queues import QueuePoller, decode_body
from tests.conftest import unique_queue
from tests.unit.test_services import submitted

pytestmark = pytest.mark.integration

BODY = b'{"type": "OrderSubmitted", "order_id": "poisoned-1"}'
RAW = base64.b64encode(BODY).decode()  # what the host moves: the Base64 text as it was
NOT_BASE64 = "this is {not} base64!"


class Poison:
    """Puts messages where the host puts them, and reads the app's queues raw."""

    def __init__(self, service: QueueServiceClient) -> None:
        self.service = service

    def raw(self, queue: str) -> QueueClient:
        return self.service.get_queue_client(queue)  # no encode policy: text as it is

    def put(self, queue: str, content: str) -> str:
        """Like the host: the raw text to ``<queue>-poison``; returns the operator id."""
        sent = self.raw(queue + POISON_SUFFIX).send_message(content)
        return poison_id(queue, sent.id)

    def peek(self, queue: str) -> list[str]:
        return [m.content for m in self.raw(queue).peek_messages(max_messages=32)]


def empty_poison_queues(queue_service: QueueServiceClient) -> Poison:
    # Poison queues outlive a test (Azurite is shared by the session): start each one empty.
    for name in bootstrap.settings().queues.values():
        client = queue_service.get_queue_client(name + POISON_SUFFIX)
        with contextlib.suppress(ResourceExistsError):
            client.create_queue()
        client.clear_messages()
    return Poison(queue_service)


@pytest.fixture
def poison(app_env, queue_service) -> Poison:
    return empty_poison_queues(queue_service)


@pytest.fixture
def client() -> TestClient:
    return TestClient(api)


def listed(client: TestClient) -> dict[str, dict[str, Any]]:
    """Every parked message: this test's table is its own, so only the host's are there unless
    the test parks one itself."""
    response = client.get("/api/parked")
    assert response.status_code == 200
    return {p["id"]: p for p in response.json()}


def test_poisoned_messages_are_listed_with_queue_age_reason_and_body(client, poison, monkeypatch):
    later = FakeClock(bootstrap.clock().now() + timedelta(hours=1))
    monkeypatch.setattr(bootstrap, "clock", lambda: later)  # the operator's injected now
    first = poison.put("sas-orders", RAW)
    second = poison.put("sas-agent-payment", NOT_BASE64)
    poison.put("sas-alerts", RAW)  # the app consumes no alerts: not its poison

    found = listed(client)

    assert set(found) == {first, second}
    orders, payment = found[first], found[second]
    assert (orders["parked_by"], orders["queue"], orders["function"], orders["transport"]) == (
        "host",
        "sas-orders",
        "submit",
        "storage",
    )
    assert orders["body_text"] == BODY.decode() and orders["body_base64"] == RAW
    assert "sas-orders-poison" in orders["reason"] and "maxDequeueCount" in orders["reason"]
    assert 3590 < orders["age_seconds"] < 3700 and orders["parked_at"] is not None  # moved at
    assert payment["function"] == "agent_payment"
    assert payment["body_text"] == NOT_BASE64
    assert "not valid Base64" in payment["reason"]
    assert client.get("/api/parked", params={"limit": 1}).json()[0]["id"] == first  # oldest


def test_replay_puts_the_identical_content_back_and_removes_it(client, poison):
    before = poison.put("sas-orders", "b3RoZXI=")
    target = poison.put("sas-orders", RAW)
    after = poison.put("sas-orders", "YWZ0ZXI=")

    response = client.post(f"/api/parked/{target}/replay")

    assert response.status_code == 200, response.text
    assert response.json() == {"id": target, "status": "replayed"}
    assert poison.peek("sas-orders") == [RAW]  # unchanged: not encoded twice
    # The others it received on the way were handed back at once, not after a lease.
    assert set(listed(client)) == {before, after}
    assert client.post(f"/api/parked/{target}/replay").status_code == 404
    assert poison.peek("sas-orders") == [RAW]


def test_an_undecodable_body_is_replayed_as_it_was(client, poison):
    target = poison.put("sas-scheduler", NOT_BASE64)
    assert client.post(f"/api/parked/{target}/replay").status_code == 200
    assert poison.peek("sas-scheduler") == [NOT_BASE64]
    assert listed(client) == {}


def test_discard_removes_it_for_good(client, poison):
    target = poison.put("sas-replies", RAW)
    kept = poison.put("sas-replies", NOT_BASE64)

    response = client.delete(f"/api/parked/{target}")

    assert response.status_code == 200, response.text
    assert response.json() == {"id": target, "status": "discarded"}
    assert set(listed(client)) == {kept}
    assert poison.peek("sas-replies") == []
    assert client.delete(f"/api/parked/{target}").status_code == 404


def test_unknown_ids_and_queues_the_app_does_not_consume_are_404(client, poison):
    alerts = poison.put("sas-alerts", RAW)  # a valid id, but not a queue the app consumes
    real = poison.put("sas-orders", RAW)
    missing = poison_id("sas-orders", "00000000-0000-0000-0000-000000000000")
    for unknown in (missing, alerts, "nope", real + "x", real[:-1]):
        for response in (
            client.post(f"/api/parked/{unknown}/replay"),
            client.delete(f"/api/parked/{unknown}"),
        ):
            assert response.status_code == 404, unknown
            assert response.json()["detail"] == "no such parked message", unknown
    assert poison.peek("sas-alerts-poison") == [RAW]
    assert set(listed(client)) == {real}


def test_the_dev_host_poisons_and_replay_brings_the_message_back(client, poison, azurite):
    """End to end: the dev host gives up on a message exactly like the Functions host, the
    operator sees it, and replay hands the function the very same message again."""
    seen: list[bytes] = []
    failing = threading.Event()
    failing.set()

    def agent_payment(msg) -> None:
        seen.append(msg.get_body())
        if failing.is_set():
            raise RuntimeError("the remote service is down")

    function = QueueFunction(
        name="agent_payment",
        arg_name="msg",
        fn=agent_payment,
        queue_name="sas-agent-payment",
        connection_setting="SasStorage",
        connection_string=azurite.connection_string,
    )
    options = QueueOptions(max_polling_interval=0.1, visibility_timeout=0, max_dequeue_count=2)
    order = submitted("poison-e2e")
    StorageQueueTransport(poison.service).send(
        "sas-agent-payment", order, message_id="m", correlation_id="poison-e2e"
    )
    poller = QueuePoller(function, options, Path())
    poller.start()
    try:
        found = _wait_for(lambda: list(listed(client).values()))
        (poisoned,) = found
        assert len(seen) == 2 and seen[0] == seen[1]  # tried maxDequeueCount times
        assert poisoned["queue"] == "sas-agent-payment"
        assert poisoned["body_base64"] == base64.b64encode(seen[0]).decode()
        failing.clear()  # the remote service is back
        assert poisoned["parked_by"] == "host" and poisoned["function"] == "agent_payment"
        assert client.post(f"/api/parked/{poisoned['id']}/replay").status_code == 200
        _wait_for(lambda: len(seen) == 3)
        assert seen[2] == seen[0]
        assert listed(client) == {}
    finally:
        poller.stop()
        poller.wait_idle(time.monotonic() + 10)


def test_the_apps_and_the_hosts_are_listed_together_oldest_first_and_found_by_id(
    client, poison, monkeypatch
):
    later = FakeClock(datetime.now(UTC) + timedelta(hours=1))
    monkeypatch.setattr(bootstrap, "clock", lambda: later)  # the operator's injected now
    store = bootstrap.store()
    now = datetime.now(UTC)
    oldest = store.park_message("sas-orders", "invalid", b"\xff\x00", now - timedelta(days=1))
    host = poison.put("sas-replies", RAW)  # moved now, by the queue's clock
    newest = store.park_message("sas-scheduler", "unknown order", BODY, now + timedelta(minutes=1))

    found = client.get("/api/parked").json()

    assert [(m["id"], m["parked_by"]) for m in found] == [
        (oldest, "app"),
        (host, "host"),
        (newest, "app"),
    ]
    app = found[0]
    assert (app["queue"], app["function"], app["transport"]) == ("sas-orders", "submit", None)
    assert (app["reason"], app["body_text"], app["body_base64"]) == ("invalid", None, "/wA=")
    assert app["delivery_count"] is None and app["body_truncated"] is False
    assert 90000 - 10 < app["age_seconds"] < 90000 + 60  # a day and the hour the clock is ahead
    assert found[2]["function"] == "schedule" and found[2]["body_text"] == BODY.decode()
    # At most ``limit`` in all, still oldest first.
    limited = client.get("/api/parked", params={"limit": 2}).json()
    assert [m["id"] for m in limited] == [oldest, host]
    assert client.get("/api/stats").json()["parked"] == 3

    # The id says which store holds it: each goes where it belongs, and only there.
    assert client.delete(f"/api/parked/{oldest}").status_code == 200
    assert store.get_parked(oldest) is None and poison.peek("sas-replies-poison") == [RAW]
    assert client.post(f"/api/parked/{host}/replay").status_code == 200
    assert poison.peek("sas-replies") == [RAW] and poison.peek("sas-replies-poison") == []
    assert [m["id"] for m in client.get("/api/parked").json()] == [newest]


def _wait_for(check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


# --- requeue: an operator replaying a message the app parked --------------------------------


def test_requeue_sends_the_raw_body_as_the_queue_trigger_expects(poison, queue_service):
    store = StoragePoisonQueues(queue_service, {"sas-orders": "submit"})
    raw_body = b"\xff\x00 not even UTF-8"

    store.requeue("sas-orders", raw_body, message_id="20261122T120000.000000Z-0123456789ab")
    store.requeue("sas-orders", BODY, message_id="20261122T120000.000000Z-0123456789ac")

    contents = poison.peek("sas-orders")
    assert contents == [base64.b64encode(raw_body).decode(), RAW]
    # What the host hands the function: exactly the bytes that were parked.
    assert [decode_body(content, "base64") for content in contents] == [raw_body, BODY]


def test_requeue_goes_only_to_a_queue_the_app_consumes(poison, queue_service):
    store = StoragePoisonQueues(queue_service, {"sas-orders": "submit"})
    for queue in ("sas-alerts", "sas-scheduler", "sas-orders-poison"):
        with pytest.raises(IllegalTransition):
            store.requeue(queue, BODY, message_id="m")
        assert poison.peek(queue) == []


def test_requeue_to_a_missing_queue_is_not_found(queue_service):
    missing = unique_queue("gone")
    store = StoragePoisonQueues(queue_service, {missing: "submit"})
    with pytest.raises(NotFound):
        store.requeue(missing, BODY, message_id="m")

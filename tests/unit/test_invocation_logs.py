"""Log records written on threads the app runs work on carry their invocation, as the Python
worker needs to forward them to the Functions host (sas/entrypoints/invocation.py): the
Supervisor's pool, and FastAPI's threadpool for sync routes."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi import FastAPI

from sas.domain.messages import OrderSubmitted
from sas.domain.workflow import StepDefinition, Workflow
from sas.entrypoints.http_api import _Attributed
from sas.entrypoints.invocation import attributed
from sas.testing import FakeClock, InMemoryQueues, InMemoryStore, instance
from tests.unit.test_services import ROUTES
from tests.workflows import registry

pytestmark = [pytest.mark.unit, pytest.mark.fast]

ERRORING = Workflow(
    "erroring",
    (StepDefinition("reserve", "inventory", "reserve", timedelta(seconds=5), max_failures=1),),
    on_failure="error",
)


class Seen(logging.Handler):
    """What the worker's handler would see: each record, its thread, and the invocation id
    in the worker's thread-local storage of the thread that emits it."""

    def __init__(self, storage: threading.local) -> None:
        super().__init__()
        self.storage = storage
        self.records: list[tuple[str, int, str | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = getattr(self.storage, "invocation_id", None)
        self.records.append((record.getMessage(), threading.get_ident(), found))


@pytest.fixture
def seen() -> Iterator[Seen]:
    handler = Seen(threading.local())  # the worker's, one per process, set per thread
    logger = logging.getLogger("sas")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_alerts_raised_on_the_supervisor_s_pool_carry_the_invocation(seen: Seen) -> None:
    store, clock = InMemoryStore(), FakeClock()
    queues = InMemoryQueues(clock)
    app = instance(store, queues, ROUTES, clock, registry(ERRORING))
    for n in range(6):
        order = OrderSubmitted(order_id=f"o{n}", workflow="erroring", details={}, reply_to=None)
        app.submit(order)
    for lane in ROUTES.consumed:  # every request lost: nothing holds the Supervisor off
        queues.take(lane)
    clock.advance(60)
    seen.storage.invocation_id = "inv-1"  # as the worker sets it in the invocation's thread
    with attributed(seen.storage, "inv-1"):
        report = app.sweep(parallelism=4)
    assert report["error"] == 6
    assert {type(outcome) for outcome in report} == {str}  # the sweep's log line shows 'error'
    alerts = [r for r in seen.records if r[0].startswith("sas.operator_alert")]
    assert len(alerts) == 6
    assert all(thread != threading.get_ident() for _, thread, _ in alerts)  # the pool's
    assert {found for _, _, found in alerts} == {"inv-1"}


def test_a_sync_route_s_records_carry_the_request_s_invocation(seen: Seen) -> None:
    api = FastAPI()

    @api.get("/work")
    def work() -> dict[str, str]:  # a sync route: FastAPI runs it on its threadpool
        logging.getLogger("sas.test").warning("sas.route_worked")
        return {}

    asyncio.run(_request(_Attributed(api), seen.storage, "inv-2"))
    worked = [r for r in seen.records if r[0] == "sas.route_worked"]
    assert [found for _, _, found in worked] == ["inv-2"]


async def _request(app: Any, storage: threading.local, invocation_id: str) -> None:
    """One GET through ``app`` with the scope the Functions worker's ASGI middleware builds."""
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/work",
        "raw_path": b"/work",
        "query_string": b"",
        "root_path": "",
        "headers": [],
        "scheme": "http",
        "server": ("localhost", 80),
        "http_version": "1.1",
        "azure_functions.thread_local_storage": storage,
        "azure_functions.invocation_id": invocation_id,
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 200

"""A tiny v2-model function app for the dev host's end-to-end tests.

Every function records what it saw as a JSON message on the queue named by the setting
``TEST_RESULTS_QUEUE`` (connection ``TEST_STORAGE``), so tests can observe invocations from
outside the dev host's processes. Queue names and the timer schedule come from ``%Settings%``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import azure.functions as func
from azure.storage.queue import QueueClient
from fastapi import FastAPI, Request

api = FastAPI()


@api.get("/hello/{name}")
def hello(name: str) -> dict[str, Any]:
    return {"hello": name, "instance": os.environ.get("SAS_INSTANCE_ID")}


@api.post("/echo")
async def echo(request: Request) -> dict[str, Any]:
    body = await request.body()
    return {"echo": body.decode(), "path": request.url.path, "query": request.url.query}


app = func.AsgiFunctionApp(app=api, http_auth_level=func.AuthLevel.FUNCTION)
bp = func.Blueprint()

_local = threading.local()


def _results() -> QueueClient:
    client: QueueClient | None = getattr(_local, "client", None)
    if client is None:
        client = _local.client = QueueClient.from_connection_string(
            os.environ["TEST_STORAGE"], os.environ["TEST_RESULTS_QUEUE"]
        )
    return client


def _record(kind: str, **fields: Any) -> None:
    entry = {
        "kind": kind,
        "pid": os.getpid(),
        "instance": os.environ.get("SAS_INSTANCE_ID"),
        "at": time.time(),
        **fields,
    }
    _results().send_message(json.dumps(entry))


@bp.queue_trigger(arg_name="msg", queue_name="%TEST_QUEUE%", connection="TEST_STORAGE")
def record(msg: func.QueueMessage) -> None:
    delay = float(os.environ.get("TEST_RECORD_SLEEP", "0"))
    if delay:
        time.sleep(delay)
    _record(
        "record",
        body=msg.get_body().decode("utf-8"),
        message_id=msg.id,
        dequeue_count=msg.dequeue_count,
    )


@bp.queue_trigger(arg_name="msg", queue_name="%TEST_FAIL_QUEUE%", connection="TEST_STORAGE")
def always_fail(msg: func.QueueMessage) -> None:
    _record("fail", body=msg.get_body().decode("utf-8"), dequeue_count=msg.dequeue_count)
    raise RuntimeError("always_fail fails on purpose")


@bp.timer_trigger(schedule="%TEST_TIMER_SCHEDULE%", arg_name="timer", run_on_startup=False)
def tick(timer: func.TimerRequest) -> None:
    _record("tick", past_due=timer.past_due)


@bp.route(route="plain/{id:int}", methods=["GET", "POST"])
def plain(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    payload = {
        "method": req.method,
        "route_params": dict(req.route_params),
        "params": dict(req.params),
        "body": req.get_body().decode(),
        "function": context.function_name,
    }
    return func.HttpResponse(json.dumps(payload), status_code=201, mimetype="application/json")


if os.environ.get("TEST_SERVICEBUS") == "1":

    @bp.service_bus_queue_trigger(arg_name="msg", queue_name="orders", connection="TEST_BUS")
    def from_service_bus(msg: func.ServiceBusMessage) -> None:
        raise AssertionError("the dev host must refuse serviceBusTrigger")


app.register_functions(bp)

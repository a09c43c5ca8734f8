"""An application of its own, run through function_app.py's queue functions on Azurite in this
process (``python -m tests.integration.declared_app``, settings in the environment): a
``setup`` workflow of Python agents, declared here (``SAS_WORKFLOWS_MODULE``).

Prints one JSON document: each order's final state and the effects the agents applied.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import time
from collections import Counter
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict

from sas.actions import ActionContext, PythonAgent, Refused, Transient
from sas.domain.workflow import Registry, StepDefinition, Workflow


class Account(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    plan: str


EFFECTS: Counter[str] = Counter()
"""Effects applied, by idempotency key: an effect twice would count 2."""
_applied: set[str] = set()
_faults: Counter[str] = Counter()


def _apply(context: ActionContext, what: str) -> dict[str, Any]:
    if context.idempotency_key not in _applied:  # the provider's own de-duplication
        _applied.add(context.idempotency_key)
        EFFECTS[f"{what}:{context.order_id}"] += 1
    return {"done": what, "left_s": round(context.time_left(), 1)}


def provision(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    if data["name"].startswith("flaky") and _faults[context.order_id] < 1:
        _faults[context.order_id] += 1
        raise Transient("cloud busy", retry_after=0.1)
    return _apply(context, "provision")


def deprovision(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    assert data["original_result"]["done"] == "provision"
    return _apply(context, "deprovision")


def configure(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    if data["plan"] == "forbidden":
        raise Refused("plan not allowed")
    return _apply(context, "configure")


def send(context: ActionContext, data: dict[str, Any]) -> None:
    _apply(context, "notify")


_BUDGET = timedelta(seconds=12)
SETUP = Workflow(
    "setup",
    (
        StepDefinition("provision", "cloud", "provision", _BUDGET, undo="deprovision"),
        StepDefinition("configure", "cloud", "configure", _BUDGET),
        StepDefinition("notify", "mailer", "send", _BUDGET),
    ),
    pickup_budget=timedelta(seconds=30),
    input=Account,
)
REGISTRY = Registry(
    (SETUP,),
    python_agents=(
        PythonAgent(
            "cloud", {"provision": provision, "deprovision": deprovision, "configure": configure}
        ),
        PythonAgent("mailer", {"send": send}),
    ),
)

ORDERS = {"a1": ("flaky-1", "basic"), "a2": ("plain-2", "forbidden"), "a3": ("bad", 7)}


def main() -> None:
    from azure.data.tables import TableClient
    from azure.functions.queue import QueueMessage
    from azure.storage.queue import QueueClient

    from sas import bootstrap
    from sas_local.provision import provision as create_queues

    settings = bootstrap.settings()
    create_queues(settings)
    conn = settings.storage.connection_string
    assert conn is not None
    functions = _functions()
    orders = QueueClient.from_connection_string(conn, settings.queues["SAS_QUEUE_ORDERS"])
    for order_id, (name, plan) in ORDERS.items():
        document = {"type": "OrderSubmitted", "order_id": order_id, "workflow": "setup",
                    "details": {"name": name, "plan": plan}}  # fmt: skip
        orders.send_message(base64.b64encode(json.dumps(document).encode()).decode())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        moved = 0
        for queue, function in functions.items():
            client = QueueClient.from_connection_string(conn, queue)
            for message in client.receive_messages(max_messages=32, visibility_timeout=30):
                body = base64.b64decode(message.content)
                function(QueueMessage(id=message.id, body=body, dequeue_count=1))
                client.delete_message(message)
                moved += 1
        if not moved:
            break
    table = TableClient.from_connection_string(conn, settings.table_name)
    states = {
        row["PartitionKey"]: row["ProcessState"]
        for row in table.query_entities("RowKey eq 'state'")
    }
    parked = [row["Reason"] for row in table.query_entities("PartitionKey eq '~rejected'")]
    agents = sorted(settings.remote_urls)
    # Run as __main__, this file is a module apart from the one the app imported by name.
    from tests.integration.declared_app import EFFECTS as applied

    report = {"states": states, "effects": applied, "parked": parked, "agents": agents}
    print(json.dumps({**report, "queues": sorted(functions)}))


def _functions() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("function_app", "function_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = {}
    for function in module.app.get_functions():
        queue = getattr(function.get_trigger(), "queue_name", None)
        if queue is not None:
            found[queue] = function.get_user_function()
    return found


if __name__ == "__main__":
    main()

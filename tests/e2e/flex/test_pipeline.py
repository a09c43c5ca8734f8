"""The whole pipeline: function_app.py as Flex Consumption runs it, Azurite, the simulator.

Every function runs in processes of its own (only the HTTP functions share an instance), so no
function's work can lean on what another function left in a process: a marker held, a state
remembered, a router's load (sas_local/stack.py). The stack is the package's
(conftest.py), shared with the other Flex modules."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import TextBase64DecodePolicy

from sas.adapters.clients import queue_service_client
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.messages import StatusEvent, StepReply, decode
from sas.domain.model import ProcessState
from sas.domain.parked import ParkedMessage
from sas.domain.wire import submission_message_id
from sas.settings import QUEUE_ORDERS, QUEUE_REPLIES
from sas_local.demo import demo_order, demo_workspace
from sas_local.devhost.logs import DROPPED
from sas_local.ledger import app_effects, check_effects, fetch_ledger
from sas_local.processes import wait_until
from sas_local.stack import AGENT_FUNCTIONS, QUEUE_FUNCTIONS, LocalStack
from tests.e2e.flex.conftest import FLEX_STATUS_QUEUE, STATUS_QUEUE
from workflows import REGISTRY
from workflows.order import ORDER_WORKFLOW

pytestmark = pytest.mark.e2e

ORDERS = 50
BOTH_WORKFLOWS_ORDERS = 8


@pytest.fixture(scope="module")
def processed_batch(stack, store, transport) -> list[str]:
    orders = [  # this submitter asks for every step's progress, not only the outcome
        demo_order(i, "e2e", reply_to=STATUS_QUEUE).model_copy(update={"status_events": "steps"})
        for i in range(ORDERS)
    ]
    for order in orders:
        transport.send(
            stack.settings.queue(QUEUE_ORDERS),
            order,
            message_id=order.order_id,
            correlation_id=order.order_id,
        )
    ids = [order.order_id for order in orders]

    def all_processed() -> bool:
        return all(
            (found := store.get_state(order_id)) is not None
            and found.value.process_state is ProcessState.PROCESSED
            for order_id in ids
        )

    wait_until(all_processed, timeout=180, interval=0.5, what=f"{ORDERS} orders Processed")
    return ids


def ledger_effects(simulator_url: str) -> list[Any]:
    effects = fetch_ledger(simulator_url)["effects"]
    assert isinstance(effects, list)
    return effects


def queue_empty(stack, name: str) -> bool:
    client = queue_service_client(stack.settings.storage).get_queue_client(name)
    return client.get_queue_properties().approximate_message_count == 0


def test_fifty_orders_reach_processed_and_each_effect_is_applied_once(
    stack, store, processed_batch
):
    outcomes = {
        order_id: store.get_state(order_id).value.process_state for order_id in processed_batch
    }
    assert set(outcomes.values()) == {ProcessState.PROCESSED}
    ours = [e for e in ledger_effects(stack.simulator_url) if e["order_id"] in outcomes]
    report = check_effects({"effects": ours}, outcomes, ORDER_WORKFLOW)
    assert report.problems == []
    assert report.effects == ORDERS * len(ORDER_WORKFLOW.steps)
    keys = [effect["idempotency_key"] for effect in ours]
    assert len(keys) == len(set(keys))
    for order_id in processed_batch:
        state = store.get_state(order_id).value
        assert state.attempt == len(ORDER_WORKFLOW.steps)  # one claim per step, no retries
        assert state.locked_by is None and state.complete_by is None
        assert [step.name for step in store.get_steps(order_id)] == ["reserve", "charge", "ship"]


def test_the_submitter_gets_status_events_for_every_order(stack, processed_batch):
    queue = queue_service_client(stack.settings.storage).get_queue_client(
        STATUS_QUEUE, message_decode_policy=TextBase64DecodePolicy()
    )
    seen: dict[str, list[str]] = {}

    def drained() -> bool:
        batch = list(queue.receive_messages(messages_per_page=32, max_messages=32))
        for message in batch:
            event = decode(StatusEvent, message.content)
            seen.setdefault(event.order_id, []).append(event.status)
            queue.delete_message(message)
        return not batch and len(seen) == ORDERS

    wait_until(drained, timeout=60, interval=0.1, what="status events")
    for order_id in processed_batch:
        statuses = seen[order_id]
        assert statuses.count("received") == 1 and statuses.count("completed") == 1
        assert statuses.count("step_completed") == len(ORDER_WORKFLOW.steps)


def test_a_reply_for_an_old_attempt_delivered_by_hand_is_ignored(
    stack, store, transport, processed_batch
):
    order_id = processed_batch[0]
    before = store.get_state(order_id)
    effects_before = len(ledger_effects(stack.simulator_url))
    stale = StepReply(
        order_id=order_id,
        step="reserve",
        step_index=0,
        attempt=1,
        outcome="ok",
        result={"x": 1},
        incarnation=before.value.incarnation,
    )
    replies = stack.settings.queue(QUEUE_REPLIES)
    transport.send(replies, stale, message_id="stale", correlation_id=order_id)
    wait_until(lambda: queue_empty(stack, replies), timeout=30, what="stale reply consumed")
    wait_until(
        lambda: "sas.reply_stale" in stack.stderr(),
        timeout=10,
        what="sas.reply_stale logged",
    )
    assert store.get_state(order_id) == before  # same ETag: nothing written
    assert store.get_steps(order_id)[0].result != {"x": 1}
    assert len(ledger_effects(stack.simulator_url)) == effects_before


def test_the_http_api_returns_an_orders_state(stack, processed_batch):
    order_id = processed_batch[1]
    response = httpx.get(f"{stack.api_url}/api/orders/{order_id}", timeout=10)
    assert response.status_code == 200
    body = response.json()
    assert body["order_id"] == order_id
    assert body["process_state"] == "Processed"
    assert [step["name"] for step in body["steps"]] == ["reserve", "charge", "ship"]
    assert httpx.get(f"{stack.api_url}/api/orders/nope", timeout=10).status_code == 404
    assert httpx.get(f"{stack.api_url}/api/orders/bad%2Fid", timeout=10).status_code in (404, 422)


def test_a_malformed_order_is_parked_with_its_body_and_settled(stack, store):
    orders = stack.settings.queue(QUEUE_ORDERS)
    body = b'{"type": "OrderSubmitted", "order_id": "../../etc", "hostile": true}'
    raw = queue_service_client(stack.settings.storage).get_queue_client(orders)
    raw.send_message(base64.b64encode(body).decode())

    def parked() -> ParkedMessage | None:
        return next((p for p in store.list_parked() if p.body == body), None)

    found = wait_until(parked, timeout=30, what="bad message parked")
    assert (found.parked_by, found.queue) == ("app", orders)
    assert "order_id" in found.reason
    wait_until(lambda: queue_empty(stack, orders), timeout=30, what="bad message settled")
    poison = queue_service_client(stack.settings.storage).get_queue_client(f"{orders}-poison")
    with contextlib.suppress(ResourceNotFoundError):  # never created: nothing was poisoned
        assert poison.get_queue_properties().approximate_message_count == 0


def test_the_cli_follows_the_local_run_with_the_settings_it_wrote(stack, processed_batch):
    # LocalStack writes the settings its dev host runs on beside its logs (.sas-run for
    # `make run`): the operator CLI, a separate process, reads them there.
    written = stack.devhost.log_dir.parent / "local.settings.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAS_", "SasStorage"))}
    done = subprocess.run(
        [sys.executable, "-m", "sas_cli", "--settings", str(written), "--json", "list",
         "--state", "Processed", "--limit", "1000"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(processed_batch) <= {state["order_id"] for state in json.loads(done.stdout)}


def test_every_function_runs_in_processes_of_its_own(stack: LocalStack) -> None:
    served = sorted(tuple(host.functions) for host in stack.hosts)
    expected = [("http_app_func",), ("supervise",), *((f,) for f in QUEUE_FUNCTIONS)]
    expected += [(f,) for f in AGENT_FUNCTIONS]
    assert served == sorted(expected)
    pids = [pid for host in stack.hosts for pid in host.worker_pids()]
    assert len(pids) == len(set(pids)) == len(stack.hosts)


def test_both_workflows_finish_with_each_function_apart(stack: LocalStack) -> None:
    settings = stack.settings
    transport = StorageQueueTransport(queue_service_client(settings.storage))
    batch = [demo_order(i, "flex", FLEX_STATUS_QUEUE) for i in range(BOTH_WORKFLOWS_ORDERS)]
    batch += [
        demo_workspace(i, "flex", FLEX_STATUS_QUEUE, refusals=False)
        for i in range(BOTH_WORKFLOWS_ORDERS)
    ]
    for order in batch:
        transport.send(
            settings.lane(QUEUE_ORDERS, order.priority),
            order,
            message_id=submission_message_id(order.order_id),
            correlation_id=order.order_id,
        )
    store = TableStateStore.connect(settings.storage, settings.table_name)
    outcomes: dict[str, ProcessState] = {}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(outcomes) < len(batch):
        for order in batch:
            found = store.get_state(order.order_id)
            if found is not None and found.value.is_terminal:
                outcomes[order.order_id] = found.value.process_state
        time.sleep(1)
    assert len(outcomes) == len(batch), f"unfinished: {len(batch) - len(outcomes)}"
    assert set(outcomes.values()) == {ProcessState.PROCESSED}
    ledger = fetch_ledger(stack.simulator_url)
    effects = app_effects(settings.storage.connection_string or "", REGISTRY.tables)
    ours = {order.order_id for order in batch}  # the stack's other tests ran orders too
    every = [*ledger["effects"], *effects]  # type: ignore[misc]
    ledger["effects"] = [effect for effect in every if effect["order_id"] in ours]
    flows = {order.order_id: REGISTRY.named(order.workflow) for order in batch}
    report = check_effects(ledger, outcomes, flows)
    assert report.ok, report.problems
    assert report.effects == 6 * BOTH_WORKFLOWS_ORDERS  # three steps each, both workflows


def test_every_app_record_would_reach_the_functions_host(stack: LocalStack) -> None:
    """No record of the app was written where the worker finds no invocation (the dev host
    marks those as the Functions host would drop them: sas_local/devhost/logs.py)."""
    dropped = [
        line
        for host in stack.hosts
        for line in host.stderr().splitlines()
        if f"{DROPPED}=1" in line
    ]
    assert dropped == []

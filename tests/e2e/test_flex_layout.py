"""The pipeline as Flex Consumption runs it: every function in processes of its own (only the
HTTP functions share an instance), so no function's work can lean on what another function
left in a process: a marker held, a state remembered, a router's load (sas_local/stack.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sas.adapters.clients import queue_service_client
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.model import ProcessState
from sas.domain.wire import submission_message_id
from sas.settings import QUEUE_ORDERS
from sas_local.demo import demo_order, demo_workspace
from sas_local.devhost.logs import DROPPED
from sas_local.ledger import app_effects, check_effects, fetch_ledger
from sas_local.stack import AGENT_FUNCTIONS, QUEUE_FUNCTIONS, LocalStack
from workflows import REGISTRY

pytestmark = pytest.mark.e2e

STATUS_QUEUE = "status-flex"
ORDERS = 8


@pytest.fixture(scope="module")
def flex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    logs: Path = tmp_path_factory.mktemp("flex")
    with LocalStack.start(
        layout="flex", workers=1, log_dir=logs, extra_queues=(STATUS_QUEUE,)
    ) as stack:
        yield stack


def test_every_function_runs_in_processes_of_its_own(flex: LocalStack) -> None:
    served = sorted(tuple(host.functions) for host in flex.hosts)
    expected = [("http_app_func",), ("supervise",), *((f,) for f in QUEUE_FUNCTIONS)]
    expected += [(f,) for f in AGENT_FUNCTIONS]
    assert served == sorted(expected)
    pids = [pid for host in flex.hosts for pid in host.worker_pids()]
    assert len(pids) == len(set(pids)) == len(flex.hosts)


def test_both_workflows_finish_with_each_function_apart(flex: LocalStack) -> None:
    settings = flex.settings
    transport = StorageQueueTransport(queue_service_client(settings.storage))
    batch = [demo_order(i, "flex", STATUS_QUEUE) for i in range(ORDERS)]
    batch += [demo_workspace(i, "flex", STATUS_QUEUE, refusals=False) for i in range(ORDERS)]
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
    ledger = fetch_ledger(flex.simulator_url)
    effects = app_effects(settings.storage.connection_string or "", REGISTRY.tables)
    ledger["effects"] = [*ledger["effects"], *effects]  # type: ignore[misc]
    flows = {order.order_id: REGISTRY.named(order.workflow) for order in batch}
    report = check_effects(ledger, outcomes, flows)
    assert report.ok, report.problems
    assert report.effects == 6 * ORDERS  # three steps each, both workflows


def test_every_app_record_would_reach_the_functions_host(flex: LocalStack) -> None:
    """No record of the app was written where the worker finds no invocation (the dev host
    marks those as the Functions host would drop them: sas_local/devhost/logs.py)."""
    dropped = [
        line for host in flex.hosts for line in host.stderr().splitlines() if f"{DROPPED}=1" in line
    ]
    assert dropped == []

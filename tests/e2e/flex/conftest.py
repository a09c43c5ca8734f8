"""One stack for every test here: function_app.py as Flex Consumption runs it (each function in
processes of its own, only the HTTP functions share an instance), Azurite, the simulator.

Starting one costs 24 dev hosts; the modules share it, each set up for all of them: the
status queues the pipeline's submitters read, two payment endpoints sharing one ledger, low
orders yielding to a 1 s backlog, and finished spans captured for the tracing test. Each
module leaves the simulator's faults as it found them (none) and judges only its own orders.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sas.adapters.clients import queue_service_client
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.settings import LOW_PRIORITY_BACKLOG
from sas_local.devhost.worker import PRELOAD_ENV
from sas_local.ledger import configure_faults
from sas_local.span_capture import CAPTURE_DIR_ENV
from sas_local.stack import LocalStack

STATUS_QUEUE = "status-e2e"
FLEX_STATUS_QUEUE = "status-flex"
PAYMENT_ENDPOINTS = {
    "payment": [{"name": "west", "capacity": 16}, {"name": "north", "capacity": 16}]
}


@pytest.fixture(scope="package")
def spans_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spans")


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory, spans_dir: Path) -> Iterator[LocalStack]:
    env = {
        PRELOAD_ENV: "sas_local.span_capture",
        CAPTURE_DIR_ENV: str(spans_dir),
        # Low orders yield once a higher lane's oldest message has waited 1 s (5 s by
        # default), so a backlog of a couple of hundred orders on this machine is enough.
        LOW_PRIORITY_BACKLOG: "1",
    }
    with LocalStack.start(
        layout="flex",
        workers=1,  # one instance per function: competing instances under faults are chaos's
        log_dir=tmp_path_factory.mktemp("stack"),
        extra_queues=(STATUS_QUEUE, FLEX_STATUS_QUEUE),
        endpoints=PAYMENT_ENDPOINTS,
        env_overrides=env,
    ) as running:
        yield running


@pytest.fixture(scope="module", autouse=True)
def no_faults_left(stack: LocalStack) -> Iterator[None]:
    """Whatever a module's tests injected ends with it: the next module starts fault-free."""
    configure_faults(stack.simulator_url, {})
    yield
    configure_faults(stack.simulator_url, {})


@pytest.fixture(scope="package")
def store(stack: LocalStack) -> TableStateStore:
    return TableStateStore.connect(stack.settings.storage, stack.settings.table_name)


@pytest.fixture(scope="package")
def transport(stack: LocalStack) -> StorageQueueTransport:
    return StorageQueueTransport(queue_service_client(stack.settings.storage))

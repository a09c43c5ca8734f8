"""The first sends and peeks of a process, from many threads at once, all succeed
(sas/adapters/queue_models.py).

Each case runs in a fresh interpreter (the SDK's models are filled in once per process), with
the thread switch interval at a microsecond so the threads interleave as much as they can: on
the SDK alone about one such process in ten failed a send, so PROCESSES of them miss a
regression about one time in ten."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from azure.storage.queue import QueueServiceClient

from sas_local.azurite import Azurite
from sas_local.processes import REPO_ROOT
from tests.conftest import unique_queue

pytestmark = pytest.mark.integration

THREADS = 16
PROCESSES = 24

_FIRST_SENDS = textwrap.dedent(
    """
    import json, sys, threading
    sys.setswitchinterval(1e-6)
    from concurrent.futures import ThreadPoolExecutor
    from sas.adapters.clients import queue_service_client
    from sas.adapters.storage_queues import StorageQueueTransport
    from sas.domain.messages import ScheduleRequest
    from sas.settings import Connection

    connection_string, queue, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    transport = StorageQueueTransport(
        queue_service_client(Connection("SasStorage", connection_string=connection_string))
    )
    barrier = threading.Barrier(threads)

    def first_send(n):
        barrier.wait()
        try:
            message = ScheduleRequest(order_id=f"first-{n}")
            transport.send(queue, message, message_id=f"m{n}", correlation_id=f"first-{n}")
            return None
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def first_peek(n):
        barrier.wait()
        try:
            transport.waiting(queue)
            return None
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(threads) as pool:
        errors = [e for e in pool.map(first_send, range(threads)) if e]
        errors += [e for e in pool.map(first_peek, range(threads)) if e]
    print(json.dumps({"errors": errors}))
    """
)


def test_many_threads_sending_and_peeking_first_in_fresh_processes_all_succeed(
    azurite: Azurite, queue_service: QueueServiceClient
) -> None:
    queue = unique_queue("first")
    service = queue_service
    service.create_queue(queue)
    outcomes = []
    for _ in range(PROCESSES):
        done = subprocess.run(
            [sys.executable, "-c", _FIRST_SENDS, azurite.connection_string, queue, str(THREADS)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        outcomes.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [o["errors"] for o in outcomes] == [[]] * PROCESSES
    properties = service.get_queue_client(queue).get_queue_properties()
    assert properties.approximate_message_count == THREADS * PROCESSES

"""Azurite's raw rates for the operations an order uses, measured in the benchmark's own run.

Each kind of request runs for a few seconds from ``processes`` processes of ``threads`` threads,
each thread with its own client: the Python client, not Azurite, is what one process saturates
first (its SDK pipeline holds the GIL), and the dev host also runs several worker processes. The
figures are what the store serves here, not what sas achieves.
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ServiceResponseError
from azure.data.tables import TableClient, TableServiceClient, UpdateMode
from azure.storage.queue import QueueClient, QueueServiceClient

from sas.adapters.storage_queues import first_calls_alone, sent
from sas_local.bench.resets import retried

RATE_TABLE = "benchrates"
RATE_QUEUE = "bench-rates"
KINDS = (
    "table.transaction",
    "table.point_read",
    "table.update",
    "table.insert",
    "table.upsert",
    "table.delete",
    "table.query",
    "queue.send",
    "queue.receive",
    "queue.delete",
)
HOST_BATCH = 16
"""Messages one host receive fetches under load (host.json ``batchSize``)."""


def _entity(partition: str, row: str) -> dict[str, Any]:
    # About the size of a state row: a dozen short properties.
    entity: dict[str, Any] = {"PartitionKey": partition, "RowKey": row}
    entity.update({f"Field{n:02d}": f"value-{n}-{partition[:8]}" for n in range(12)})
    return entity


def _etag(table: TableClient, entity: dict[str, Any]) -> str:
    got = retried(partial(table.get_entity, entity["PartitionKey"], entity["RowKey"]))
    if got is None:  # a read has no "landed" answer: retried returns it or raises
        raise RuntimeError(f"no entity {entity['PartitionKey']}")
    return str(got.metadata["etag"])


def _phase(kind: str, connection_string: str, threads: int, seconds: float, tag: str) -> float:
    """One process: ``threads`` threads doing ``kind`` for ``seconds``; returns requests/s."""
    tables = [
        TableClient.from_connection_string(connection_string, RATE_TABLE) for _ in range(threads)
    ]
    queues = [
        QueueClient.from_connection_string(connection_string, RATE_QUEUE) for _ in range(threads)
    ]
    prepared: list[list[Any]] = [[] for _ in range(threads)]
    body = base64.b64encode(b'{"type":"ScheduleRequest","v":1,"order_id":"bench"}').decode()

    # Untimed preparation, so each timed request has what it needs.
    def prepare(thread: int) -> None:
        table, queue = tables[thread], queues[thread]
        exists = (ResourceExistsError,)  # on a later try: the lost first one was applied
        for n in range(30):
            partition = f"{tag}-{thread}-{n}"
            if kind in ("table.point_read", "table.delete"):
                retried(partial(table.create_entity, _entity(partition, "state")), exists)
                prepared[thread].append(partition)
            elif kind == "table.update":
                entity = _entity(f"{tag}-{thread}", "u")
                retried(partial(table.create_entity, entity), exists)
                prepared[thread] = [_etag(table, entity)]
                break
            elif kind == "table.query":
                retried(partial(table.upsert_entity, _entity(f"~{tag}", f"{thread}-{n}")))
            elif kind in ("queue.receive", "queue.delete"):
                send = partial(queue.send_message, body)
                retried(partial(first_calls_alone, "send_message", send, decoded=sent))
        if kind == "queue.delete":
            for _ in range(30):
                received = partial(_received, queue, max_messages=1)
                got = retried(partial(first_calls_alone, "receive_messages", received))
                prepared[thread].extend(got or [])

    def one(thread: int, n: int) -> bool:
        table, queue = tables[thread], queues[thread]
        if kind == "table.transaction":
            partition = f"{tag}-{thread}-t{n}"
            table.submit_transaction(
                [("create", _entity(partition, "order")), ("create", _entity(partition, "state"))]
            )
        elif kind == "table.point_read":
            table.get_entity(prepared[thread][n % len(prepared[thread])], "state")
        elif kind == "table.update":
            prepared[thread][0] = table.update_entity(
                _entity(f"{tag}-{thread}", "u"),
                mode=UpdateMode.MERGE,
                etag=prepared[thread][0],
                match_condition=MatchConditions.IfNotModified,
            )["etag"]
        elif kind == "table.insert":
            table.create_entity(_entity(f"{tag}-{thread}-i{n}", "marker"))
        elif kind == "table.upsert":
            table.upsert_entity(_entity(f"~{tag}", f"{thread}-{n % 100}"))
        elif kind == "table.delete":
            if not prepared[thread]:
                return False
            table.delete_entity(prepared[thread].pop(), "state")
        elif kind == "table.query":
            list(table.query_entities("PartitionKey eq @pk", parameters={"pk": f"~{tag}"}))
        elif kind == "queue.send":
            first_calls_alone("send_message", partial(queue.send_message, body), decoded=sent)
        elif kind == "queue.receive":
            received = partial(_received, queue, max_messages=1, visibility_timeout=300)
            got = first_calls_alone("receive_messages", received)
            if not got:
                return False
        elif kind == "queue.delete":
            if not prepared[thread]:
                return False
            queue.delete_message(prepared[thread].pop())
        return True

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(prepare, range(threads)))
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def worker(thread: int) -> None:
        n = 0
        while time.monotonic() < stop:
            try:
                done = one(thread, n)
            except ServiceResponseError:  # its answer lost (resets.py): not counted
                if kind == "table.update":  # the chain's ETag, if the update was applied
                    prepared[thread][0] = _etag(tables[thread], _entity(f"{tag}-{thread}", "u"))
                n += 1
                continue
            if done:
                counts[thread] += 1
            elif kind in ("table.delete", "queue.delete", "queue.receive"):
                break  # nothing left: stop timing this thread
            n += 1

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))
    return sum(counts) / (time.monotonic() - started)


def measure(
    connection_string: str, *, processes: int = 4, threads: int = 4, seconds: float = 5.0
) -> dict[str, float]:
    """Requests/s for each kind the request counter reports, on a queue kept short."""
    tables = TableServiceClient.from_connection_string(connection_string)
    retried(partial(tables.create_table_if_not_exists, RATE_TABLE))
    service = QueueServiceClient.from_connection_string(connection_string)
    with contextlib.suppress(ResourceExistsError):
        service.create_queue(RATE_QUEUE)
    rates: dict[str, float] = {}
    with ProcessPoolExecutor(processes) as pool:
        for kind in KINDS:
            # Deletes and receives stop when their prepared work is used up; short phases.
            tag = f"r{uuid.uuid4().hex[:8]}"
            futures = [
                pool.submit(_phase, kind, connection_string, threads, seconds, f"{tag}p{p}")
                for p in range(processes)
            ]
            rates[kind] = round(sum(future.result() for future in futures), 1)
            service.get_queue_client(RATE_QUEUE).clear_messages()
    return rates


_SAME_COST_AS = {
    "table": "table.update",
    "breaker.read": "table.point_read",
    "breaker.write": "table.update",
    "clock.read": "table.point_read",
}
"""A kind whose rate was not measured costs about what this measured kind costs."""


def best(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each kind's best rate over several measurements of the same store."""
    return {
        kind: max(run[kind] for run in runs if kind in run)
        for kind in dict.fromkeys(kind for run in runs for kind in run)
    }


def order_limit(per_order: dict[str, float], rates: dict[str, float]) -> float | None:
    """Orders/s the raw rates allow for one order's requests: 1 / sum(count / rate).

    Receives are counted at the host's batch size: under load one receive fetches up to
    ``HOST_BATCH`` messages."""
    seconds = 0.0
    for kind, count in per_order.items():
        rate = rates.get(kind)
        if rate is None:
            rate = rates.get(_SAME_COST_AS.get(kind.split(".")[0], "queue.send"))
            rate = rates.get(_SAME_COST_AS.get(kind, ""), rate)
        if not rate:
            return None
        share = count / HOST_BATCH if kind == "queue.receive" else count
        seconds += share / rate
    return round(1 / seconds, 2) if seconds else None


def _received(queue: QueueClient, **options: Any) -> list[Any]:
    return list(queue.receive_messages(**options))

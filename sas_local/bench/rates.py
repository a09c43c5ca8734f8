"""Azurite's raw rates for the operations an order uses, measured in the benchmark's own run.

Each operation runs for ``seconds`` on ``concurrency`` threads, each thread with its own
client (as each dev host worker thread effectively has), against the same Azurite as the
rest of the benchmark. The figures are what the store allows here, not what sas achieves.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError
from azure.data.tables import TableClient, TableServiceClient, UpdateMode
from azure.storage.queue import QueueClient, QueueServiceClient

RATE_TABLE = "benchrates"
RATE_QUEUE = "bench-rates"

Operation = Callable[[int, int], object]
"""``op(thread, iteration)``: one request; returning False means none was made (nothing left
to delete or receive), so it is not counted."""


def _entity(partition: str, row: str) -> dict[str, Any]:
    # About the size of a state row: a dozen short properties.
    entity: dict[str, Any] = {"PartitionKey": partition, "RowKey": row}
    entity.update({f"Field{n:02d}": f"value-{n}-{partition[:8]}" for n in range(12)})
    return entity


def _run(op: Operation, concurrency: int, seconds: float) -> float:
    stop = time.monotonic() + seconds
    done = [0] * concurrency

    def worker(thread: int) -> None:
        iteration = requests = 0
        while time.monotonic() < stop:
            if op(thread, iteration) is not False:
                requests += 1
            iteration += 1
        done[thread] = requests

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    return sum(done) / (time.monotonic() - started)


def measure(connection_string: str, *, concurrency: int, seconds: float) -> dict[str, float]:
    """Requests per second for each kind the request counter reports."""
    service = TableServiceClient.from_connection_string(connection_string)
    service.create_table_if_not_exists(RATE_TABLE)
    tables = [
        TableClient.from_connection_string(connection_string, RATE_TABLE)
        for _ in range(concurrency)
    ]
    queues = QueueServiceClient.from_connection_string(connection_string)
    with contextlib.suppress(ResourceExistsError):
        queues.create_queue(RATE_QUEUE)
    queue_clients = [
        QueueClient.from_connection_string(connection_string, RATE_QUEUE)
        for _ in range(concurrency)
    ]
    run = uuid.uuid4().hex[:8]
    rates: dict[str, float] = {}

    written: list[list[str]] = [[] for _ in range(concurrency)]

    def transaction(thread: int, n: int) -> None:
        partition = f"t{run}-{thread}-{n}"
        tables[thread].submit_transaction(
            [("create", _entity(partition, "order")), ("create", _entity(partition, "state"))]
        )
        written[thread].append(partition)

    rates["table.transaction"] = _run(transaction, concurrency, seconds)

    def point_read(thread: int, n: int) -> bool:
        mine = written[thread]
        if not mine:
            return False
        tables[thread].get_entity(mine[n % len(mine)], "state")
        return True

    rates["table.point_read"] = _run(point_read, concurrency, seconds)

    etags: dict[int, str] = {}
    lock = threading.Lock()

    def update(thread: int, n: int) -> None:
        client = tables[thread]
        with lock:
            etag = etags.get(thread)
        entity = _entity(f"u{run}-{thread}", "state")
        if etag is None:
            etag = client.create_entity(entity)["etag"]
        result = client.update_entity(
            entity, mode=UpdateMode.MERGE, etag=etag, match_condition=MatchConditions.IfNotModified
        )
        with lock:
            etags[thread] = result["etag"]

    rates["table.update"] = _run(update, concurrency, seconds)

    inserted: list[tuple[str, str]] = []

    def insert(thread: int, n: int) -> None:
        partition = f"i{run}-{thread}-{n}"
        tables[thread].create_entity(_entity(partition, "marker"))
        with lock:
            inserted.append((partition, "marker"))

    rates["table.insert"] = _run(insert, concurrency, seconds)

    def upsert(thread: int, n: int) -> None:
        tables[thread].upsert_entity(_entity(f"~bench{run}", f"{thread}-{n % 100}"))

    rates["table.upsert"] = _run(upsert, concurrency, seconds)

    def query(thread: int, n: int) -> None:
        list(
            tables[thread].query_entities(
                "PartitionKey eq @pk", parameters={"pk": f"~bench{run}"}, results_per_page=100
            )
        )

    rates["table.query"] = _run(query, concurrency, seconds / 2)

    def delete(thread: int, n: int) -> bool:
        with lock:
            if not inserted:
                return False
            partition, row = inserted.pop()
        tables[thread].delete_entity(partition, row)
        return True

    rates["table.delete"] = _run(delete, concurrency, seconds / 2)

    body = base64.b64encode(b'{"type":"ScheduleRequest","v":1,"order_id":"bench"}').decode()

    def send(thread: int, n: int) -> None:
        queue_clients[thread].send_message(body)

    rates["queue.send"] = _run(send, concurrency, seconds)

    held: list[Any] = []

    def receive(thread: int, n: int) -> bool:
        got = list(queue_clients[thread].receive_messages(max_messages=1))
        with lock:
            held.extend(got)
        return bool(got)

    rates["queue.receive"] = _run(receive, concurrency, seconds / 2)

    def delete_message(thread: int, n: int) -> bool:
        with lock:
            if not held:
                return False
            message = held.pop()
        queue_clients[thread].delete_message(message)
        return True

    rates["queue.delete"] = _run(delete_message, concurrency, seconds / 2)
    queues.delete_queue(RATE_QUEUE)
    service.delete_table(RATE_TABLE)
    return {kind: round(rate, 1) for kind, rate in rates.items()}


_SAME_COST_AS = {
    "table": "table.update",
    "breaker.read": "table.point_read",
    "breaker.write": "table.update",
}
"""A kind whose rate was not measured costs about what this measured kind costs."""


def order_limit(per_order: dict[str, float], rates: dict[str, float]) -> float | None:
    """Orders/s the raw rates allow for one order's requests: 1 / sum(count / rate)."""
    seconds = 0.0
    for kind, count in per_order.items():
        rate = rates.get(kind)
        if rate is None:
            rate = rates.get(_SAME_COST_AS.get(kind.split(".")[0], "queue.send"))
            rate = rates.get(_SAME_COST_AS.get(kind, ""), rate)
        if not rate:
            return None
        seconds += count / rate
    return round(1 / seconds, 2) if seconds else None

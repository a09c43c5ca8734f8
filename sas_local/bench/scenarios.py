"""Priorities and endpoint routing under load (docs/benchmarks.md, parts 6 and 7).

Part 6: a backlog of N normal orders is queued at once; two seconds later, H high-priority
orders are queued behind it (into their own lane). Latency is each order's ``FinishedAt`` minus
the moment it was sent, per priority.

Part 7: the payment service has two endpoints (west and north) sharing one ledger, each with a
capacity and a per-call latency. N orders run with both up, then N more with west down (every
call refused 503): orders/s for each, the calls each endpoint took, and how many steps were
deferred (no endpoint with room) or expired.

Only the commit being measured runs these (priorities and endpoints are new with it).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient

from sas import settings as settings_module
from sas.adapters.storage_queues import first_calls_alone
from sas.adapters.storage_queues import sent as always_decoded
from sas_local.bench.e2e import _body, _percentile
from sas_local.stack import LocalStack

ENDPOINT_CAPACITY = 16
ENDPOINT_LATENCY_S = 0.05


def priorities(*, backlog: int, urgent: int, log_dir: Path, timeout: float) -> dict[str, Any]:
    with LocalStack.start(workers=2, log_dir=log_dir) as stack:
        conn = stack.azurite.connection_string
        lanes = stack.settings.lanes(settings_module.QUEUE_ORDERS)
        table = TableClient.from_connection_string(conn, stack.settings.table_name)
        normal = [f"bulk-{n:05d}" for n in range(backlog)]
        high = [f"urgent-{n:03d}" for n in range(urgent)]
        sent = _send(conn, lanes["normal"], normal, "normal")
        time.sleep(2.0)  # the backlog is queued and being worked on
        sent |= _send(conn, lanes["high"], high, "high")
        finished = _wait(table, [*normal, *high], timeout)
    result: dict[str, Any] = {"backlog": backlog, "urgent": urgent}
    for name, ids in (("normal", normal), ("high", high)):
        latencies = [
            (finished[i] - sent[i]).total_seconds() for i in ids if finished.get(i) is not None
        ]
        result[name] = {
            "finished": len(latencies),
            "p50_s": round(statistics.median(latencies), 3) if latencies else None,
            "p95_s": _percentile(latencies, 95),
        }
    return result


def endpoints(*, orders: int, log_dir: Path, timeout: float) -> dict[str, Any]:
    config = [{"name": name, "capacity": ENDPOINT_CAPACITY} for name in ("west", "north")]
    with LocalStack.start(workers=2, log_dir=log_dir, endpoints={"payment": config}) as stack:
        conn = stack.azurite.connection_string
        queue = stack.settings.queue(settings_module.QUEUE_ORDERS)
        table = TableClient.from_connection_string(conn, stack.settings.table_name)
        runs = {}
        for label, west_down in (("both up", False), ("west down", True)):
            faults = {
                "endpoints": {
                    name: {
                        "latency_seconds": ENDPOINT_LATENCY_S,
                        "down": west_down and name == "west",
                    }
                    for name in ("west", "north")
                }
            }
            httpx.put(f"{stack.simulator_url}/faults", json=faults, timeout=10).raise_for_status()
            before = _endpoint_calls(stack.simulator_url)
            ids = [f"ep-{label.split()[0]}-{n:05d}" for n in range(orders)]
            sent = _send(conn, queue, ids, "normal")
            finished = _wait(table, ids, timeout)
            after = _endpoint_calls(stack.simulator_url)
            done = [i for i in ids if finished.get(i) is not None]
            span = (
                (max(finished[i] for i in done) - min(sent[i] for i in done)).total_seconds()
                if done
                else 0.0
            )
            kinds = _kinds(table, ids)
            runs[label] = {
                "orders": orders,
                "finished": len(done),
                "processed": _processed(table, done),
                "orders_per_s": round(len(done) / span, 2) if span else 0.0,
                "p50_s": round(
                    statistics.median((finished[i] - sent[i]).total_seconds() for i in done), 3
                )
                if done
                else None,
                "calls": {k: after.get(k, 0) - before.get(k, 0) for k in ("west", "north")},
                "deferred": kinds.get("deferred", 0),
                "expiries": sum(n for kind, n in kinds.items() if kind.startswith("expired_")),
            }
    return {
        "capacity": ENDPOINT_CAPACITY,
        "latency_s": ENDPOINT_LATENCY_S,
        "runs": runs,
    }


def _send(conn: str, queue_name: str, ids: list[str], priority: str) -> dict[str, datetime]:
    queue = QueueClient.from_connection_string(conn, queue_name)
    sent: dict[str, datetime] = {}

    def one(order_id: str) -> None:
        sent[order_id] = datetime.now(UTC)
        send = partial(queue.send_message, _body(order_id, priority))
        first_calls_alone("send_message", send, decoded=always_decoded)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, ids))
    return sent


def _wait(table: TableClient, ids: list[str], timeout: float) -> dict[str, datetime]:
    """The FinishedAt of each order that finished, once all did (or the timeout struck)."""
    finished: dict[str, datetime] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(finished) < len(ids):
        for order_id in ids:
            if order_id not in finished:
                try:
                    state = table.get_entity(order_id, "state", select=["FinishedAt"])
                except ResourceNotFoundError:
                    continue
                if state.get("FinishedAt") is not None:
                    finished[order_id] = state["FinishedAt"]
        if len(finished) < len(ids):
            time.sleep(1.0)
    return finished


def _processed(table: TableClient, ids: list[str]) -> int:
    return sum(
        table.get_entity(i, "state", select=["ProcessState"])["ProcessState"] == "Processed"
        for i in ids
    )


def _kinds(table: TableClient, ids: list[str]) -> dict[str, int]:
    wanted = set(ids)
    counts: dict[str, int] = {}
    query = "Kind eq 'deferred' or Kind ge 'expired_' and Kind lt 'expired`'"
    for entity in table.query_entities(query, select=["PartitionKey", "Kind"]):
        if entity["PartitionKey"] in wanted:
            counts[entity["Kind"]] = counts.get(entity["Kind"], 0) + 1
    return counts


def _endpoint_calls(simulator_url: str) -> dict[str, int]:
    stats = httpx.get(f"{simulator_url}/endpoints", timeout=10).json()
    return {name: int(s["calls"]) for name, s in stats.items()}

"""End to end: N orders through the whole local stack, happy path, no status subscriber.

Orders are queued at once (a burst), then the run waits until the in-flight index is empty.
Latency is each order's ``FinishedAt`` (state row) minus its ``SubmittedAt`` (order row), both
written by the app; throughput is N over the span from the first submission to the last
finish. Nothing here is asserted: the figures are reported.
"""

from __future__ import annotations

import base64
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient

from sas.adapters.storage_queues import first_calls_alone, sent
from sas.domain.model import TERMINAL_STATES
from sas.domain.wire import ROOM_PARTITION, live_table_name
from sas_local.bench import cpu
from sas_local.stack import Layout, LocalStack

TERMINAL = tuple(state.value for state in TERMINAL_STATES)


@dataclass(frozen=True)
class E2EResult:
    commit: str
    workers: int
    orders: int
    finished: int
    processed: int
    seconds: float
    orders_per_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    expiries: int = 0
    """Steps the Supervisor expired (none are needed on the happy path)."""
    replies_dropped: int = 0
    """Replies the Scheduler did not apply (``reply_dropped`` rows)."""
    replies_thrown_away: int | None = None
    """Of those, replies that came before their step was done by another (every reply here was
    sent in time: no clock is off), so the step ran again or was undone for want of them. The
    rest came after the step was done: the replies of a retry that was not needed."""
    extra_remote_calls: int | None = None
    """Remote calls answered from an idempotency key already applied (the simulator's replays):
    what re-running finished steps cost."""
    cpu_hogs: int = 0
    """Processes spinning on the CPU beside the run."""
    layout: str = "shared"
    """How the functions were spread over dev hosts (sas_local/stack.py): ``flex``, each in
    processes of its own, ``workers`` each."""
    hosts: int = 1
    """Dev hosts that ran the functions."""
    cpu_ms_per_order: dict[str, float] = field(default_factory=dict)
    """CPU milliseconds per order of the dev host (with its workers), Azurite and the simulator,
    from the first submission to the end of the run (see cpu.py)."""
    sweep_reads_per_order: float | None = None
    """Orders the Supervisor read, per order, until the last marker went (None: the commit
    does not log them)."""
    marker_moves_per_order: float | None = None
    """Transactions of the Scheduler's marker moves, per order (None: as above)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _body(order_id: str, priority: str = "normal") -> str:
    order = {
        "type": "OrderSubmitted",
        "order_id": order_id,
        **({} if priority == "normal" else {"priority": priority}),
        "details": {
            "customer_id": "bench",
            "currency": "EUR",
            "address": "1 Bench Street",
            "lines": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 1999}],
        },
    }
    return base64.b64encode(json.dumps(order).encode()).decode()


def _waiting(live: TableClient) -> bool:
    """Whether any submission waits in the waiting room (none before it existed)."""
    rows = live.query_entities(
        "PartitionKey eq @pk", parameters={"pk": ROOM_PARTITION}, select=["RowKey"]
    )
    try:
        return next(iter(rows), None) is not None
    except ResourceNotFoundError:
        return False


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return round(ordered[index], 3)


def run(
    *,
    commit: str,
    app_root: Path,
    workers: int,
    orders: int,
    timeout: float,
    log_dir: Path,
    count_supervision: bool = True,
    cpu_hogs: int = 0,
    layout: Layout = "shared",
) -> E2EResult:
    """``count_supervision``: also count the Supervisor's reads and the marker moves, which
    takes waiting until the last marker is gone (about one step budget after the run).
    ``cpu_hogs``: processes that spin on the CPU while the run goes (a loaded machine)."""
    with (
        LocalStack.start(
            workers=workers, log_dir=log_dir, app_root=app_root, layout=layout
        ) as stack,
        spinning(cpu_hogs),
    ):
        conn = stack.azurite.connection_string
        settings = stack.settings
        queue = QueueClient.from_connection_string(conn, settings.queues["SAS_QUEUE_ORDERS"])
        table = TableClient.from_connection_string(conn, settings.table_name)
        ids = [f"b{workers}w-{n:05d}" for n in range(orders)]
        hosts = len(stack.hosts)
        processes = {
            **{f"devhost{HOST}{n}": host.pid for n, host in enumerate(stack.hosts)},
            "azurite": stack.azurite.process.pid,
            "simulator": stack.simulator.pid,
        }
        cpu_before = cpu.snapshot(processes)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda order_id: _send(queue, _body(order_id)), ids))
        # Done when every queue the app consumes is empty twice in a row (the count includes
        # invisible and delayed messages) and no submission waits in the waiting room for a
        # sweep to let it in: it holds for any commit, whatever its index.
        consumed = [
            QueueClient.from_connection_string(conn, name)
            for key, name in settings.queues.items()
            if key != "SAS_QUEUE_ALERTS"
        ]
        room = TableClient.from_connection_string(conn, live_table_name(settings.table_name))
        deadline = time.monotonic() + timeout
        time.sleep(1.0)
        quiet = 0
        while time.monotonic() < deadline and quiet < 2:
            queued = sum(q.get_queue_properties().approximate_message_count or 0 for q in consumed)
            quiet = quiet + 1 if queued == 0 and not _waiting(room) else 0
            time.sleep(1.0)
        cpu_used = _dev_hosts_summed(cpu.per_order_ms(cpu_before, cpu.snapshot(processes), orders))
        latencies, first, last, processed = [], None, None, 0
        for order_id in ids:
            try:
                state = table.get_entity(order_id, "state")
            except ResourceNotFoundError:  # not accepted yet when the timeout struck
                continue
            if state.get("ProcessState") not in TERMINAL or state.get("FinishedAt") is None:
                continue
            submitted, finished = state["SubmittedAt"], state["FinishedAt"]
            latencies.append((finished - submitted).total_seconds())
            first = submitted if first is None else min(first, submitted)
            last = finished if last is None else max(last, finished)
            processed += state["ProcessState"] == "Processed"
        kinds = _history_kinds(table)
        thrown_away = _thrown_away(table)
        replays = httpx.get(f"{stack.simulator_url}/ledger", timeout=60).json()["replays"]
        logs_reads = (
            count_supervision
            and "orders_read" in (app_root / "sas/services/supervisor.py").read_text()
        )
        if logs_reads:  # the Supervisor's last read of each order drops its marker: wait for it
            live = TableClient.from_connection_string(conn, live_table_name(settings.table_name))
            _wait_until_empty(live, timeout=120.0)
    sweep_reads, moves = _supervision_cost(log_dir) if logs_reads else (None, None)
    span = (last - first).total_seconds() if first is not None and last is not None else 0.0
    return E2EResult(
        commit=commit,
        workers=workers,
        orders=orders,
        finished=len(latencies),
        processed=processed,
        seconds=round(span, 2),
        orders_per_s=round(len(latencies) / span, 2) if span else 0.0,
        p50_s=round(statistics.median(latencies), 3) if latencies else float("nan"),
        p95_s=_percentile(latencies, 95),
        p99_s=_percentile(latencies, 99),
        expiries=sum(n for kind, n in kinds.items() if kind.startswith("expired_")),
        replies_dropped=kinds.get("reply_dropped", 0),
        replies_thrown_away=thrown_away,
        extra_remote_calls=int(replays),
        cpu_hogs=cpu_hogs,
        cpu_ms_per_order=cpu_used,
        sweep_reads_per_order=None if sweep_reads is None else round(sweep_reads / orders, 3),
        marker_moves_per_order=None if moves is None else round(moves / orders, 3),
        layout=layout,
        hosts=hosts,
    )


HOST = "#"


def _dev_hosts_summed(used: dict[str, float]) -> dict[str, float]:
    """The dev hosts' CPU as one figure (the Flex layout runs one per function)."""
    hosts = [value for name, value in used.items() if name.startswith(f"devhost{HOST}")]
    others = {name: value for name, value in used.items() if not name.startswith("devhost")}
    return {"devhost": round(sum(hosts), 1), **others}


def _send(queue: QueueClient, body: str) -> None:
    first_calls_alone("send_message", partial(queue.send_message, body), decoded=sent)


def _wait_until_empty(table: TableClient, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if next(iter(table.list_entities(select=["RowKey"], results_per_page=1)), None) is None:
            return
        time.sleep(1.0)


_SWEPT = re.compile(r"sas\.supervisor_sweep .*\borders_read=(\d+)")
_MOVED = re.compile(r"sas\.markers_(?:moved|settled) .*\bcount=(\d+)(?:.*\brequests=(\d+))?")
"""``markers_moved`` before the Scheduler dropped the markers of finished orders too; since then
the line says how many transactions it sent (one per 100, and one more per failed marker)."""


def _supervision_cost(log_dir: Path) -> tuple[int, int]:
    """From the dev host's log: orders the Supervisor read, and the transactions (of up to 100
    moves and drops) the Scheduler spent on markers."""
    reads = moves = 0
    for path in sorted(log_dir.glob("devhost*/*.log")):
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if swept := _SWEPT.search(line):
                    reads += int(swept.group(1))
                elif moved := _MOVED.search(line):
                    count, requests = moved.groups()
                    moves += int(requests) if requests else -(-int(count) // 100)
    return reads, moves


@contextmanager
def spinning(processes: int) -> Iterator[None]:
    """``processes`` busy loops on the machine's CPUs for as long as the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _thrown_away(table: TableClient) -> int:
    """Dropped replies whose step was not done yet when they came (by the rows' commit times,
    the one clock every write shares): each one's step ran again, or was undone."""
    done: dict[tuple[str, str, str], datetime] = {}
    dropped: list[tuple[tuple[str, str, str], datetime]] = []
    query = "Kind eq 'completed' or Kind eq 'undone' or Kind eq 'reply_dropped'"
    for row in table.query_entities(query):  # whole rows: a projection leaves out Timestamp
        key = (row["PartitionKey"], str(row.get("Step")), str(row.get("Mode") or "do"))
        at = row.metadata["timestamp"]
        assert at is not None  # noqa: S101  # the service sets it on every entity
        if row["Kind"] == "reply_dropped":
            dropped.append((key, at))
        else:
            done[key] = min(at, done.get(key, at))
    return sum(1 for key, at in dropped if key not in done or done[key] > at)


def _history_kinds(table: TableClient) -> dict[str, int]:
    """Recovery and fencing rows of the run (one scan after it, off the clock)."""
    wanted = ("expired_retry", "expired_compensate", "expired_compensated", "expired_error")
    query = " or ".join(f"Kind eq '{kind}'" for kind in (*wanted, "reply_dropped"))
    counts: dict[str, int] = {}
    for entity in table.query_entities(query, select=["Kind"]):
        counts[entity["Kind"]] = counts.get(entity["Kind"], 0) + 1
    return counts

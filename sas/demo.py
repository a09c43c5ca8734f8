"""`make run`: the local demo. Starts Azurite, the simulated remote service and the dev host,
submits a batch of orders the way an application would (orders queue, private status queue),
shows progress from the status events, then summarises and checks the remote ledger.

Exits non-zero if any order is not Processed or an effect was not applied exactly once.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from azure.storage.queue import QueueClient, TextBase64DecodePolicy
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sas.adapters.clients import queue_service_client, table_client
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.tables import TableStateStore
from sas.devtools.ledger import LedgerReport, check_effects, fetch_ledger
from sas.devtools.stack import LocalStack
from sas.domain.errors import InvalidMessage
from sas.domain.messages import OrderDetails, OrderLine, OrderSubmitted, StatusEvent, decode
from sas.domain.model import ProcessState
from sas.domain.workflow import ORDER_WORKFLOW
from sas.settings import QUEUE_ORDERS

STATUS_QUEUE = "sas-demo-status"
FINAL_STATUSES = frozenset({"completed", "failed", "rejected"})
console = Console()


@dataclass
class Tracker:
    sent_at: dict[str, float] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    events: Counter[str] = field(default_factory=Counter)


def demo_order(index: int, run_id: str, reply_to: str = STATUS_QUEUE) -> OrderSubmitted:
    return OrderSubmitted(
        order_id=f"demo-{run_id}-{index:05d}",
        details=OrderDetails(
            customer_id=f"customer-{index % 17}",
            currency="EUR",
            address=f"{index} Demo Street",
            lines=[
                OrderLine(sku=f"sku-{index % 5}", quantity=1 + index % 3, unit_price_cents=1999)
            ],
        ),
        reply_to=reply_to,
    )


def drain_status(queue: QueueClient, tracker: Tracker) -> None:
    for message in queue.receive_messages(messages_per_page=32, max_messages=32):
        queue.delete_message(message)
        try:
            event = decode(StatusEvent, message.content)
        except InvalidMessage:
            continue
        tracker.events[event.status] += 1
        if event.status in FINAL_STATUSES and event.order_id not in tracker.final:
            tracker.final[event.order_id] = event.status
            sent = tracker.sent_at.get(event.order_id)
            if sent is not None:
                tracker.latency[event.order_id] = time.monotonic() - sent


def run(orders: int, workers: int, timeout: float, logs: Path) -> int:
    run_id = time.strftime("%H%M%S")
    with console.status("starting Azurite, the remote service simulator and the dev host"):
        stack = LocalStack.start(workers=workers, log_dir=logs, extra_queues=(STATUS_QUEUE,))
    try:
        console.print(
            f"[green]ready[/]: dev host with {workers} worker(s), API {stack.api_url}, "
            f"simulator {stack.simulator_url}, logs in {logs}"
        )
        return _drive(stack, orders, run_id, timeout)
    finally:
        with console.status("stopping everything"):
            stack.stop()


def _drive(stack: LocalStack, orders: int, run_id: str, timeout: float) -> int:
    settings = stack.settings
    transport = StorageQueueTransport(queue_service_client(settings.storage))
    status_queue = queue_service_client(settings.storage).get_queue_client(
        STATUS_QUEUE, message_decode_policy=TextBase64DecodePolicy()
    )
    tracker = Tracker()
    batch = [demo_order(i, run_id) for i in range(orders)]
    started = time.monotonic()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        submitted = progress.add_task("submitted", total=orders)
        finished = progress.add_task("finished ", total=orders)
        for order in batch:
            tracker.sent_at[order.order_id] = time.monotonic()
            transport.send(
                settings.queue(QUEUE_ORDERS),
                order,
                message_id=order.order_id,
                correlation_id=order.order_id,
            )
            progress.advance(submitted)
        deadline = time.monotonic() + timeout
        while len(tracker.final) < orders and time.monotonic() < deadline:
            drain_status(status_queue, tracker)
            progress.update(finished, completed=len(tracker.final))
            time.sleep(0.1)
    elapsed = time.monotonic() - started

    store = TableStateStore(table_client(settings.storage, settings.table_name))
    outcomes: dict[str, ProcessState] = {}
    for order in batch:
        found = store.get_state(order.order_id)
        outcomes[order.order_id] = found.value.process_state if found else ProcessState.PENDING
    report = check_effects(fetch_ledger(stack.simulator_url), outcomes, ORDER_WORKFLOW)
    _summary(orders, outcomes, tracker, report, elapsed)
    not_processed = sum(state is not ProcessState.PROCESSED for state in outcomes.values())
    if not_processed or not report.ok:
        console.print(
            f"[red]FAILED[/]: {not_processed} order(s) not Processed; "
            f"ledger problems: {len(report.problems)}"
        )
        for problem in report.problems[:20]:
            console.print(f"  - {problem}")
        return 1
    console.print(f"[green]OK[/]: all {orders} orders Processed, every effect applied exactly once")
    return 0


def _percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _summary(
    orders: int,
    outcomes: dict[str, ProcessState],
    tracker: Tracker,
    report: LedgerReport,
    elapsed: float,
) -> None:
    table = Table(
        title=f"sas demo: {orders} orders in {timedelta(seconds=round(elapsed))}", show_header=False
    )
    table.add_column(style="bold")
    table.add_column()
    counts = Counter(state.value for state in outcomes.values())
    for state in ProcessState:
        table.add_row(f"ProcessState {state.value}", str(counts.get(state.value, 0)))
    latencies = list(tracker.latency.values())
    table.add_row("end-to-end latency p50", f"{_percentile(latencies, 50):.2f} s")
    table.add_row("end-to-end latency p95", f"{_percentile(latencies, 95):.2f} s")
    table.add_row("throughput", f"{orders / elapsed:.1f} orders/s" if elapsed else "-")
    table.add_row(
        "remote effects applied",
        f"{report.effects} " + str(dict(sorted(report.by_service.items()))),
    )
    table.add_row("idempotent replays at the remote", str(report.replays))
    table.add_row("status events received", str(sum(tracker.events.values())))
    table.add_row("ledger check", "ok" if report.ok else f"{len(report.problems)} problem(s)")
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the sas demo locally on Azurite.")
    parser.add_argument("--orders", type=int, default=100, help="orders to submit (default 100)")
    parser.add_argument(
        "--workers", type=int, default=2, help="dev host worker processes (default 2)"
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait for all orders"
    )
    parser.add_argument("--logs", type=Path, default=Path(".sas-run"), help="where process logs go")
    args = parser.parse_args(argv)
    if args.orders < 1 or args.workers < 1:
        parser.error("--orders and --workers must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    timeout = args.timeout if args.timeout is not None else 60 + args.orders * 1.0
    sys.exit(run(args.orders, args.workers, timeout, args.logs))


if __name__ == "__main__":
    main()

"""Priorities and endpoint routing through the whole local stack: function_app.py on the dev
hosts as Flex runs it (each lane's function apart), Azurite, the simulator with two payment
endpoints sharing one ledger.

- Under a backlog of normal orders, high-priority orders (sent after the backlog) finish before
  most of it, and low-priority ones are held back at admission, then finish.
- With one payment endpoint down, every order still completes, charged once, on the other.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest

from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.messages import OrderSubmitted
from sas.domain.model import ProcessState
from sas.domain.priority import Waiting
from sas.domain.wire import Priority
from sas.settings import (
    AGENTS,
    QUEUE_ORDERS,
    QUEUE_REPLIES,
    agent_queue_setting,
)
from sas_local.demo import demo_order
from sas_local.ledger import check_effects, configure_faults, fetch_ledger
from sas_local.processes import wait_until
from sas_local.stack import LocalStack
from workflows.order import ORDER_WORKFLOW

pytestmark = pytest.mark.e2e

BACKLOG = 200


def send(stack: LocalStack, transport: StorageQueueTransport, order: OrderSubmitted) -> None:
    """Into the orders queue's lane of the order's priority, as a submitter does."""
    queue = stack.settings.lane(QUEUE_ORDERS, order.priority)
    transport.send(queue, order, message_id=order.order_id, correlation_id=order.order_id)


def batch(tag: str, count: int, priority: Priority) -> list[OrderSubmitted]:
    return [demo_order(n, tag).model_copy(update={"priority": priority}) for n in range(count)]


def wait_finished(store: TableStateStore, ids: list[str], timeout: float) -> None:
    def done() -> bool:
        return all(
            (found := store.get_state(order_id)) is not None and found.value.is_terminal
            for order_id in ids
        )

    wait_until(done, timeout=timeout, interval=0.5, what=f"{len(ids)} orders finished")


def test_high_priority_orders_overtake_a_backlog_and_low_ones_wait_for_it(stack, store, transport):
    normal = batch("bulk", BACKLOG, "normal")
    high = batch("urgent", 5, "high")
    low = batch("later", 5, "low")
    sent_at: dict[str, datetime] = {}

    def send_one(order: OrderSubmitted) -> None:
        sent_at[order.order_id] = datetime.now(UTC)
        send(stack, transport, order)

    # All at once: sent one by one on a loaded machine, the first ones could be done before
    # the last ones are sent, and there would be no backlog for the low orders to yield to.
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send_one, normal))
    time.sleep(2)  # the backlog is there: a few seconds of work waits in the normal lanes
    # Where admission looks: the normal lanes of the orders, replies and agent queues (the
    # submissions themselves are taken in fast; the backlog is their steps').
    keys = (QUEUE_ORDERS, QUEUE_REPLIES, *(agent_queue_setting(agent) for agent in AGENTS))
    waiting = sum(
        (transport.waiting(stack.settings.lane(key, "normal")) for key in keys), start=Waiting()
    )
    assert waiting.count > 0, "the normal orders were all done in 2 s: no backlog to test with"
    for order in (*low, *high):
        sent_at[order.order_id] = datetime.now(UTC)
        send(stack, transport, order)
    ids = list(sent_at)
    wait_finished(store, ids, timeout=300)

    def latency(order: OrderSubmitted) -> float:
        found = store.get_state(order.order_id)
        assert found is not None and found.value.process_state is ProcessState.PROCESSED
        assert found.value.finished_at is not None
        assert found.value.priority == order.priority
        seconds: float = (found.value.finished_at - sent_at[order.order_id]).total_seconds()
        return seconds

    normal_median = statistics.median(latency(o) for o in normal)
    high_worst = max(latency(o) for o in high)
    assert high_worst < normal_median, (high_worst, normal_median)

    # Low orders were let in only later (admission deferred while the normal lanes were
    # backlogged), yet every one of them finished.
    for order in low:
        found = store.get_state(order.order_id)
        assert found is not None
        admitted_after = (found.value.submitted_at - sent_at[order.order_id]).total_seconds()
        assert admitted_after >= 4, (order.order_id, admitted_after)


def test_with_one_endpoint_down_every_order_completes_once_on_the_other(stack, store, transport):
    configure_faults(stack.simulator_url, {"endpoints": {"west": {"down": True}}})
    try:
        orders = batch("oneup", 20, "normal")
        for order in orders:
            send(stack, transport, order)
        ids = [o.order_id for o in orders]
        wait_finished(store, ids, timeout=240)
    finally:
        configure_faults(stack.simulator_url, {})
    for order_id in ids:
        found = store.get_state(order_id)
        assert found is not None and found.value.process_state is ProcessState.PROCESSED
        completed = [
            e.endpoint
            for e in store.get_history(order_id)
            if e.kind == "completed" and e.step == "charge"
        ]
        assert completed == ["north"], (order_id, completed)
    ledger = fetch_ledger(stack.simulator_url)
    effects = ledger["effects"]
    assert isinstance(effects, list)
    outcomes = dict.fromkeys(ids, ProcessState.PROCESSED)
    ours = [e for e in effects if e["order_id"] in outcomes]
    report = check_effects({"effects": ours}, outcomes, ORDER_WORKFLOW)
    assert report.problems == []  # each effect once, whichever endpoint was asked
    assert report.effects == len(ids) * len(ORDER_WORKFLOW.steps)
    stats = httpx.get(f"{stack.simulator_url}/endpoints").json()
    assert stats["north"]["calls"] >= len(ids)

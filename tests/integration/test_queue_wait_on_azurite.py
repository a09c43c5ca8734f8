"""Queue wait is never a failure, on what only Azurite decides: whether a Storage queue holds a
message (delayed and leased ones too), and the start row an agent inserts in the order's
partition; and the retry budget's cap on what a sweep sends again, against the store's ETags
and markers. The decisions themselves run in memory (tests/unit/test_queue_wait.py,
tests/unit/test_retry_budget.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta

import pytest
from azure.storage.queue import QueueServiceClient, TextBase64DecodePolicy

from sas.adapters.load_table import TableBudgetStore
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.messages import OrderSubmitted, ScheduleRequest, StepRequest, decode
from sas.domain.model import StepStart
from sas.services.context import Agents, Routes
from sas.services.retry_budget import RetryBudget, RetryBudgetPolicy
from sas.testing import FakeClock, InMemoryRemote, Instance, instance
from tests.conftest import unique_queue
from tests.harness import BUDGET, live_table_of, store_on
from tests.unit.test_services import submitted
from tests.workflows import REGISTRY

pytestmark = pytest.mark.integration


@dataclass
class Stack:
    """The app's handlers on the real store and real Storage queues, with a fake clock."""

    app: Instance
    store: TableStateStore
    transport: StorageQueueTransport
    service: QueueServiceClient
    routes: Routes
    clock: FakeClock

    def receive(self, queue: str) -> tuple[StepRequest, Callable[[], None]]:
        """The request at the front of ``queue``, leased; and how to delete it."""
        client = self.service.get_queue_client(
            queue, message_decode_policy=TextBase64DecodePolicy()
        )
        [message] = list(client.receive_messages(max_messages=1, visibility_timeout=60))
        return decode(StepRequest, message.content), lambda: client.delete_message(message)

    def submit(self, order: OrderSubmitted) -> None:
        self.app.submit(order)


@pytest.fixture
def stack(azurite, table, queue_service: QueueServiceClient) -> Iterator[Stack]:
    names = {role: unique_queue(role) for role in ("orders", "sched", "replies", "alerts", "agt")}
    for name in names.values():
        queue_service.create_queue(name)
    routes = Routes(
        names["orders"],
        names["sched"],
        names["replies"],
        names["alerts"],
        dict.fromkeys(("inventory", "payment", "shipping"), names["agt"]),
    )
    clock = FakeClock()
    store = store_on(table)
    transport = StorageQueueTransport(queue_service)
    agents = Agents(remote=InMemoryRemote(clock), sleep=clock.sleep)
    app = instance(store, transport, routes, clock, REGISTRY, agents=agents)
    try:
        yield Stack(app, store, transport, queue_service, routes, clock)
    finally:
        for name in names.values():
            queue_service.delete_queue(name)


def test_a_storage_queue_holds_delayed_and_leased_messages(stack: Stack) -> None:
    queue = stack.routes.scheduler
    assert not stack.transport.holds_messages(queue)
    message = ScheduleRequest(order_id="x1")
    stack.transport.send(queue, message, message_id="m", correlation_id="x1", delay_seconds=30)
    assert stack.transport.holds_messages(queue)  # delayed: invisible, still counted
    client = stack.service.get_queue_client(queue)
    client.clear_messages()
    assert not stack.transport.holds_messages(queue)
    stack.transport.send(queue, message, message_id="m", correlation_id="x1")
    [leased] = list(client.receive_messages(max_messages=1, visibility_timeout=30))
    assert stack.transport.holds_messages(queue)  # leased by a consumer: still counted
    client.delete_message(leased)
    assert not stack.transport.holds_messages(queue)


def test_a_queued_request_is_not_sent_again_and_a_start_moves_the_deadline(stack: Stack) -> None:
    stack.submit(submitted("q1", reply_to=None))
    state = stack.store.get_state("q1")
    assert state is not None and state.value.complete_by is not None
    stack.clock.current = state.value.complete_by + timedelta(seconds=BUDGET * 3)
    assert stack.app.sweep()["request_queued"] == 1  # still in the agent's queue
    assert not stack.transport.holds_messages(stack.routes.scheduler)  # nothing sent again
    after = stack.store.get_state("q1")
    assert after is not None and after.value == state.value  # no failure counted, no write

    request, delete = stack.receive(stack.routes.agents["inventory"])
    start = StepStart(
        order_id="q1",
        key=request.idempotency_key,
        attempt=request.attempt,
        started_at=stack.clock.now(),
        run_by=stack.clock.now() + timedelta(seconds=BUDGET),
        instance="agent-1",
    )
    assert stack.store.record_start(start) == start
    later = replace(start, started_at=start.started_at + timedelta(seconds=5), instance="agent-2")
    assert stack.store.record_start(later) == start  # inserted once: the first start stands
    assert stack.store.get_start("q1", request.idempotency_key, request.attempt) == start
    delete()  # the agent crashed after its start: no reply anywhere

    stack.store.touch_live("q1", stack.clock.now(), stack.clock.now())
    assert stack.app.sweep()["running"] == 1  # within its budget from the start
    stack.clock.current = start.run_by + timedelta(seconds=1)
    stack.store.touch_live("q1", stack.clock.now(), stack.clock.now())
    assert stack.app.sweep()["retry"] == 1  # overran its start's budget, no reply queued
    recovered = stack.store.get_state("q1")
    assert recovered is not None and recovered.value.failure_count == 1
    assert stack.transport.holds_messages(stack.routes.scheduler)  # the retry's request


def test_of_a_start_and_a_give_up_the_first_insert_decides(stack: Stack) -> None:
    now = stack.clock.now()
    given_up = StepStart("g1", "g1:abc:reserve", 1, now, now, "supervisor-1", abandoned=True)
    assert stack.store.record_start(given_up) == given_up
    late = StepStart("g1", "g1:abc:reserve", 1, now, now + timedelta(seconds=9), "agent-1")
    assert stack.store.record_start(late) == given_up  # the agent finds it given up
    first = replace(late, order_id="g2", key="g2:abc:reserve")
    assert stack.store.record_start(first) == first
    assert stack.store.record_start(replace(given_up, order_id="g2", key="g2:abc:reserve")) == first


def test_the_retry_budget_caps_what_a_sweep_sends_again(stack: Stack, table) -> None:
    budget = RetryBudget(
        RetryBudgetPolicy(capacity=1, per_finished=0.5, trickle=timedelta(hours=1))
    )
    supervisor = stack.app.named("supervisor-1", retry_budget=budget)
    ids = ["b1", "b2", "b3"]
    for order_id in ids:
        stack.submit(submitted(order_id, reply_to=None))
    agents = stack.service.get_queue_client(stack.routes.agents["inventory"])
    agents.clear_messages()  # every request lost with its agent: nothing holds the steps off
    before = {oid: stack.store.get_state(oid) for oid in ids}
    deadline = max(v.value.complete_by for v in before.values() if v and v.value.complete_by)
    stack.clock.current = deadline + timedelta(seconds=3)

    budgets = TableBudgetStore(live_table_of(table))
    report = supervisor.sweep(budgets=budgets)
    assert (report["retry"], report["retry_held_back"]) == (1, 2)
    [published] = budgets.read()  # what health reads: this Supervisor is saturated
    assert (published.instance_id, published.held_back) == ("supervisor-1", 2)
    scheduler = stack.service.get_queue_client(stack.routes.scheduler)
    assert scheduler.get_queue_properties().approximate_message_count == 1  # one retry sent
    held = [oid for oid in ids if stack.store.get_state(oid) == before[oid]]
    assert len(held) == 2  # same ETag: not written, no failure counted
    stack.clock.advance(5)
    due = {m.order_id for m in stack.store.list_due(stack.clock.now())}
    assert set(held) <= due  # re-armed for a later sweep, not dropped
    assert supervisor.sweep(budgets=budgets)["retry_held_back"] == 2  # still no token
    assert [row.held_back for row in budgets.read()] == [4]  # its row replaced, not added

    budget.finished(2)  # two orders finished well elsewhere: one token back
    stack.clock.advance(5)
    report = supervisor.sweep()
    assert (report["retry"], report["retry_held_back"]) == (1, 1)
    assert scheduler.get_queue_properties().approximate_message_count == 2

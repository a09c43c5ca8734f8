"""The Supervisor's in-flight index on Azurite: only due markers are read (the real table's
query on DueAt), a healthy order's marker is re-armed to its next deadline and a finished one's
dropped (unread under ``max_in_flight``; conditional writes on the in-flight table), and a
parallel sweep shares one store's clients across threads. When a step expires and what a late
reply does, decided by the domain, run in memory (tests/unit/test_expiry_and_late_replies.py)."""

from __future__ import annotations

from typing import Any

import pytest

from sas.domain.model import ProcessState
from tests.harness import BUDGET, CLAIMED, World
from tests.unit.test_failure_modes import order
from tests.unit.test_in_flight_limit import LIMITED
from tests.unit.test_services import submitted
from tests.workflows import SHOP

pytestmark = pytest.mark.integration


class CountingStore:
    """Counts the state reads a sweep makes (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.state_reads = 0

    def get_state(self, order_id: str) -> Any:
        self.state_reads += 1
        return self.inner.get_state(order_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_sweep_reads_no_order_whose_marker_is_not_due(world):
    ids = [order(world, f"o{n}") for n in range(5)]
    counting = CountingStore(world.store)
    supervisor = world.new_supervisor("supervisor-2", store=counting)
    world.clock.advance(BUDGET - 1)
    assert supervisor.sweep().total() == 0
    assert counting.state_reads == 0  # one query, no read per in-flight order
    assert {m.order_id for m in world.store.list_live()} == set(ids)


def test_a_healthy_due_order_is_re_armed_to_its_next_deadline(world):
    oid = order(world)
    world.deliver("agent-inventory")
    world.clock.advance(5)
    world.deliver("replies")  # the second step started 5 s in
    state = world.state(oid)
    world.clock.advance(CLAIMED - 5)  # the first step's deadline (the marker's due) passed...
    (marker,) = world.store.list_live()
    assert marker.due_at <= world.clock.now()
    assert world.tick(1)["healthy"] == 1  # ...but the order is healthy: re-armed
    (rearmed,) = world.store.list_live()
    assert rearmed.due_at == state.complete_by
    assert world.tick(0).total() == 0  # not due again before that


def test_a_parallel_sweep_examines_every_due_order_once(world):
    ids = [order(world, f"p{n:02d}") for n in range(12)]
    world.drop("agent-inventory")  # every agent died
    parallel = world.new_supervisor("supervisor-p")
    world.clock.advance(CLAIMED + 1)
    report = parallel.sweep(parallelism=4)
    assert report["retry"] == len(ids)
    assert all(world.state(oid).failure_count == 1 for oid in ids)
    assert parallel.sweep().total() == 0  # every marker re-armed to the retry's deadline


def test_a_finished_orders_marker_goes_with_the_first_sweep_it_is_due_for(world):
    """A workflow with no ``max_in_flight``: nothing touches the marker when the order
    finishes; the sweep that finds it due reads the finished order once and drops it."""
    oid = order(world)
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    (marker,) = world.store.list_live()
    counting = CountingStore(world.store)
    supervisor = world.new_supervisor("supervisor-2", store=counting)
    assert supervisor.sweep().total() == 0  # not due yet: nothing read
    world.clock.advance((marker.due_at - world.clock.now()).total_seconds())
    assert supervisor.sweep() == {"unindexed": 1} and counting.state_reads == 1
    assert world.store.list_live() == []


def test_a_limited_workflows_finished_marker_leaves_the_count_and_goes_unread(table):
    """Under ``max_in_flight`` the order's finish marks its marker finished: due at once and
    counted by no workflow; the next sweep drops it (with its other writes) reading nothing."""
    world = World(table, workflows=LIMITED)
    world.submit(submitted("o1"))
    world.run()
    assert world.state("o1").process_state is ProcessState.PROCESSED
    (marker,) = world.store.list_live()
    assert marker.finished and marker.due_at <= world.clock.now()
    assert world.store.count_live(SHOP.name, 10) == 0
    counting = CountingStore(world.store)
    supervisor = world.new_supervisor("supervisor-2", store=counting)
    assert supervisor.sweep() == {"unindexed": 1} and counting.state_reads == 0
    assert world.store.list_live() == []

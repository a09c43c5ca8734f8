"""Bounded work in flight, in memory: past its workflow's ``max_in_flight`` a submission waits
in the orders queue (nothing written, a delayed copy of it sent back), longer the further past
the limit; it is let in once there is room; high priority never waits; a count the store cannot
give holds nothing back. The count against the Table store: tests/integration/test_table_store.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from sas.domain.messages import OrderSubmitted
from sas.domain.model import ProcessState
from sas.domain.priority import InFlightPolicy
from sas.domain.workflow import Registry, Workflow
from sas.services.in_flight import InFlight
from sas.services.ports import StateStore
from sas.services.submission import SubmissionOutcome
from tests.harness import World
from tests.unit.test_failure_modes import ALL_STEPS, assert_effects_once
from tests.unit.test_services import submitted
from tests.workflows import SHOP, STRICT

pytestmark = [pytest.mark.unit, pytest.mark.fast]

LIMIT = 2
LIMITED = Registry(
    workflows=(replace(SHOP, max_in_flight=LIMIT), replace(STRICT, max_in_flight=LIMIT))
)


def limited_world(store=None) -> World:
    world = World(workflows=LIMITED)
    world.app = world.app.named(
        "scheduler-1", in_flight=InFlight(store or world.store, world.clock, ttl=timedelta(0))
    )
    return world


def test_past_the_limit_a_submission_waits_in_the_orders_queue_until_there_is_room():
    world = limited_world()
    for n in range(3):
        world.submit(submitted(f"o{n}"))
    assert world.store.get_state("o2") is None  # nothing written for the third
    (copy,) = world.bus.to("orders")
    assert isinstance(copy, OrderSubmitted) and copy.order_id == "o2"
    assert copy.deferred_since is None  # the low-priority yield bound is not this wait
    assert copy.room_turn == world.clock.now() + InFlightPolicy().base
    (sent,) = world.bus.pending("orders")
    assert sent.due == world.clock.now() + InFlightPolicy().base  # nothing else waits
    world.settle_with_supervision(ticks=10)  # the first two finish, their markers go
    for n in range(3):
        assert world.state(f"o{n}").process_state is ProcessState.PROCESSED
        assert_effects_once(world, f"o{n}", *ALL_STEPS)


def test_each_workflow_is_counted_on_its_own():
    world = limited_world()
    for n in range(2):
        world.submit(submitted(f"o{n}"))
    strict = [submitted(f"s{n}").model_copy(update={"workflow": STRICT.name}) for n in range(3)]
    for message in strict:
        world.submit(message)
    # the other workflow's two orders leave room for two of its own, not three
    assert [world.store.get_state(f"s{n}") is not None for n in range(3)] == [True, True, False]


def test_a_low_order_waits_below_the_limit_so_normal_ones_get_the_room_first():
    policy = InFlightPolicy(low_share=0.9)
    assert policy.deferral("normal", in_flight=9, limit=10) is None
    assert policy.deferral("low", in_flight=9, limit=10) is not None
    assert policy.deferral("low", in_flight=8, limit=10) is None


def test_found_full_at_its_turn_a_submission_looks_again_later_each_time():
    world = limited_world()
    for n in range(2):
        world.submit(submitted(f"o{n}"))
    world.submit(submitted("o2"))
    turn = world.clock.now() + InFlightPolicy().base
    waits = []
    for _ in range(5):
        [due] = world.bus.pending("orders")
        world.clock.advance((due.due - world.clock.now()).total_seconds())  # nothing finished
        [copy] = world.bus.take("orders")
        assert isinstance(copy, OrderSubmitted) and copy.room_turn == turn  # its turn is kept
        world.submit(copy)
        [again] = world.bus.pending("orders")
        waits.append((again.due - world.clock.now()).total_seconds())
    assert waits == [2, 2, 4, 8, 16]  # as long as it has been past its turn


def test_a_wait_for_room_leaves_the_low_priority_yield_bound_alone():
    world = limited_world()
    for n in range(2):
        world.submit(submitted(f"o{n}"))
    world.submit(submitted("low").model_copy(update={"priority": "low"}))
    [copy] = world.bus.to("orders")
    assert isinstance(copy, OrderSubmitted) and copy.deferred_since is None


def test_high_priority_is_let_in_past_the_limit():
    world = limited_world()
    for n in range(2):
        world.submit(submitted(f"o{n}"))
    world.submit(submitted("urgent").model_copy(update={"priority": "high"}))
    assert world.state("urgent").process_state is ProcessState.PROCESSING


def test_a_burst_on_one_process_counts_what_it_let_in_since_its_last_count():
    world = World(workflows=LIMITED)
    counts = CountingStore(world.store)
    gate = InFlight(counts, world.clock, ttl=timedelta(seconds=1))
    app = world.app.named("scheduler-1", in_flight=gate)
    outcomes = [app.submit(submitted(f"o{n}")) for n in range(5)]  # within one second
    assert outcomes.count(SubmissionOutcome.ACCEPTED) == LIMIT and counts.asked == 1
    # A redelivery while it is full waits like any other submission, its place given back.
    assert app.submit(submitted("o0")) is SubmissionOutcome.DEFERRED
    assert gate.reserve("order", 4) == LIMIT


def test_places_are_reserved_as_they_are_read_so_threads_never_overshoot_together():
    world = World(workflows=LIMITED)
    gate = InFlight(world.store, world.clock, ttl=timedelta(seconds=1))
    assert [gate.reserve("order", 4) for _ in range(3)] == [0, 1, 2]
    gate.release("order")
    assert gate.reserve("order", 4) == 2


def test_a_store_that_cannot_count_holds_nothing_back_and_is_not_asked_again_at_once():
    world = World(workflows=LIMITED)
    down = Unanswering()
    app = world.app.named("scheduler-1", in_flight=InFlight(down, world.clock))
    for n in range(4):
        app.submit(submitted(f"o{n}"))
    assert all(world.store.get_state(f"o{n}") is not None for n in range(4))
    assert down.asked == 1  # the failure is remembered for the count's second


def test_a_wait_is_as_long_as_the_queue_ahead_takes_and_never_shorter_than_the_last():
    policy = InFlightPolicy(turnover=timedelta(seconds=30), cap=timedelta(seconds=120))

    def full(waiting: int = 0, pace: float = 0.0) -> timedelta | None:
        return policy.deferral("normal", in_flight=200, limit=200, waiting=waiting, pace=pace)

    assert policy.deferral("normal", in_flight=199, limit=200) is None
    assert full() == policy.base  # nobody else waits
    assert full(waiting=400) == timedelta(seconds=60)
    assert full(waiting=100_000) == policy.cap
    assert full(waiting=400, pace=4.0) == timedelta(seconds=100)  # the queue ahead at its pace
    # Past its turn, as long as it has been past it: about twice as long each time.
    waits, past = [], timedelta(0)
    for _ in range(5):
        wait = policy.deferral("normal", in_flight=200, limit=200, past_turn=past)
        assert wait is not None
        waits.append(wait.total_seconds())
        past += wait
    assert waits == [2, 2, 4, 8, 16]
    assert policy.deferral("high", in_flight=200, limit=200, waiting=100_000) is None


@pytest.mark.parametrize("bad", [0, -1, 100_001, 2.5, True])
def test_a_limit_that_admits_nothing_or_is_no_count_is_refused(bad):
    with pytest.raises(ValueError, match="max_in_flight"):
        Workflow("shop", SHOP.steps, max_in_flight=bad)


class CountingStore:
    def __init__(self, inner: StateStore) -> None:
        self.inner, self.asked = inner, 0

    def count_live(self, workflow: str, up_to: int, at: datetime) -> tuple[int, float]:
        self.asked += 1
        return self.inner.count_live(workflow, up_to, at)


class Unanswering:
    def __init__(self) -> None:
        self.asked = 0

    def count_live(self, workflow: str, up_to: int, at: datetime) -> tuple[int, float]:
        self.asked += 1
        raise ConnectionError("the store is down")


def test_the_queue_ahead_is_read_from_the_transport_at_most_once_a_second():
    world = World(workflows=LIMITED)
    asked: list[str] = []

    def depth(queue: str) -> int:
        asked.append(queue)
        return 3

    app = world.app.named("scheduler-1", in_flight=InFlight(world.store, world.clock, depth))
    for n in range(4):
        app.submit(submitted(f"o{n}"))
    assert asked == ["orders"]  # once, and only once it was full (one lane for all here)
    waits = [s.due - world.clock.now() for s in world.bus.pending("orders")]
    assert waits == [timedelta(seconds=45)] * 2  # 3 waiting x a 30 s turnover / a limit of 2
    # Counted again a second later: two in flight for a second on average each, so (Little's
    # law) in flight twice that long, a pace of one a second: the three waiting take 3 s.
    world.clock.advance(1)
    app.submit(submitted("o4"))
    [o4] = [p for p in world.bus.pending("orders") if p.correlation_id == "o4"]
    assert o4.due - world.clock.now() == timedelta(seconds=3)


def test_far_below_the_limit_a_count_lasts_ten_times_longer():
    world = World(workflows=Registry(workflows=(replace(SHOP, max_in_flight=10), STRICT)))
    counts = CountingStore(world.store)
    app = world.app.named("scheduler-1", in_flight=InFlight(counts, world.clock))
    for n, wait in enumerate((0, 2, 3, 4)):  # counts 0..3 of 10, each under half the limit
        world.clock.advance(wait)
        app.submit(submitted(f"o{n}"))
    assert counts.asked == 1  # 9 s: one count, and this process's own let-ins added on
    world.clock.advance(1)
    app.submit(submitted("o4"))
    assert counts.asked == 2  # ten seconds on


def test_a_workflow_without_a_limit_is_never_counted():
    world = World()  # the shop declares no max_in_flight
    counts = CountingStore(world.store)
    app = world.app.named("scheduler-1", in_flight=InFlight(counts, world.clock))
    for n in range(3):
        assert app.submit(submitted(f"o{n}")) is SubmissionOutcome.ACCEPTED
    assert counts.asked == 0  # no request on the happy path

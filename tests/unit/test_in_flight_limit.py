"""Bounded work in flight, in memory: past its workflow's ``max_in_flight`` a submission waits
in the waiting room (nothing else written) and a Supervisor sweep lets it in once there is room,
first come first, normal before low; high priority never waits; a count the store cannot give
holds nothing back. The count and the room against the Table store:
tests/integration/test_table_store.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from sas.domain.errors import InvalidMessage
from sas.domain.messages import OrderSubmitted, encode
from sas.domain.model import ProcessState
from sas.domain.priority import InFlightPolicy
from sas.domain.wire import room_row_key
from sas.domain.workflow import Registry, Workflow
from sas.services.in_flight import InFlight
from sas.services.ports import StateStore
from sas.services.submission import SubmissionOutcome
from sas.testing import refuse
from sas.testing.memory import InMemoryStore
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


def waiting(world: World) -> list[str]:
    return [w.order_id for w in world.store.list_waiting(SHOP.name, 100)]


def test_past_the_limit_a_submission_waits_in_the_room_until_a_sweep_lets_it_in():
    world = limited_world()
    outcomes = [world.app.submit(submitted(f"o{n}")) for n in range(3)]
    assert outcomes[2] is SubmissionOutcome.WAITING
    live = {m.order_id for m in world.store.list_live()}
    assert world.store.get_state("o2") is None and "o2" not in live  # nothing else written
    assert waiting(world) == ["o2"] and world.bus.to("orders") == []
    world.run()
    # The two finished: their markers count no more, and the next sweep lets the third in
    # without waiting for them to fall due.
    assert world.store.count_live(SHOP.name, 10) == 0
    assert world.tick()["let_in"] == 1
    assert waiting(world) == []
    world.settle_with_supervision(ticks=5)
    for n in range(3):
        assert world.state(f"o{n}").process_state is ProcessState.PROCESSED
        assert_effects_once(world, f"o{n}", *ALL_STEPS)


class ReadsCounted:
    """The store, recording which orders a sweep reads."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.read: list[str] = []

    def get_state(self, order_id: str):
        self.read.append(order_id)
        return self.inner.get_state(order_id)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_an_order_that_finishes_well_leaves_the_count_at_once_and_its_marker_goes_unread():
    world = limited_world()
    world.remote.script("shipping", "ship", refuse("HTTP 422 no courier"))
    world.submit(submitted("undone"))
    world.run()
    world.submit(submitted("done"))
    world.run()
    assert world.state("undone").process_state is ProcessState.COMPENSATED
    assert world.state("done").process_state is ProcessState.PROCESSED
    assert world.store.count_live(SHOP.name, 10) == 0
    markers = world.store.list_live()
    assert sorted(m.order_id for m in markers if m.finished) == ["done", "undone"]
    assert all(m.due_at <= world.clock.now() for m in markers)  # the next sweep drops them
    reads = ReadsCounted(world.store)
    world.supervisor = world.new_supervisor("supervisor-2", store=reads)
    budget = world.supervisor.ctx.retry_budget
    now = world.clock.now()
    while budget.take(now, expired_at=now):  # spent: what the two give back shows
        pass
    assert world.tick()["unindexed"] == 2
    assert reads.read == [] and world.store.list_live() == []
    assert budget.tokens(now) == pytest.approx(2 * budget.policy.per_finished)


def test_a_workflow_with_no_limit_leaves_its_finished_markers_to_their_due_sweep():
    world = World()
    world.submit(submitted("o1"))
    world.run()
    assert world.state("o1").process_state is ProcessState.PROCESSED
    [marker] = world.store.list_live()
    assert not marker.finished and marker.due_at > world.clock.now()


def test_an_order_in_error_keeps_its_place_until_a_sweep_has_sent_its_alert():
    world = World(workflows=Registry(workflows=(replace(STRICT, max_in_flight=LIMIT),)))
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    world.submit(submitted("failed").model_copy(update={"workflow": STRICT.name}))
    world.run()
    assert world.state("failed").process_state is ProcessState.ERROR
    assert world.store.count_live(STRICT.name, 10) == 1
    world.make_due("failed")
    world.tick()
    assert world.store.list_live() == [] and len(world.alerts()) == 1


def test_a_marker_the_store_did_not_finish_is_dropped_by_its_due_sweep_as_before():
    world = limited_world()
    store = world.store
    assert isinstance(store, InMemoryStore)

    def down(order_id, at):
        raise ConnectionError("the store is down")

    store.finish_live = down  # type: ignore[method-assign]
    world.submit(submitted("o1"))
    world.run()
    assert world.state("o1").process_state is ProcessState.PROCESSED  # finished all the same
    assert store.count_live(SHOP.name, 10) == 1
    world.tick(20)
    assert store.list_live() == []


def test_the_room_lets_in_first_come_first_and_normal_before_low():
    world = limited_world()
    for n in range(2):
        world.submit(submitted(f"o{n}"))
    arrivals = [("l1", "low"), ("n1", "normal"), ("l2", "low"), ("n2", "normal"), ("n3", "normal")]
    for order_id, priority in arrivals:
        world.clock.advance(1)
        world.submit(submitted(order_id).model_copy(update={"priority": priority}))
    assert waiting(world) == ["n1", "n2", "n3", "l1", "l2"]
    world.run()
    world.tick(20)  # the two in flight finished: their places go to n1 and n2
    assert waiting(world) == ["n3", "l1", "l2"]
    let_in = [m.order_id for m in world.bus.to("orders") if isinstance(m, OrderSubmitted)]
    assert let_in == ["n1", "n2"]
    world.settle_with_supervision(ticks=10)
    for order_id, _ in arrivals:
        assert world.state(order_id).process_state is ProcessState.PROCESSED


def test_a_submission_let_in_holds_its_place_before_it_arrives_and_is_not_counted_again():
    world = limited_world()
    for n in range(3):
        world.submit(submitted(f"o{n}"))
    world.run()
    world.tick(20)  # markers dropped, o2 let in: its marker is written with its send
    assert world.store.count_live(SHOP.name, 10) == 1
    assert [m.order_id for m in world.store.list_live()] == ["o2"]
    world.submit(submitted("o3"))
    world.submit(submitted("o4"))  # o2's place is taken: o4 waits
    assert waiting(world) == ["o4"]
    [o2] = [m for m in world.bus.to("orders") if isinstance(m, OrderSubmitted)]
    assert o2.order_id == "o2" and o2.room_turn == world.clock.now()
    assert world.app.submit(o2) is SubmissionOutcome.ACCEPTED  # full, yet it goes in


class RoomReads:
    """The store, recording how many rows each look into SHOP's room asked for."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.asked: list[int] = []

    def list_waiting(self, workflow: str, up_to: int):
        if workflow == SHOP.name:
            self.asked.append(up_to)
        return self.inner.list_waiting(workflow, up_to)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_sweep_reads_no_more_of_the_room_than_there_are_places():
    world = limited_world()
    for n in range(6):
        world.submit(submitted(f"o{n}"))
    reads = RoomReads(world.store)
    world.supervisor = world.new_supervisor("supervisor-2", store=reads)
    assert world.tick()["let_in"] == 0 and reads.asked == []  # full: the room is not read
    world.run()  # the two finish
    assert world.tick()["let_in"] == LIMIT and reads.asked == [LIMIT]
    assert waiting(world) == ["o4", "o5"]


def test_a_send_that_fails_leaves_its_row_and_those_sent_leave_the_room():
    world = limited_world()
    for n in range(4):
        world.submit(submitted(f"o{n}"))
    world.run()
    send = world.bus.send

    def o3_fails(queue: str, message: Any, **kwargs: Any) -> None:
        if getattr(message, "order_id", None) == "o3":
            raise ConnectionError("crash before sending")
        send(queue, message, **kwargs)

    world.bus.send = o3_fails  # type: ignore[method-assign]
    assert world.tick()["let_in"] == 0  # the sweep's let-in failed (and was logged)
    world.bus.send = send  # type: ignore[method-assign]
    assert waiting(world) == ["o3"]  # o2 was sent: it left the room
    # o2's place is held by its marker, o3's by its row alone: it takes none besides
    assert world.store.count_live(SHOP.name, 10) == 1
    assert world.store.count_held(SHOP.name, 10) == LIMIT
    assert world.tick()["let_in"] == 1  # the next sweep sends it
    world.tick(20)
    world.settle_with_supervision(ticks=20, step_seconds=30)  # orphans dropped after 5 min
    assert waiting(world) == []
    for n in range(4):
        assert world.state(f"o{n}").process_state is ProcessState.PROCESSED


def test_an_order_sent_twice_into_the_room_gets_one_marker_and_runs_once():
    world = limited_world()
    for n in range(2):
        world.submit(submitted(f"o{n}"))
    world.submit(submitted("twice"))
    world.clock.advance(1)
    world.submit(submitted("twice"))  # the submitter sent it again: a second row
    assert waiting(world) == ["twice", "twice"]
    world.run()
    assert world.tick()["let_in"] == 2
    assert world.deliver("orders") == [SubmissionOutcome.ACCEPTED, SubmissionOutcome.DUPLICATE]
    world.settle_with_supervision(ticks=5)
    assert waiting(world) == []
    assert_effects_once(world, "twice", *ALL_STEPS)


def test_one_send_that_fails_holds_no_place_and_the_next_sweep_lets_the_rest_in():
    world = limited_world()
    for n in range(2 * LIMIT):
        world.submit(submitted(f"o{n}"))
    world.run()  # o0, o1 finish: both places free, o2 and o3 wait
    world.bus.fail_next_send_to.add("orders")  # the queue blinks on o2's send
    world.tick(20)
    assert waiting(world) == ["o2", "o3"] and world.store.count_live(SHOP.name, 10) == 0
    assert world.tick(20)["let_in"] == LIMIT  # not held for an orphan's five minutes
    world.run()
    assert waiting(world) == []


def test_a_place_freed_goes_to_a_waiting_submission_before_later_arrivals():
    """Waiting rows hold places in a submission's count: a finish frees its place at once,
    but newcomers take only places no waiting submission needs, so none waits past the next
    sweep however many keep arriving."""
    world = limited_world()
    for n in range(LIMIT):
        world.submit(submitted(f"o{n}"))
    world.clock.advance(1)
    assert world.app.submit(submitted("early")) is SubmissionOutcome.WAITING
    world.run()  # both finish: two places free, one of them early's
    outcomes = [world.app.submit(submitted(f"late{n}")) for n in range(LIMIT)]
    assert outcomes == [SubmissionOutcome.ACCEPTED, SubmissionOutcome.WAITING]
    assert world.tick(20)["let_in"] == 1  # the next sweep: early's place was kept for it
    assert waiting(world) == ["late1"]
    world.deliver("orders")
    assert world.state("early").process_state is ProcessState.PROCESSING


def test_an_order_that_finishes_while_a_sweep_reads_it_gives_the_budget_one_share():
    world = limited_world()
    store = world.store
    assert isinstance(store, InMemoryStore)
    budget = world.supervisor.ctx.retry_budget
    finish_live = store.finish_live

    def sweep_between_the_write_and_the_flag(order_id: str, at: datetime) -> None:
        assert world.supervisor.sweep()["unindexed"] == 1  # read Processed: dropped
        finish_live(order_id, at)

    store.finish_live = sweep_between_the_write_and_the_flag  # type: ignore[method-assign]
    world.submit(submitted("o1"))
    world.clock.advance(120)  # its marker falls due, no sweep yet
    now = world.clock.now()
    while budget.take(now, expired_at=now):  # spent: what o1 gives back shows
        pass
    world.run()
    assert world.tick()["unindexed"] == 1  # the flag written after that drop
    assert store.list_live() == []
    assert budget.tokens(now) == pytest.approx(budget.policy.per_finished)


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
    assert (policy.room("normal", 10), policy.room("low", 10), policy.room("high", 10)) == (
        10,
        9,
        None,
    )
    assert policy.room("low", 1) == 1


def test_a_let_in_sent_twice_is_a_redelivery_and_a_lost_drop_only_sends_it_again():
    world = limited_world()
    store = world.store
    assert isinstance(store, InMemoryStore)
    for n in range(3):
        world.submit(submitted(f"o{n}"))
    world.run()
    kept = store.list_waiting(SHOP.name, 1)
    original = store.drop_waiting
    store.drop_waiting = lambda waiting: False  # type: ignore[method-assign]  # a crash
    assert world.tick(20)["let_in"] == 1
    store.drop_waiting = original  # type: ignore[method-assign]
    assert store.list_waiting(SHOP.name, 1) == kept
    world.run()  # o2 goes through
    assert world.tick()["let_in"] == 1  # and is let in again
    outcomes = world.deliver("orders")
    assert outcomes == [SubmissionOutcome.DUPLICATE]
    world.settle_with_supervision(ticks=5)
    assert waiting(world) == []
    assert_effects_once(world, "o2", *ALL_STEPS)


def test_a_let_in_delivered_twice_gives_back_no_place_it_did_not_take():
    world = World(workflows=LIMITED)
    gate = InFlight(world.store, world.clock, ttl=timedelta(seconds=1))  # counts cached 1 s
    world.app = world.app.named("scheduler-1", in_flight=gate)
    for n in range(3):
        world.submit(submitted(f"o{n}"))
    world.run()
    world.clock.advance(2)
    assert world.tick(20)["let_in"] == 1  # o2 holds its place by its marker
    assert world.app.submit(submitted("o3")) is SubmissionOutcome.ACCEPTED
    outcomes = world.deliver("orders", twice=True)
    assert outcomes == [SubmissionOutcome.ACCEPTED, SubmissionOutcome.DUPLICATE]
    assert world.app.submit(submitted("o4")) is SubmissionOutcome.WAITING  # still full


def test_what_waits_for_a_workflow_a_deploy_removed_is_sent_back_and_refused():
    world = limited_world()
    for n in range(3):
        world.submit(submitted(f"o{n}"))
    world.run()
    without_shop = Registry(workflows=(replace(STRICT, max_in_flight=LIMIT),))
    world.app = world.app.named("scheduler-2", workflows=without_shop)
    world.supervisor = world.app.named("supervisor-2")
    assert world.tick(20)["let_in"] == 1
    assert waiting(world) == []
    [back] = world.bus.take("orders")
    assert isinstance(back, OrderSubmitted) and back.order_id == "o2"
    with pytest.raises(InvalidMessage, match="unknown workflow"):  # its trigger parks it
        world.app.submit(back)


def test_a_row_the_room_cannot_read_is_parked_and_does_not_block_the_rest():
    world = limited_world()
    now = world.clock.now()
    world.store.wait_for_room(room_row_key(SHOP.name, "normal", now, "bad"), "bad", b"{not json")
    row = room_row_key(SHOP.name, "normal", now, "good")
    world.store.wait_for_room(row, "good", encode(submitted("good")))
    assert world.tick()["let_in"] == 1
    assert waiting(world) == []
    assert [p.reason for p in world.store.list_parked()] == ["unreadable in the waiting room"]


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
    assert app.submit(submitted("o0")) is SubmissionOutcome.WAITING
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


@pytest.mark.parametrize("bad", [0, -1, 100_001, 2.5, True])
def test_a_limit_that_admits_nothing_or_is_no_count_is_refused(bad):
    with pytest.raises(ValueError, match="max_in_flight"):
        Workflow("shop", SHOP.steps, max_in_flight=bad)


class CountingStore:
    def __init__(self, inner: StateStore) -> None:
        self.inner, self.asked = inner, 0

    def count_held(self, workflow: str, up_to: int) -> int:
        self.asked += 1
        return self.inner.count_held(workflow, up_to)


class Unanswering:
    def __init__(self) -> None:
        self.asked = 0

    def count_held(self, workflow: str, up_to: int) -> int:
        self.asked += 1
        raise ConnectionError("the store is down")


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

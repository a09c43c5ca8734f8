"""The Supervisor's in-flight index on Azurite: only due markers are read, a healthy order's
marker is re-armed to its next deadline; and the reply rule: a step that expired while its
reply (sent in time) waited in a backlog is completed by that reply when it arrives."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from sas import bootstrap
from sas.domain.model import ProcessState
from sas.domain.transitions import claim, initial_state
from sas.domain.workflow import ORDER_WORKFLOW
from sas.services.scheduler import ReplyOutcome
from sas.services.supervisor import Supervisor
from tests.fakes import FakeClock
from tests.harness import BUDGET, ROUTES, World, permanent
from tests.integration.test_failure_modes import assert_effects_once, order

pytestmark = pytest.mark.integration

ALL_STEPS = (("inventory", "reserve"), ("payment", "charge"), ("shipping", "ship"))


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
    world.clock.advance(BUDGET - 5)  # the first step's deadline (the marker's due) passed...
    (marker,) = world.store.list_live()
    assert marker.due_at <= world.clock.now()
    assert world.tick(1)["healthy"] == 1  # ...but the order is healthy: re-armed
    (rearmed,) = world.store.list_live()
    assert rearmed.due_at == state.complete_by
    assert world.tick(0).total() == 0  # not due again before that


def test_a_reply_that_comes_as_the_marker_falls_due_moves_it_and_the_sweep_reads_nothing(world):
    """Under a backlog a step ends about when its marker is due: the Scheduler moves the
    marker to the next deadline itself (sas/services/marker_moves.py), so the sweep does not
    read a healthy order only to re-arm it."""
    oid = order(world)
    world.deliver("agent-inventory")
    world.clock.advance(BUDGET - 1)
    world.deliver("replies")  # the second step starts a second before the first deadline
    state = world.state(oid)
    (marker,) = world.store.list_live()
    assert marker.due_at == state.complete_by
    counting = CountingStore(world.store)
    supervisor = world.new_supervisor("supervisor-2", store=counting)
    world.clock.advance(2)  # the first deadline passed
    assert supervisor.sweep().total() == 0 and counting.state_reads == 0


def test_recovery_still_comes_by_the_deadline_of_a_later_shorter_step(world):
    """The marker is due no later than any deadline a transition can set after it was
    written: an agent that dies on a later step is recovered within its own budget."""
    oid = order(world)
    world.deliver("agent-inventory"), world.deliver("replies")
    world.drop("agent-payment")  # the second step's agent died
    world.tick(BUDGET + 2.5)  # the second step's deadline and the skew allowance
    assert "expired_retry" in world.history(oid)


def first_reply_waits_past_its_expiry(world) -> str:
    """The first step's agent replies in time; the reply waits in a backlog while the step
    expires (the Supervisor does not look at queues)."""
    oid = order(world)
    world.deliver("agent-inventory")
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["retry"] == 1
    return oid


def test_a_reply_sent_in_time_that_arrives_after_its_step_was_claimed_again_applies(world):
    oid = first_reply_waits_past_its_expiry(world)
    (late,) = world.bus.take("replies")
    world.clock.advance(3)
    world.deliver("scheduler")  # the retry: attempt 2 claimed and sent
    assert (world.state(oid).attempt, world.state(oid).step_index) == (2, 0)
    assert world.scheduler.on_reply(late) is ReplyOutcome.ADVANCED  # attempt 1's ok applies
    assert world.state(oid).step_index == 1
    world.run()  # attempt 2's call is answered from the key; its reply is now the stale one
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert world.history(oid).count("reply_dropped") == 1
    assert_effects_once(world, oid, *ALL_STEPS)
    reserve_calls = [c for c in world.remote.calls if c[1] == "reserve"]
    assert len(reserve_calls) == 2  # what the rule costs: one remote call more


def test_an_ok_that_arrives_while_its_step_waits_for_the_retry_completes_it(world):
    oid = first_reply_waits_past_its_expiry(world)
    world.deliver("replies")  # before the retry's backoff ended: applied, nothing runs again
    assert world.state(oid).step_index == 1
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert len([c for c in world.remote.calls if c[1] == "reserve"]) == 1
    assert_effects_once(world, oid, *ALL_STEPS)


def test_a_refusal_that_arrives_after_its_attempt_expired_is_dropped(world):
    """A refusal applied nothing and speaks only for its attempt: the retry decides."""
    world.remote.script[("inventory", "reserve")] = [permanent()]
    oid = first_reply_waits_past_its_expiry(world)
    (refusal,) = world.bus.take("replies")
    world.clock.advance(3)
    world.deliver("scheduler")
    assert world.scheduler.on_reply(refusal) is ReplyOutcome.STALE
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert_effects_once(world, oid, *ALL_STEPS)


def test_an_ok_that_arrives_after_compensation_began_is_dropped_and_the_undo_undoes(table):
    """Past the threshold the step is compensated including itself: its late ok no longer
    applies, and its undo takes the effect back."""
    world = World(table, max_failures=1)
    oid = order(world)
    world.deliver("agent-inventory")  # reserve applied, its reply stuck in a backlog
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["compensate"] == 1
    assert world.deliver("replies") == [ReplyOutcome.STALE]
    world.run()
    assert world.state(oid).process_state is ProcessState.COMPENSATED
    assert world.remote.applied(oid) == {("inventory", "reserve"): True}


def test_without_a_queued_reply_the_step_expires_as_before(world):
    oid = order(world)
    world.drop("agent-inventory")  # the agent died: no reply anywhere
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["retry"] == 1
    assert world.state(oid).process_state is ProcessState.PENDING


def test_a_parallel_sweep_examines_every_due_order_once(world):
    ids = [order(world, f"p{n:02d}") for n in range(12)]
    world.drop("agent-inventory")  # every agent died
    parallel = Supervisor(
        world.store,
        world.bus,
        ROUTES,
        world.clock,
        "supervisor-p",
        world.policy,
        parallelism=4,
    )
    world.clock.advance(BUDGET + 1)
    report = parallel.sweep()
    assert report["retry"] == len(ids)
    assert all(world.state(oid).failure_count == 1 for oid in ids)
    assert parallel.sweep().total() == 0  # every marker re-armed to the retry's deadline


def test_a_finished_order_takes_its_marker_with_it_and_no_sweep_reads_it(world):
    """The Scheduler that finishes an order drops its marker (sas/services/marker_moves.py):
    the Supervisor's read of the finished order and its delete of the marker are not needed."""
    oid = order(world)
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert world.store.list_live() == []
    counting = CountingStore(world.store)
    supervisor = world.new_supervisor("supervisor-2", store=counting)
    world.clock.advance(3600)
    assert supervisor.sweep().total() == 0 and counting.state_reads == 0
    assert_effects_once(world, oid, *ALL_STEPS)


def test_a_drop_held_past_a_purge_never_takes_the_marker_of_a_new_order_under_that_id(world):
    """A finished order's drop waits for the Scheduler's next send; meanwhile the order is
    purged and a new order arrives under its id. The drop names the marker the first order's
    submission wrote, so the new order keeps its own and stays supervised."""
    first, held = order(world, "first"), order(world, "held")
    world.run()  # both finish: the first's drop goes at once, the other waits for the window
    assert [m.order_id for m in world.store.list_live()] == [held]
    old_etag = world.state(held).marker_etag
    world.clock.advance(0.5)
    report = world.operator.purge(timedelta(0), dry_run=False)
    assert {s.order_id for s in report.candidates} == {first, held} and report.purged == 2
    order(world, held)  # the same id again: a new order, indexed anew
    world.deliver("orders")
    (marker,) = world.store.list_live()
    assert marker.etag != old_etag
    sent = []
    settle = world.store.settle_live

    def recording(moves: Any, drops: Any, finishes: Any = ()) -> Any:
        sent.append(list(drops))
        return settle(moves, drops, finishes)

    world.store.settle_live = recording
    world.clock.advance(1)  # the window is over: the next write sends the held drop with it
    world.deliver("agent-inventory")
    world.deliver("replies")
    assert sent == [[(held, old_etag)]]  # sent, and refused by the new marker's ETag
    assert world.state(held).step_index == 1 and not world.state(held).is_terminal
    (kept,) = world.store.list_live()
    assert kept.order_id == held and kept.touched_at == marker.touched_at
    world.clock.advance(BUDGET + 1)  # its agent never answers: the Supervisor still sees it
    assert world.tick().total() == 1
    assert world.history(held)[-1] == "expired_retry"


def finished_in_a_backlog(world) -> str:
    """An order whose steps answer as their deadlines come near, so it finishes well past
    the time its marker could still be dropped by the submission's ETag."""
    oid = order(world)
    world.deliver("agent-inventory")
    world.clock.advance(BUDGET - 1)
    world.deliver("replies")  # the marker falls due: the Scheduler moves it
    world.deliver("agent-payment")
    world.clock.advance(1.5)  # the moves' window is over
    world.deliver("replies")
    world.deliver("agent-shipping")
    world.deliver("replies")
    assert world.state(oid).process_state is ProcessState.PROCESSED
    return oid


def test_an_order_finished_in_a_backlog_is_marked_and_the_sweep_drops_it_unread(world, caplog):
    """Too late to drop the marker on the submission's ETag, the Scheduler marks it finished
    (sas/services/marker_moves.py); the next sweep drops it without reading the order, where
    it used to read the order and then delete the marker alone."""
    oid = finished_in_a_backlog(world)
    (marker,) = world.store.list_live()
    assert marker.finished and marker.due_at <= world.clock.now()
    assert marker.finished_touch == world.state(oid).marker_touch is not None
    counting = CountingStore(world.store)
    supervisor = world.new_supervisor("supervisor-2", store=counting)
    caplog.set_level(logging.INFO, logger="sas.services.supervisor")
    assert supervisor.sweep() == {"finished_unindexed": 1} and counting.state_reads == 0
    (swept,) = [r for r in caplog.records if r.getMessage() == "sas.supervisor_sweep"]
    assert swept.orders_read == 0  # what the benchmark counts as the Supervisor's reads
    assert world.store.list_live() == []
    assert_effects_once(world, oid, *ALL_STEPS)


def test_a_finished_mark_on_a_marker_touched_since_is_not_trusted(world):
    """A redelivered submission touches the marker again after the mark: the sweep reads
    the order before it drops the marker."""
    oid = finished_in_a_backlog(world)
    order(world, oid)  # the order's message delivered again
    (marker,) = world.store.list_live()
    assert not marker.finished
    counting = CountingStore(world.store)
    supervisor = world.new_supervisor("supervisor-2", store=counting)
    world.clock.advance(BUDGET)
    assert supervisor.sweep() == {"unindexed": 1} and counting.state_reads == 1
    assert world.store.list_live() == []


def test_a_late_finished_mark_never_unindexes_a_new_order_under_that_id(world):
    """A mark of a finished order lands after the order was purged and a new one arrived
    under its id, submitted (a clock set back) at the very microsecond the first was: the
    mark names the first submission's touch id, so the new order stays supervised and a dead
    agent's step is still recovered."""
    oid = order(world)
    world.run()
    first = world.state(oid)
    assert first.process_state is ProcessState.PROCESSED and world.store.list_live() == []
    world.clock.advance(0.5)
    assert world.operator.purge(timedelta(0), dry_run=False).purged == 1
    resumed_at, world.clock.current = world.clock.current, first.submitted_at
    order(world, oid)  # a new order under the same id, at the same instant
    world.clock.current = resumed_at
    assert first.marker_touch is not None
    world.store.settle_live([], [], [(oid, world.clock.now(), first.marker_touch)])
    (marker,) = world.store.list_live()
    assert marker.touched_at == first.submitted_at
    assert marker.finished_touch == first.marker_touch and not marker.finished
    assert world.tick(0) == {"healthy": 1}  # due at once, read, and re-armed
    world.drop("agent-inventory")  # its agent never answers
    world.clock.advance(BUDGET + 1)
    assert world.tick().total() == 1
    assert world.history(oid)[-1] == "expired_retry"


def test_the_supervise_timer_sends_the_marker_writes_its_process_still_holds(app_env, monkeypatch):
    """The last orders of a burst: their drops and finish marks wait for the Scheduler's next
    write, which may never come. The app's Supervisor (the ``supervise`` timer's) sends them
    before its sweep lists the due markers, on the one MarkerMoves its process's Scheduler
    fills (sas/bootstrap.py): the sweep then drops the marked marker without reading."""
    clock = FakeClock()
    monkeypatch.setattr(bootstrap, "clock", lambda: clock)
    store, moves = bootstrap.store(), bootstrap.marker_moves()
    assert bootstrap.scheduler()._moves is moves  # one per process
    now = clock.now()
    finished: dict[str, tuple[Any, Any]] = {}
    for oid in ("first", "held", "marked"):
        etag = store.touch_live(oid, now, now + timedelta(hours=1), touch=f"touch-{oid}")
        running = replace(
            claim(
                initial_state(oid, ORDER_WORKFLOW, reply_to=None, now=now),
                instance_id="s1",
                now=now,
                workflow=ORDER_WORKFLOW,
            ),
            marker_etag=etag,
            marker_touch=f"touch-{oid}",
        )
        finished[oid] = (running, replace(running, process_state=ProcessState.PROCESSED))
    moves.after_write(*finished["first"], now)  # the first send: at once
    moves.after_write(*finished["held"], now)  # within the window: held
    moves.after_write(*finished["marked"], now + timedelta(seconds=30))  # past the drop's cutoff
    assert sorted(m.order_id for m in store.list_live()) == ["held", "marked"]
    clock.advance(1.1)
    assert bootstrap.supervisor().sweep() == {"finished_unindexed": 1}  # marked, due, unread
    assert store.list_live() == []

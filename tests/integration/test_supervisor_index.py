"""The Supervisor's in-flight index on Azurite: only due markers are read, a healthy order's
marker is re-armed to its next deadline, and a step whose reply was sent in time is not
expired while that reply may still be waiting in the replies queue."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from sas import bootstrap
from sas.domain.model import ProcessState
from sas.domain.transitions import RetryPolicy, claim, initial_state
from sas.domain.workflow import ORDER_WORKFLOW
from sas.services.scheduler import ReplyOutcome
from sas.services.supervisor import Supervisor
from tests.fakes import FakeClock
from tests.harness import BUDGET, ROUTES, Envelope
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


def test_a_reply_sent_in_time_and_still_queued_is_not_thrown_away(world):
    oid = order(world)
    world.deliver("agent-inventory")  # the agent replied in time; the reply waits in a backlog
    world.clock.advance(BUDGET + 5)
    report = world.tick(0)
    assert report["held_for_reply"] == 1 and "retry" not in report
    world.deliver("replies")  # the backlog drains: the reply applies
    assert world.state(oid).step_index == 1
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert_effects_once(world, oid, *ALL_STEPS)
    requests = [e for q, e in world.bus.sent if q == "agent-inventory"]
    assert len(requests) == 1  # the finished step never ran again


def test_without_a_queued_reply_the_step_expires_as_before(world):
    oid = order(world)
    world.drop("agent-inventory")  # the agent died: no reply anywhere
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["retry"] == 1
    assert world.state(oid).process_state is ProcessState.PENDING


def test_the_hold_for_a_reply_is_bounded(world):
    oid = order(world)
    world.deliver("agent-inventory")  # a reply that will stay queued (its consumer is stuck)
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["held_for_reply"] == 1
    hold = world.policy.reply_hold.total_seconds()
    assert world.tick(hold)["retry"] == 1  # past the hold: expired, the fence decides later
    world.deliver("replies")
    assert "reply_dropped" in world.history(oid)


def replied_behind_a_backlog(world, older: int, spread_seconds: float) -> str:
    """An order whose first step replied in time; the reply waits in the replies queue behind
    ``older`` replies enqueued before it (the oldest ``spread_seconds`` earlier)."""
    oid = order(world)
    world.deliver("agent-inventory")
    (reply,) = world.bus.queues["replies"]
    world.bus.queues["replies"][:0] = [
        Envelope(reply.message, f"older-{n}", reply.due - timedelta(seconds=spread_seconds - n))
        for n in range(older)
    ]
    return oid


def held_while_draining_through_the_hold(world, oid: str) -> None:
    """Sweep every recheck past the plain hold while consumers take one older reply each time:
    the step stays held all along."""
    world.clock.advance(BUDGET + 1)
    recheck = world.policy.reply_recheck.total_seconds()
    while world.clock.now() < world.state(oid).complete_by + world.policy.reply_hold:
        assert world.tick(recheck)["held_for_reply"] == 1
        del world.bus.queues["replies"][:1]


def test_a_backlog_that_outlasts_the_hold_keeps_the_step_held_while_it_drains(world):
    """Past the hold, a step whose reply may still be queued stays held as long as the
    replies lane is being worked through, never past ``reply_hold_max``."""
    oid = replied_behind_a_backlog(world, older=200, spread_seconds=600)
    policy, deadline = world.policy, world.state(oid).complete_by
    world.clock.advance(BUDGET + 1)
    recheck = policy.reply_recheck.total_seconds()
    while world.clock.now() < deadline + policy.reply_hold_max - policy.reply_recheck:
        assert world.tick(recheck) == {"held_for_reply": 1}
        del world.bus.queues["replies"][:2]  # other consumers take the oldest replies
    assert world.clock.now() > deadline + 3 * policy.reply_hold  # well past the plain hold
    assert world.tick(recheck)["retry"] == 1  # the bound holds even for a draining lane
    del world.bus.queues["replies"][:-1]
    world.deliver("replies")
    assert "reply_dropped" in world.history(oid)


def test_past_the_hold_a_lane_that_stops_moving_ends_the_hold(world):
    """A lane counts as moving if its front moved within the last ``reply_hold`` (a host takes
    replies in batches, so the front moves in steps); one that has not moved for that long
    ends the hold."""
    oid = replied_behind_a_backlog(world, older=20, spread_seconds=60)
    held_while_draining_through_the_hold(world, oid)
    policy = world.policy
    recheck = policy.reply_recheck.total_seconds()
    stopped = world.clock.now()  # the front moved last just before this
    while world.clock.now() + policy.reply_recheck <= stopped + policy.reply_hold:
        assert world.tick(recheck)["held_for_reply"] == 1  # a pause shorter than the window
    assert world.tick(recheck)["retry"] == 1  # not moved for a whole reply_hold: expired


def test_a_long_sweep_still_compares_the_lane_with_earlier_sweeps(world, monkeypatch):
    """A sweep that takes seconds (a burst) must not compare the lane with its own peek."""
    oid = replied_behind_a_backlog(world, older=20, spread_seconds=60)
    held_while_draining_through_the_hold(world, oid)
    recheck = world.policy.reply_recheck.total_seconds()
    peek = world.bus.oldest_waiting

    def slow_peek(queue: str) -> Any:
        oldest = peek(queue)
        world.clock.advance(2 * recheck)  # the sweep got here seconds after it began
        return oldest

    monkeypatch.setattr(world.bus, "oldest_waiting", slow_peek)
    assert world.tick(recheck)["held_for_reply"] == 1


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


def test_a_held_step_is_looked_at_again_after_the_recheck_not_on_every_sweep(world):
    order(world)
    world.deliver("agent-inventory")  # its reply waits in a backlog
    world.clock.advance(BUDGET + 3)
    assert world.tick(0)["held_for_reply"] == 1
    assert world.tick(1).total() == 0  # a backlog costs one read per held step per recheck
    recheck = world.policy.reply_recheck.total_seconds()
    assert world.tick(recheck)["held_for_reply"] == 1


def hosted(world) -> tuple[Supervisor, float]:
    """A Supervisor with the product's ``reply_in_flight``: its replies come through a host,
    which hides the ones it has taken while it works on them (the harness's bus hands them
    over at once)."""
    policy = replace(world.policy, reply_in_flight=RetryPolicy().reply_in_flight)
    supervisor = Supervisor(world.store, world.bus, ROUTES, world.clock, "hosted", policy)
    return supervisor, policy.reply_in_flight.total_seconds()


def applied_and_never_run_again(world, supervisor: Supervisor, oid: str, reply: Any) -> None:
    """The held step's reply arrives and applies; the step is not expired, and the order
    finishes with each effect once and one request to the first agent."""
    assert world.scheduler.on_reply(reply) is ReplyOutcome.ADVANCED  # it arrives: applied
    world.clock.advance(1)
    assert supervisor.sweep()["retry"] == 0
    world.run()
    assert "reply_dropped" not in world.history(oid)
    assert_effects_once(world, oid, *ALL_STEPS)
    assert len([e for q, e in world.bus.sent if q == "agent-inventory"]) == 1


def test_a_reply_a_host_took_by_the_deadline_is_not_run_again(world):
    oid = order(world)
    world.deliver("agent-inventory")  # replied in time...
    (reply,) = world.bus.take("replies")  # ...and taken by a host: no longer in the queue
    supervisor, in_flight = hosted(world)
    world.clock.advance(BUDGET + in_flight - 0.5)
    assert supervisor.sweep()["held_for_reply"] == 1
    applied_and_never_run_again(world, supervisor, oid, reply)


def test_without_a_reply_recovery_comes_reply_in_flight_later(world):
    oid = order(world)
    world.drop("agent-inventory")  # the agent died: no reply anywhere
    supervisor, in_flight = hosted(world)
    world.clock.advance(BUDGET + in_flight - 0.5)
    assert supervisor.sweep()["held_for_reply"] == 1
    assert world.state(oid).process_state is ProcessState.PROCESSING
    world.clock.advance(0.5)  # the marker was re-armed to the end of the hold
    assert supervisor.sweep()["retry"] == 1
    assert world.state(oid).process_state is ProcessState.PENDING


def seen_waiting_past_the_deadline_then_taken(world) -> tuple[str, Supervisor, float, Any]:
    """An order whose first step replied in time; a sweep in the first hold saw the reply
    still queued, and a host took it after that hold ended (returned, not yet applied)."""
    oid = order(world)
    world.deliver("agent-inventory")  # replied in time; the reply waits behind a backlog
    supervisor, in_flight = hosted(world)
    world.clock.advance(BUDGET + 1)
    assert supervisor.sweep()["held_for_reply"] == 1  # seen waiting, past the deadline
    world.clock.advance(in_flight + 5)  # the first hold is over; the reply is still queued
    (reply,) = world.bus.take("replies")  # now a host takes it, and is slow to apply it
    return oid, supervisor, in_flight, reply


def test_a_reply_taken_after_the_deadline_is_awaited_from_when_a_sweep_saw_it_gone(world):
    oid, supervisor, in_flight, reply = seen_waiting_past_the_deadline_then_taken(world)
    assert supervisor.sweep()["held_for_reply"] == 1  # gone from the lane: maybe on its way
    world.clock.advance(in_flight - 0.5)
    applied_and_never_run_again(world, supervisor, oid, reply)


def test_a_reply_seen_waiting_and_then_never_applied_ends_the_hold_in_flight_after(world):
    oid, supervisor, in_flight, reply = seen_waiting_past_the_deadline_then_taken(world)
    assert supervisor.sweep()["held_for_reply"] == 1
    world.clock.advance(in_flight)  # the host that took it died with it: recovery comes now
    assert supervisor.sweep()["retry"] == 1
    assert world.state(oid).process_state is ProcessState.PENDING
    assert world.scheduler.on_reply(reply) is ReplyOutcome.STALE  # too late: fenced
    assert "reply_dropped" in world.history(oid)


def replied_then_taken_unseen_behind_a_lagging_lane(world) -> tuple[Supervisor, float, Any]:
    """o1's first step replied in time and a host took the reply, while nobody looked; the
    replies sent since, from 5 s past the deadline on, wait 7 s when the Supervisor first
    looks (its sweeps run late on a saturated instance)."""
    order(world, "o1")
    world.deliver("agent-inventory")
    (reply,) = world.bus.take("replies")  # taken by a host that is behind
    supervisor, in_flight = hosted(world)
    world.clock.advance(BUDGET + in_flight)
    order(world, "o2")
    world.deliver("agent-inventory")  # its reply waits: the lane lags
    world.clock.advance(7)
    return supervisor, in_flight, reply


def test_a_reply_taken_unseen_by_a_host_that_is_behind_is_awaited_from_the_first_look(world):
    supervisor, in_flight, reply = replied_then_taken_unseen_behind_a_lagging_lane(world)
    assert supervisor.sweep() == {"held_for_reply": 1}  # o1, looked at 12 s past its deadline
    world.clock.advance(in_flight - 0.5)
    assert world.scheduler.on_reply(reply) is ReplyOutcome.ADVANCED  # it arrives: applied
    world.clock.advance(1)
    assert supervisor.sweep()["retry"] == 0
    assert "reply_dropped" not in world.history("o1")
    assert world.state("o1").step_index == 1


def test_a_dead_agent_behind_a_lagging_lane_is_recovered_reply_in_flight_after_the_look(world):
    supervisor, in_flight, _ = replied_then_taken_unseen_behind_a_lagging_lane(world)
    assert supervisor.sweep() == {"held_for_reply": 1}  # the host that took it died with it
    world.clock.advance(in_flight)
    assert supervisor.sweep() == {"retry": 1}
    assert world.state("o1").process_state is ProcessState.PENDING


@pytest.mark.parametrize("first_look", [0.1, 2.0, 4.0])
def test_a_dead_agents_recovery_waits_for_no_reply_that_was_only_passing_through(world, first_look):
    """Another order's reply, queued a moment before the deadline and taken a moment after
    the Supervisor's first look, is no sign of a host behind: the dead agent's step is
    recovered as without it, whenever that look came."""
    dead = order(world, "o-dead")
    world.drop("agent-inventory")  # its agent died holding the request
    supervisor, in_flight = hosted(world)
    world.clock.advance(BUDGET - 0.1)
    order(world, "o-other")
    world.deliver("agent-inventory")  # the other order's reply, just before the deadline
    world.clock.advance(0.1 + first_look)
    assert supervisor.sweep()["held_for_reply"] == 1  # a reply from before the deadline waits
    world.deliver("replies")  # taken and applied at once
    deadline = world.state(dead).complete_by
    world.clock.advance(
        (deadline + timedelta(seconds=in_flight) - world.clock.now()).total_seconds()
    )
    assert supervisor.sweep()["retry"] == 1  # deadline + reply_in_flight, as with no reply
    assert world.state(dead).process_state is ProcessState.PENDING


def test_the_hold_from_a_reply_seen_gone_still_ends_by_reply_hold_max(world):
    oid = replied_behind_a_backlog(world, older=200, spread_seconds=600)
    supervisor, _ = hosted(world)
    policy, deadline = world.policy, world.state(oid).complete_by
    recheck = policy.reply_recheck
    last_look = deadline + policy.reply_hold_max - timedelta(seconds=3)
    world.clock.advance(BUDGET + 1)
    while world.clock.now() + recheck <= last_look:
        assert supervisor.sweep() == {"held_for_reply": 1}  # the backlog drains slowly
        del world.bus.queues["replies"][:2]
        world.clock.advance(recheck.total_seconds())
    world.clock.advance((last_look - world.clock.now()).total_seconds())
    world.bus.take("replies")  # a host takes the rest, this step's reply among them
    assert supervisor.sweep() == {"held_for_reply": 1}  # seen gone: maybe on its way
    world.clock.advance(3)  # reply_hold_max past the deadline, less than reply_in_flight on
    assert supervisor.sweep() == {"retry": 1}


def test_a_supervisor_that_has_not_watched_the_lane_for_a_whole_hold_keeps_holding(world):
    """A Supervisor that took over (a restart, the timer moved) and has watched the lane for
    only 2 s does not judge it stopped: a host takes replies in steps."""
    a = order(world, "o-a")
    world.deliver("agent-inventory")  # a's reply waits at the front of the lane all along
    deadline = world.state(a).complete_by
    hold = world.policy.reply_hold.total_seconds()
    world.clock.advance(hold - 3)
    order(world, "o-b")
    world.drop("agent-inventory")  # b's agent died: looked at 1 s past its deadline, 2 s before a
    (marker,) = [m for m in world.store.list_due(world.clock.now()) if m.order_id == a]
    look_at_a = deadline + timedelta(seconds=hold)  # another instance held a until then
    assert world.store.rearm_live([(marker, look_at_a)]) == 1
    supervisor, _ = hosted(world)  # this instance's first sweeps
    world.clock.advance(BUDGET + 1)
    assert supervisor.sweep() == {"held_for_reply": 1}  # b, in its first seconds: a peek
    world.clock.advance((look_at_a - world.clock.now()).total_seconds())
    assert supervisor.sweep() == {"held_for_reply": 1}  # a: the lane watched for 2 s only


def test_a_failed_peek_holds_off_nothing_whatever_earlier_sweeps_saw(world, monkeypatch):
    oid = order(world, "o1")
    world.deliver("agent-inventory")  # replied in time; the reply waits behind a backlog
    world.clock.advance(3)
    order(world, "o2")
    world.drop("agent-inventory")  # a later order whose agent died
    supervisor, _ = hosted(world)
    world.clock.advance(BUDGET - 3 + 1)
    assert supervisor.sweep() == {"held_for_reply": 1}  # o1: its reply seen waiting
    world.bus.take("replies")  # a host takes it...
    world.clock.advance(3)
    assert supervisor.sweep() == {"held_for_reply": 1}  # o2's look at the lane: it is gone

    def unreachable(queue: str) -> Any:
        raise ConnectionError("the queue service is unreachable")

    monkeypatch.setattr(world.bus, "oldest_waiting", unreachable)
    world.clock.advance(2)  # o1 looked at again, within reply_in_flight of that look
    assert supervisor.sweep() == {"retry": 1}  # no peek now: held as if nothing was seen
    assert world.state(oid).process_state is ProcessState.PENDING


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

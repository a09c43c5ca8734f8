"""Edges found in review: interleavings and failures around recovery, each pinned by a test, in
memory (the domain decides them; tests/integration/test_recovery_edges.py keeps the ones that
need the real table or the app's bootstrap)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sas.domain.messages import ScheduleRequest, StepRequest
from sas.domain.model import ProcessState
from sas.domain.wire import idempotency_key
from sas.services.context import ALERT_LEASE
from sas.services.operator import Operator
from sas.services.scheduler import ScheduleOutcome
from sas.testing import ok, refuse
from tests.harness import CLAIMED, World
from tests.unit.test_failure_modes import order
from tests.workflows import STRICT

pytestmark = [pytest.mark.unit, pytest.mark.fast]


@pytest.fixture
def world() -> World:
    return World()


class SweepDuringResubmit:
    """The world's store, running a Supervisor sweep between the operator's first index touch
    and its state write (everything else passes through)."""

    def __init__(self, inner: Any, world: World) -> None:
        self.inner = inner
        self.world = world
        self.armed = False

    def update_state(self, state, etag, history=None, *, step=None):
        if self.armed and history is not None and history.kind == "resubmitted":
            self.armed = False
            self.world.make_due(state.order_id)  # due by now, as a later sweep would find it
            assert self.world.supervisor.sweep()["unindexed"] == 1  # saw Error, dropped marker
        return self.inner.update_state(state, etag, history, step=step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_sweep_between_resubmit_steps_cannot_unindex_the_live_order(world):
    world.remote.script("payment", "charge", refuse("HTTP 402 declined"))
    oid = order(world, workflow=STRICT.name)
    world.run()
    assert world.state(oid).process_state is ProcessState.ERROR
    world.tick(1)  # alert settled; marker dropped
    racing = SweepDuringResubmit(world.store, world)
    world.operator = Operator(world.app.named("operator", store=racing).ctx)
    racing.armed = True
    world.operator.resubmit(oid, actor="alice")
    assert racing.armed is False  # the sweep did run in between
    assert [m.order_id for m in world.store.list_live()] == [oid]
    world.deliver("scheduler"), world.deliver("agent-inventory"), world.deliver("replies")
    world.drop("agent-payment")  # and then the agent dies: only the index can save it
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.PROCESSED


@pytest.fixture
def world_with_broken_status(world):
    original = world.bus.send

    def send(queue, message, **kwargs):
        if queue == "status-q":
            raise RuntimeError("QuotaExceeded: the submitter's queue is full")
        return original(queue, message, **kwargs)

    world.bus.send = send  # a bus whose status queue is full
    return world, order(world)


def test_a_broken_status_queue_never_holds_up_the_order(world_with_broken_status):
    world, oid = world_with_broken_status
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED


def test_an_early_schedule_request_keeps_the_wake_up_alive(world):
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")
    world.drop("agent-inventory")
    world.tick(CLAIMED + 1)
    (first,) = world.bus.pending("scheduler")
    assert world.bus.take_next() == first  # lose the supervisor's delayed request
    behind = world.new_scheduler("slow-clock")
    assert behind.schedule(ScheduleRequest(order_id=oid)) is ScheduleOutcome.NOT_YET
    (again,) = world.bus.pending("scheduler")
    assert again.due >= world.state(oid).not_before
    # A message of its own: with the first request's id, Service Bus duplicate detection
    # would drop it and the order would wait for its pickup deadline instead.
    assert again.message_id != first.message_id
    world.clock.advance(3)
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED


def test_an_alert_lost_in_a_crash_is_sent_by_the_next_sweep_once(world):
    world.remote.script("payment", "charge", refuse("HTTP 402 declined"))
    oid = order(world, workflow=STRICT.name)
    world.bus.fail_next_send_to.add("alerts")
    with pytest.raises(ConnectionError):
        world.run()  # Error written, then the process died before the alert went out
    assert world.state(oid).alert_pending is True
    assert world.alerts() == []
    world.tick(1)  # the dead sender's claim still holds
    assert world.alerts() == []
    world.tick(ALERT_LEASE.total_seconds())
    assert len(world.alerts()) == 1
    assert world.state(oid).alert_pending is False
    sent = [s for s in world.bus.sent if s.queue == "alerts"]
    assert sent[0].message_id.startswith(f"{oid}:alert:")


def test_an_index_marker_without_an_order_waits_out_its_grace_then_goes(world):
    world.store.touch_live("being-submitted", world.clock.now(), world.clock.now())  # no insert yet
    assert world.tick(60)["orphan_waiting"] == 1
    assert [m.order_id for m in world.store.list_live()] == ["being-submitted"]
    assert world.tick(300)["orphan_dropped"] == 1
    assert world.store.list_live() == []


def test_an_undo_request_carries_what_the_step_recorded(world):
    world.remote.script("payment", "charge", ok({"charge_id": "ch-7"}))
    world.remote.script("shipping", "ship", refuse("HTTP 422 refused"))
    oid = order(world)
    world.run()
    undos = [m for m in world.bus.to("agent-payment") if m.mode == "undo"]
    (refund,) = undos
    incarnation = world.state(oid).incarnation
    assert refund.action == "refund"
    assert refund.idempotency_key == idempotency_key(oid, incarnation, "charge", "undo")
    assert refund.payload["original_key"] == idempotency_key(oid, incarnation, "charge", "do")
    assert refund.payload["original_action"] == "charge"
    assert refund.payload["original_result"] == {"charge_id": "ch-7"}  # what the charge answered


def test_every_retry_asks_with_a_new_message_id(world):
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")
    for _ in range(2):
        world.drop("agent-inventory")
        world.tick(CLAIMED + 1)
        world.clock.advance(10)
        world.deliver("scheduler")
    ids = [s.message_id for s in world.bus.sent if s.queue == "scheduler"]
    assert len(ids) == 2 and len(set(ids)) == 2  # duplicate detection must not eat a retry
    requests = [s.message_id for s in world.bus.sent if s.queue == "agent-inventory"]
    assert len(requests) == 3 and len(set(requests)) == 3
    assert world.state(oid).failure_count == 2


def test_each_completed_step_is_recorded_with_the_attempt_that_completed_it(world):
    oid = order(world)
    world.run()
    steps = world.store.get_steps(oid)
    assert [(s.index, s.attempt) for s in steps] == [(0, 1), (1, 2), (2, 3)]
    assert all(isinstance(m, StepRequest) for m in world.bus.to("agent-inventory"))
    assert timedelta(0) <= steps[-1].completed_at - steps[0].completed_at

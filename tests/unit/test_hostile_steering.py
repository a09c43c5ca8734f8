"""Hostile review of operator steering (cancel, suspend, resume, terminate), in memory.

Each test states the guarantee it tries to break. Tests that fail show a problem."""

from __future__ import annotations

import pytest

from sas.domain.errors import IllegalTransition, InvalidMessage
from sas.domain.messages import StepReply, StepRequest
from sas.domain.model import ProcessState
from sas.services.scheduler import ReplyOutcome
from sas.testing import refuse
from tests.harness import BUDGET, World
from tests.unit.test_failure_modes import order
from tests.unit.test_steering import cancel, charging

pytestmark = [pytest.mark.unit, pytest.mark.fast]

RESERVE, CHARGE, SHIP = ("inventory", "reserve"), ("payment", "charge"), ("shipping", "ship")


@pytest.fixture
def world() -> World:
    return World()


def undone_once(world: World, oid: str) -> None:
    """Every applied (forward) effect of the order is undone, by exactly one undo effect."""
    forward = {
        k: e for k, e in world.remote.effects.items() if e.order_id == oid and e.undoes is None
    }
    undos = [e for e in world.remote.effects.values() if e.order_id == oid and e.undoes is not None]
    for key, effect in forward.items():
        assert effect.undone_by is not None, f"{effect.agent}/{effect.action} applied, never undone"
        assert sum(1 for u in undos if u.undoes == key) == 1, f"{key} undone more than once"


# --- 1. suspend hides an expiry: "as if never suspended" / "every effect undone" --------


def charge_applied_reply_lost_then_held(world: World) -> str:
    """charge's first attempt applied, its reply lost; the order is suspended and the expiry
    is held (uncounted)."""
    oid = charging(world)
    world.deliver("agent-payment")  # charge applied
    world.drop("replies")  # its ok lost
    world.operator.suspend(oid, actor="dana")
    world.tick(BUDGET + 3)
    assert "expired_held" in world.history(oid)
    assert world.state(oid).failure_count == 0
    return oid


def test_baseline_without_suspend_a_refused_retry_undoes_the_expired_attempts_effect(world):
    """The reference behaviour: the expiry is counted, so the refusal of the retry starts the
    compensation at charge itself, whose first attempt may have been applied."""
    oid = charging(world)
    world.deliver("agent-payment")
    world.drop("replies")
    world.tick(BUDGET + 3)  # counted expiry: retry
    world.remote.script("payment", "charge", refuse("HTTP 409 overlapping retry"))
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.COMPENSATED
    assert world.remote.applied(oid) == {RESERVE: True, CHARGE: True}


def test_suspend_resume_then_refused_retry_leaves_an_applied_charge_undone(world):
    """Claim 2: resume "reaches [its end] as if never suspended". Without the suspend the
    charge is refunded (test above); with it, the held expiry is not counted, refuse_step
    sees failure_count == 0 and starts the compensation *below* charge."""
    oid = charge_applied_reply_lost_then_held(world)
    world.operator.resume(oid, actor="dana")
    world.remote.script("payment", "charge", refuse("HTTP 409 overlapping retry"))
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.COMPENSATED
    assert world.remote.applied(oid) == {RESERVE: True, CHARGE: True}  # charge never refunded


def test_suspend_resume_cancel_then_refused_retry_ends_cancelled_with_charge_applied(world):
    """Claim 1: every applied effect of a Cancelled order is undone exactly once."""
    oid = charge_applied_reply_lost_then_held(world)
    world.operator.resume(oid, actor="dana")
    world.deliver("scheduler")  # attempt 2 claimed
    assert world.state(oid).process_state is ProcessState.PROCESSING
    cancel(world, oid)
    world.remote.script("payment", "charge", refuse("HTTP 409 overlapping retry"))
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    undone_once(world, oid)


# --- things that should hold ---------------------------------------------------------


def test_cancel_then_everything_delivered_twice_undoes_each_effect_once(world):
    oid = charging(world)
    cancel(world, oid)
    world.run(twice=True)
    for _ in range(5):
        world.tick(BUDGET * 3)
        world.run(twice=True)
    assert world.state(oid).process_state is ProcessState.CANCELLED
    undone_once(world, oid)
    assert SHIP not in world.remote.applied(oid)


# --- 2. a resubmit resets the count a cancelled refusal relies on ----------------------


def test_resubmitted_strict_error_cancelled_then_refused_leaves_an_applied_charge(world):
    """Claim 1 (every applied effect of a Cancelled order is undone; safe against a resubmit).
    strict: charge's attempts were applied but their replies lost, the order stops in Error
    after its expiries. A resubmit resets failure_count to 0; the operator then cancels while
    the retry runs; the retry is refused (overlapping call) and, because the cancel sends a
    strict refusal into compensation with failure_count == 0, the undo starts *below* charge."""
    w = World(max_failures=1)
    oid = charging(w, workflow="strict")
    w.deliver("agent-payment")  # applied
    w.drop("replies")
    w.tick(BUDGET + 3)  # one expiry: Error (strict), alert
    assert w.state(oid).process_state is ProcessState.ERROR
    w.tick(1)  # the alert settles
    w.operator.resubmit(oid, actor="eve")
    w.deliver("scheduler")
    assert w.state(oid).process_state is ProcessState.PROCESSING
    cancel(w, oid)
    w.remote.script("payment", "charge", refuse("HTTP 409 overlapping retry"))
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.CANCELLED
    undone_once(w, oid)


# --- deferrals ------------------------------------------------------------------------


def deferred_reply(world: World, oid: str) -> StepReply:
    (request,) = world.drop("agent-payment")
    assert isinstance(request, StepRequest)
    return StepReply(
        order_id=oid, step=request.step, step_index=request.step_index, attempt=request.attempt,
        mode=request.mode, outcome="deferred", incarnation=request.incarnation,
    )  # fmt: skip


def test_a_deferral_after_the_cancel_undoes_from_the_deferred_step(world):
    oid = charging(world)
    reply = deferred_reply(world, oid)
    cancel(world, oid)
    assert world.app.on_reply(reply) is ReplyOutcome.COMPENSATING
    assert world.app.on_reply(reply) is ReplyOutcome.STALE  # duplicate
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert world.remote.applied(oid) == {RESERVE: True}
    undone_once(world, oid)


def test_a_deferral_of_a_suspended_order_holds_it_until_resumed(world):
    oid = charging(world)
    reply = deferred_reply(world, oid)
    world.operator.suspend(oid, actor="dana")
    assert world.app.on_reply(reply) is ReplyOutcome.SUSPENDED
    for _ in range(4):
        world.tick(3600)
        world.run()
    assert world.state(oid).attempt == 2 and world.state(oid).failure_count == 0
    world.operator.resume(oid, actor="dana")
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED


def test_a_circuit_deferral_of_a_cancelled_order_deferred_enough_still_ends_cancelled(world):
    oid = charging(world)
    (request,) = world.drop("agent-payment")
    cancel(world, oid)
    from dataclasses import replace as _r

    from sas.domain.transitions import DEFERRAL

    st = world.store.get_state(oid)
    world.store.update_state(_r(st.value, deferrals=DEFERRAL.most + 5), st.etag, [])
    reply = StepReply(
        order_id=oid, step=request.step, step_index=request.step_index, attempt=request.attempt,
        mode="do", outcome="deferred", incarnation=request.incarnation, retry_after=5,
    )  # fmt: skip
    assert world.app.on_reply(reply) is ReplyOutcome.LEFT_TO_EXPIRE
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    undone_once(world, oid)


# --- refusals, races, audit -------------------------------------------------------------


def test_cancel_racing_a_refusal_that_starts_compensation_is_refused_without_audit(world):
    from sas.services.operator import Operator
    from tests.harness import ReadThenYield

    world.remote.script("payment", "charge", refuse("HTTP 402"))
    oid = charging(world)
    world.deliver("agent-payment")
    racing = ReadThenYield(world.store, lambda: world.deliver("replies"))
    mine = Operator(world.app.named("operator", store=racing).ctx)
    with pytest.raises(IllegalTransition, match="undone already"):
        mine.cancel(oid, actor="dana", reason="x")
    assert world.state(oid).cancelled is None
    assert world.operator.audit(10) == []
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.COMPENSATED


def test_cancel_of_an_error_order_stopped_in_its_undo_is_refused_and_audits_nothing(world):
    world.remote.script("payment", "charge", refuse("HTTP 402"))
    world.remote.script("inventory", "release", refuse("HTTP 500 for good"))
    oid = charging(world)
    world.settle_with_supervision()
    state = world.state(oid)
    assert state.process_state is ProcessState.ERROR and state.mode == "undo"
    before = world.state(oid)
    with pytest.raises(IllegalTransition):
        cancel(world, oid)
    with pytest.raises(IllegalTransition):
        world.operator.terminate(oid, actor="dana", reason="x")
    with pytest.raises(IllegalTransition):
        world.operator.suspend(oid, actor="dana")
    assert world.state(oid) == before and world.operator.audit(10) == []


def test_undo_expiring_past_max_failures_during_a_cancel_ends_error_with_one_alert_then_resubmit(
    world,
):
    oid = charging(world)
    cancel(world, oid)
    world.deliver("agent-payment"), world.deliver("replies")  # charge ok: undo charge queued
    world.deliver("scheduler")
    for _ in range(6):  # refund's agent dies every time
        world.drop("agent-payment")
        world.tick(BUDGET * 2)
        world.deliver("scheduler")
        world.tick(10)
        world.deliver("scheduler")
    state = world.state(oid)
    assert state.process_state is ProcessState.ERROR and state.mode == "undo"
    assert len(list(world.alerts())) == 1
    world.tick(1)
    world.operator.resubmit(oid, actor="eve")
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    undone_once(world, oid)


def test_terminate_during_compensation_dispatches_no_more_undo_and_drops_late_replies(world):
    world.remote.script("shipping", "ship", refuse("no"))
    oid = charging(world)
    world.deliver("agent-payment"), world.deliver("replies")
    world.deliver("agent-shipping"), world.deliver("replies")
    world.deliver("scheduler")  # refund claimed
    assert world.state(oid).process_state is ProcessState.COMPENSATING
    sent_before = len(world.bus.sent)
    world.operator.terminate(oid, actor="dana", reason="done by hand")
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.TERMINATED
    later = [s.message for s in world.bus.sent[sent_before:] if isinstance(s.message, StepRequest)]
    assert later == []
    assert "reply_dropped" in world.history(oid)
    assert world.remote.applied(oid) == {RESERVE: False, CHARGE: True}


def test_blank_reasons_change_nothing(world):
    oid = charging(world)
    before = world.state(oid)
    for reason in ("", "   ", "\n\t"):
        with pytest.raises(InvalidMessage):
            world.operator.terminate(oid, actor="dana", reason=reason)
        with pytest.raises(InvalidMessage):
            cancel(world, oid, reason=reason)
    assert world.state(oid) == before and world.operator.audit(10) == []


def test_terminate_of_finished_orders_is_refused(world):
    oid = charging(world)
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    for act in (
        lambda: world.operator.terminate(oid, actor="d", reason="x"),
        lambda: cancel(world, oid),
        lambda: world.operator.suspend(oid, actor="d"),
        lambda: world.operator.resume(oid, actor="d"),
    ):
        with pytest.raises(IllegalTransition):
            act()
    assert world.operator.audit(10) == []


def test_last_step_finishing_while_suspended_ends_processed(world):
    oid = charging(world)
    world.deliver("agent-payment"), world.deliver("replies")  # ship claimed
    world.operator.suspend(oid, actor="dana")
    world.drop("agent-shipping")
    world.tick(BUDGET + 3)  # held
    assert "expired_held" in world.history(oid)
    world.operator.resume(oid, actor="dana")
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert world.remote.applied(oid) == {RESERVE: False, CHARGE: False, SHIP: False}


def test_late_ok_of_the_last_step_while_held_finishes_and_resume_is_refused(world):
    oid = charging(world)
    world.deliver("agent-payment"), world.deliver("replies")  # ship claimed
    world.operator.suspend(oid, actor="dana")
    world.deliver("agent-shipping")  # applied, reply waits
    world.clock.advance(BUDGET + 3 + world.policy.queue_wait_limit.total_seconds())
    world.tick(0)  # held
    assert world.deliver("replies") == [ReplyOutcome.FINISHED]
    assert world.state(oid).process_state is ProcessState.PROCESSED
    with pytest.raises(IllegalTransition):
        world.operator.resume(oid, actor="dana")


def test_cancel_suspend_resume_suspend_cancel_interleaved_with_duplicates(world):
    oid = charging(world)
    world.operator.suspend(oid, actor="d")
    world.deliver("agent-payment", twice=True)
    world.deliver("replies", twice=True)  # charge ok: ship held
    cancel(world, oid)  # from charge down (ship never claimed)
    with pytest.raises(IllegalTransition):
        world.operator.resume(oid, actor="d")
    world.operator.suspend(oid, actor="d")
    world.run(twice=True)
    for _ in range(3):
        world.tick(3600)
        world.run(twice=True)
    assert world.state(oid).suspended and not world.state(oid).is_terminal
    world.operator.resume(oid, actor="d")
    world.run(twice=True)
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    undone_once(world, oid)
    assert SHIP not in world.remote.applied(oid)


# --- races between the operator and the Scheduler / Supervisor -------------------------


def pending_for_retry(world: World) -> str:
    oid = charging(world)
    world.drop("agent-payment")  # agent died before calling
    world.tick(BUDGET + 3)
    assert world.state(oid).process_state is ProcessState.PENDING
    world.clock.advance(5)  # backoff over
    return oid


@pytest.mark.parametrize("verb", ["cancel", "suspend", "terminate"])
def test_a_claim_racing_a_steer_never_dispatches_a_forward_step_after_it(world, verb):
    from tests.harness import ReadThenYield

    oid = pending_for_retry(world)
    steer = {
        "cancel": lambda: cancel(world, oid),
        "suspend": lambda: world.operator.suspend(oid, actor="d"),
        "terminate": lambda: world.operator.terminate(oid, actor="d", reason="x"),
    }[verb]
    racing = ReadThenYield(world.store, steer)
    scheduler = world.app.named("scheduler-2", store=racing)
    sent = len(world.bus.sent)
    for message in world.bus.take("scheduler"):
        scheduler.consume("scheduler", message)
    assert racing.meanwhile is not None
    forward = [s for s in world.bus.sent[sent:]
               if isinstance(s.message, StepRequest) and s.message.mode == "do"]  # fmt: skip
    assert forward == []


@pytest.mark.parametrize("verb", ["cancel", "suspend"])
def test_a_supervisor_expiry_racing_a_steer_counts_no_failure(world, verb):
    from tests.harness import ReadThenYield

    oid = charging(world)
    world.drop("agent-payment")
    steer = {
        "cancel": lambda: cancel(world, oid),
        "suspend": lambda: world.operator.suspend(oid, actor="d"),
    }[verb]
    racing = ReadThenYield(world.store, steer)
    supervisor = world.app.named("supervisor-2", store=racing)
    world.clock.advance(BUDGET + 3)
    supervisor.sweep()
    world.tick(0)
    state = world.state(oid)
    assert state.failure_count == 0
    if verb == "cancel":
        world.settle_with_supervision()
        assert world.state(oid).process_state is ProcessState.CANCELLED
        undone_once(world, oid)


def test_a_duplicate_submission_after_a_cancel_does_not_revive_or_advance(world):
    from tests.unit.test_services import submitted

    oid = order(world)
    world.deliver("orders")  # reserve claimed at once, request sent
    cancel(world, oid)
    world.submit(submitted(oid))  # the submission delivered again
    world.run(twice=True)
    world.settle_with_supervision()
    assert world.state(oid).process_state is ProcessState.CANCELLED
    assert world.remote.applied(oid) == {RESERVE: True}
    undone_once(world, oid)


def test_a_suspended_order_never_times_out_in_a_week_of_sweeps_in_every_position(world):
    """Suspend at each point of a run; a week of sweeps; nothing new; resume ends Processed."""
    for moves in range(0, 7):
        w = World()
        oid = order(w)
        seq = ["orders", "scheduler", "agent-inventory", "replies", "agent-payment", "replies",
               "agent-shipping"]  # fmt: skip
        for q in seq[:moves]:
            w.deliver(q)
        w.operator.suspend(oid, actor="d")
        before = w.state(oid)
        w.run()
        for _ in range(7 * 24):
            w.tick(3600)
            w.run()
        held = w.state(oid)
        if not held.is_terminal:
            assert held.failure_count == 0 and held.mode == "do", moves
            assert not any(k.startswith("expired_") and k != "expired_held" for k in w.history(oid))
            assert held.attempt == before.attempt, moves
            w.operator.resume(oid, actor="d")
        w.settle_with_supervision()
        assert w.state(oid).process_state is ProcessState.PROCESSED, moves
        assert w.remote.applied(oid) == {RESERVE: False, CHARGE: False, SHIP: False}


@pytest.mark.parametrize(
    "first,second,error",
    [
        ("cancel", "cancel", "being cancelled already"),
        ("suspend", "suspend", "suspended already"),
        ("terminate", "cancel", "Terminated"),
        ("terminate", "suspend", "Terminated"),
        ("cancel", "terminate", None),
    ],
)
def test_two_operators_at_once_one_wins_the_other_is_refused_unaudited(world, first, second, error):
    from sas.services.operator import Operator
    from tests.harness import ReadThenYield

    oid = charging(world)

    def act(op, verb):
        if verb == "cancel":
            return op.cancel(oid, actor="a", reason="x")
        if verb == "suspend":
            return op.suspend(oid, actor="a")
        return op.terminate(oid, actor="a", reason="x")

    racing = ReadThenYield(world.store, lambda: act(world.operator, first))
    mine = Operator(world.app.named("operator-2", store=racing).ctx)
    if error is None:
        act(mine, second)
        assert len(world.operator.audit(10)) == 2
    else:
        with pytest.raises(IllegalTransition, match=error):
            act(mine, second)
        assert [e.action for e in world.operator.audit(10)] == [first]

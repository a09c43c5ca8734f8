"""The Scheduler: claims orders and applies the agents' replies.

Each handler reads the order's state, asks the domain for the transition, writes it (with its
history row, in one transaction) conditional on the ETag it read, and then sends what follows
(sas/services/consequences.py). Losing the write's race is a normal outcome, never an error:
somebody else moved the order on.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from enum import StrEnum

from sas.domain.errors import ConcurrencyConflict, DefinitionMissing, IllegalTransition
from sas.domain.messages import ScheduleRequest, StatusKind, StepReply, encode
from sas.domain.model import HistoryEntry, OrderState, StepRecord, Versioned
from sas.domain.transitions import (
    DEFERRAL,
    Fence,
    NotYet,
    ReplyDecision,
    Then,
    claim,
    decide_reply,
    fence,
    to_error,
)
from sas.domain.wire import idempotency_key, schedule_message_id, step_reply_message_id
from sas.domain.workflow import Workflow
from sas.services import alerts, telemetry, versions
from sas.services import consequences as then
from sas.services.context import Context

log = logging.getLogger(__name__)

REPLY_TRIES = 4
"""Reads and writes of one reply before the host is left to deliver it again: each lost race
means somebody else moved the order on, and the reply is decided again on what they wrote."""


class ScheduleOutcome(StrEnum):
    CLAIMED = "claimed"
    LOST_RACE = "lost_race"
    NOT_PENDING = "not_pending"
    NOT_YET = "not_yet"
    UNKNOWN_ORDER = "unknown_order"
    HELD = "held"
    """The order's workflow version is not deployed here: left for a host that has it."""
    FAILED = "failed"
    """The step's data did not build (the app's input builder raised): Error, alert owed."""


class ReplyOutcome(StrEnum):
    ADVANCED = "advanced"
    FINISHED = "finished"
    COMPENSATING = "compensating"
    DEFERRED = "deferred"
    STALE = "stale"
    LEFT_TO_EXPIRE = "left_to_expire"
    """A deferral past the limit: the attempt runs to its deadline, and its expiry counts."""
    SKIPPED = "skipped"
    """A step that may be skipped failed for good: the next one is asked of a Scheduler."""
    UNKNOWN_ORDER = "unknown_order"
    HELD = "held"
    SUSPENDED = "suspended"
    """The order is suspended: the step is recorded, and what follows waits for the resume."""


# --- a schedule request: claim a Pending order ------------------------------------------


def schedule(ctx: Context, request: ScheduleRequest) -> ScheduleOutcome:
    current = ctx.store.get_state(request.order_id)
    # A request that carries no context (a retry's, or sent by hand) continues the order's
    # stored trace.
    parent = None if current is None else current.value.traceparent
    with telemetry.order_span(telemetry.SCHEDULE, request.order_id, parent=parent) as span:
        outcome = _schedule(ctx, request, current)
        telemetry.annotate(span, outcome=outcome.value)
        return outcome


def _schedule(
    ctx: Context, request: ScheduleRequest, current: Versioned[OrderState] | None
) -> ScheduleOutcome:
    extra: dict[str, object] = {"order_id": request.order_id}
    if current is None:
        _park(ctx, ctx.routes.scheduler, "schedule request for an unknown order", request)
        log.warning("sas.schedule_unknown_order", extra=extra)
        return ScheduleOutcome.UNKNOWN_ORDER
    state, now = current.value, ctx.clock.now()
    try:
        workflow = ctx.definition(state)
    except DefinitionMissing as missing:
        if not state.is_terminal:
            queue = ctx.routes.lane(ctx.routes.scheduler, state.priority)
            message_id = schedule_message_id(state.order_id, state.updated_at)
            versions.hold(ctx, queue, request, message_id, missing.reason)
        return ScheduleOutcome.HELD
    try:
        claimed = claim(state, instance_id=ctx.instance_id, now=now, workflow=workflow)
    except NotYet:
        # Early: a duplicate, or this instance's clock behind the Supervisor's. Ask again when
        # the backoff ends rather than consume the only wake-up there is.
        log.info("sas.schedule_backing_off", extra=extra)
        wait = (state.not_before - now).total_seconds() if state.not_before else 0.0
        then.request_schedule(ctx, state, delay_seconds=wait + 0.5, again_at=now)
        return ScheduleOutcome.NOT_YET
    except IllegalTransition:
        log.info("sas.schedule_not_pending", extra=extra)
        return ScheduleOutcome.NOT_PENDING
    return _take(ctx, current, claimed, workflow)


def _take(
    ctx: Context, current: Versioned[OrderState], claimed: OrderState, workflow: Workflow
) -> ScheduleOutcome:
    """Write the claim (or, if the step's data does not build, the Error), then send."""
    state, extra = current.value, {"order_id": current.value.order_id}
    claimed = then.with_queue_allowance(ctx, claimed, workflow)
    problem = then.input_problem(claimed, workflow)
    if problem is not None:
        claimed = _unbuildable(ctx, claimed, problem)
    history = [
        then.claim_history(claimed, workflow, ctx.instance_id)
        if problem is None
        else _input_failed(ctx, claimed, workflow, problem)
    ]
    if state.waiting is not None:  # held while the definition was missing
        history.insert(0, versions.resumed(ctx, state))
    try:
        etag = ctx.store.update_state(claimed, current.etag, history)
    except ConcurrencyConflict:
        log.info("sas.claim_lost", extra=extra)
        return ScheduleOutcome.LOST_RACE
    if state.waiting is not None:
        versions.forget(ctx, state)
    if problem is not None:
        then.finished(ctx, claimed, etag)
        return ScheduleOutcome.FAILED
    log.info("sas.step_claimed", extra={**extra, **_step_extra(claimed, workflow)})
    then.dispatch(ctx, claimed, workflow)
    then.announce(ctx, claimed, workflow)
    return ScheduleOutcome.CLAIMED


# --- a reply: the reply rule, then the next step ----------------------------------------


def on_reply(ctx: Context, reply: StepReply) -> ReplyOutcome:
    with telemetry.order_span(
        telemetry.REPLY,
        reply.order_id,
        step=reply.step,
        attempt=reply.attempt,
        mode=reply.mode,
        endpoint=reply.endpoint,
    ) as span:
        outcome = _on_reply(ctx, reply)
        telemetry.annotate(span, outcome=outcome.value, reply=reply.outcome)
        return outcome


def _on_reply(ctx: Context, reply: StepReply) -> ReplyOutcome:
    for tries_left in reversed(range(REPLY_TRIES)):
        current = ctx.store.get_state(reply.order_id)
        if current is None:
            _park(ctx, ctx.routes.replies, "reply for an unknown order", reply)
            log.warning("sas.reply_unknown_order", extra={"order_id": reply.order_id})
            return ReplyOutcome.UNKNOWN_ORDER
        try:
            return _apply(ctx, reply, current)
        except ConcurrencyConflict:
            if not tries_left:
                raise  # the host delivers the reply again later
            log.info("sas.reply_conflict_retry", extra={"order_id": reply.order_id})
    raise AssertionError("unreachable")  # pragma: no cover


def _apply(ctx: Context, reply: StepReply, current: Versioned[OrderState]) -> ReplyOutcome:
    state = current.value
    incarnation = reply.incarnation or ""
    try:
        workflow = ctx.definition(state)
    except DefinitionMissing as missing:
        return _without_definition(ctx, reply, state, missing)
    verdict = fence(
        state,
        workflow,
        step_index=reply.step_index,
        step=reply.step,
        attempt=reply.attempt,
        mode=reply.mode,
        outcome=reply.outcome,
        incarnation=incarnation,
    )
    if not verdict.applies:
        return _drop(ctx, reply, state, verdict)
    if reply.retry_after is not None and not DEFERRAL.allows(state.deferrals):
        return _deferred_enough(ctx, reply, state)  # an open circuit's, past the bound
    now = ctx.clock.now()
    decision = decide_reply(state, reply, instance_id=ctx.instance_id, now=now, workflow=workflow)
    new = decision.state
    problem = then.input_problem(new, workflow) if decision.then is Then.DISPATCH else None
    if problem is not None:  # the next step's data does not build: Error instead of its claim
        new = _unbuildable(ctx, new, problem)
    elif new.alert_pending:  # Error: the claim on its alert goes in the same write
        new = alerts.claiming_alert(ctx, new)
    new = then.with_queue_allowance(ctx, new, workflow)
    decision = replace(decision, state=new, then=Then.FINISH if problem else decision.then)
    entries = [_reply_history(ctx, reply, state, verdict, decision)]
    if state.waiting is not None:  # the reply was held while the definition was missing
        entries.insert(0, versions.resumed(ctx, state))
    if decision.then is Then.DISPATCH:  # the next step claimed in the same write
        entries.append(then.claim_history(new, workflow, ctx.instance_id))
    elif problem is not None:
        entries.append(_input_failed(ctx, new, workflow, problem))
    etag = ctx.store.update_state(new, current.etag, entries, step=_step_record(reply, now))
    if state.waiting is not None:
        versions.forget(ctx, state)
    log.info(
        "sas.step_%s", decision.history_kind,
        extra={"order_id": reply.order_id, "step": reply.step, "attempt": reply.attempt},
    )  # fmt: skip
    return _follow(ctx, reply, state, decision, etag, workflow)


def _unbuildable(ctx: Context, claimed: OrderState, problem: str) -> OrderState:
    """The claimed step's data does not build: Error at that attempt, its alert claimed in
    the same write (nothing is sent to the agent)."""
    return alerts.claiming_alert(ctx, to_error(claimed, now=claimed.updated_at, reason=problem))


def _input_failed(
    ctx: Context, failed: OrderState, workflow: Workflow, problem: str
) -> HistoryEntry:
    return then.step_history(failed, workflow, "input_failed", ctx.instance_id, detail=problem)


def _reply_history(
    ctx: Context, reply: StepReply, state: OrderState, verdict: Fence, decision: ReplyDecision
) -> HistoryEntry:
    earlier = f"applied at attempt {state.attempt} ({state.process_state})"
    return HistoryEntry(
        order_id=reply.order_id,
        at=decision.state.updated_at,
        kind=decision.history_kind,
        attempt=reply.attempt,
        step=reply.step,
        mode=reply.mode,
        actor=ctx.instance_id,
        detail=reply.error or (earlier if verdict is Fence.EARLIER_ATTEMPT else None),
        endpoint=reply.endpoint,
    )


def _step_record(reply: StepReply, now: datetime) -> StepRecord | None:
    """What the undo will need, kept in the transaction that makes the step count as done:
    never one without the other."""
    if reply.outcome != "ok" or reply.mode != "do":
        return None
    return StepRecord(
        order_id=reply.order_id,
        index=reply.step_index,
        name=reply.step,
        attempt=reply.attempt,
        completed_at=now,
        result=reply.result,
    )


def _follow(
    ctx: Context,
    reply: StepReply,
    before: OrderState,
    decision: ReplyDecision,
    etag: str,
    workflow: Workflow,
) -> ReplyOutcome:
    """The work that follows first (a step's deadline is already running), then the status
    events."""
    state = decision.state
    _send_work(ctx, reply, decision, workflow)
    if reply.outcome == "ok":
        progress: StatusKind = "step_undone" if reply.mode == "undo" else "step_completed"
        then.notify(ctx, before, progress, state.updated_at, step=reply.step)
    if decision.skipped:  # whether the order goes on, is held or ended Processed
        log.warning("sas.step_skipped", extra={"order_id": state.order_id, "step": reply.step})
        then.notify(ctx, state, "step_skipped", state.updated_at, step=reply.step)
    if decision.then is Then.DISPATCH:
        then.announce(ctx, state, workflow)
        return ReplyOutcome.ADVANCED
    if decision.then is Then.DEFER:
        return ReplyOutcome.DEFERRED
    if decision.then is Then.COMPENSATE:
        then.notify(ctx, state, "compensating", state.updated_at, detail=state.last_error)
        return ReplyOutcome.COMPENSATING
    if decision.then is Then.SCHEDULE:
        return ReplyOutcome.SKIPPED
    if decision.then is Then.HOLD:
        log.info("sas.order_held", extra={"order_id": state.order_id, "step": state.step})
        return ReplyOutcome.SUSPENDED
    then.finished(ctx, state, etag)
    return ReplyOutcome.FINISHED


def _send_work(ctx: Context, reply: StepReply, decision: ReplyDecision, workflow: Workflow) -> None:
    state = decision.state
    if decision.then is Then.DISPATCH:
        then.dispatch(ctx, state, workflow)
    elif decision.then is Then.DEFER:
        wait = ((state.not_before or state.updated_at) - state.updated_at).total_seconds()
        log.info("sas.step_deferred", extra={"order_id": state.order_id, "delay": wait})
        then.request_schedule(ctx, state, delay_seconds=wait)
    elif decision.then is Then.SCHEDULE:
        then.request_schedule(ctx, state)
    elif decision.then is Then.COMPENSATE:
        log.warning("sas.compensation_started", extra={"order_id": state.order_id})
        then.compensate(ctx, state, reason="refused" if state.cancelled is None else "cancelled")


def _drop(ctx: Context, reply: StepReply, state: OrderState, verdict: Fence) -> ReplyOutcome:
    """Fencing in action: recorded (for the ledger of what happened), never applied."""
    log.warning(
        "sas.reply_stale",
        extra={
            "order_id": reply.order_id,
            "step": reply.step,
            "attempt": reply.attempt,
            "mode": reply.mode,
            "fence": verdict.value,
            "current_attempt": state.attempt,
            "state": state.process_state,
        },
    )
    detail = (
        f"{reply.outcome} {verdict.value}: current attempt {state.attempt}, {state.process_state}"
    )
    _record_dropped(ctx, reply, detail)
    return ReplyOutcome.STALE


def _record_dropped(ctx: Context, reply: StepReply, detail: str) -> None:
    """A reply that moves nothing, kept in the order's history (``reply_dropped``: history
    replay skips it)."""
    ctx.store.add_history(
        HistoryEntry(
            order_id=reply.order_id,
            at=ctx.clock.now(),
            kind="reply_dropped",
            attempt=reply.attempt,
            step=reply.step,
            mode=reply.mode,
            actor=ctx.instance_id,
            detail=detail,
        )
    )


def _without_definition(
    ctx: Context, reply: StepReply, state: OrderState, missing: DefinitionMissing
) -> ReplyOutcome:
    """A reply for an order whose workflow version this host lacks: dropped if it cannot
    apply whatever the version, else held for a host that has it."""
    incarnation = reply.incarnation or ""
    if incarnation != state.incarnation:
        return _drop(ctx, reply, state, Fence.OTHER_INCARNATION)
    if state.is_terminal:
        return _drop(ctx, reply, state, Fence.NOT_RUNNING)
    key = idempotency_key(reply.order_id, incarnation, reply.step, reply.mode)
    message_id = step_reply_message_id(key, reply.attempt)
    queue = ctx.routes.lane(ctx.routes.replies, state.priority)
    # Mid-deploy, back while the step's deadline runs; otherwise ever more rarely.
    left = (state.complete_by or state.updated_at) - ctx.clock.now()
    within = left if missing.newer and left > timedelta(0) else None
    versions.hold(ctx, queue, reply, message_id, missing.reason, within=within)
    return ReplyOutcome.HELD


def _deferred_enough(ctx: Context, reply: StepReply, state: OrderState) -> ReplyOutcome:
    """A circuit's deferral of a step already deferred ``DEFERRAL.most`` times: its attempt is
    left to its deadline, so a remote that stays down fails the order in the end (the
    Supervisor counts the expiry, as any). Deferrals for want of room are not bounded: the
    endpoints' calls in flight free it."""
    log.warning(
        "sas.deferral_limit_reached",
        extra={
            "order_id": reply.order_id,
            "step": reply.step,
            "attempt": reply.attempt,
            "deferrals": state.deferrals,
        },
    )
    detail = f"deferred: {state.deferrals} times for this step already, left to expire"
    _record_dropped(ctx, reply, detail)  # it moves nothing: the attempt's expiry will
    return ReplyOutcome.LEFT_TO_EXPIRE


def _park(ctx: Context, queue: str, reason: str, message: ScheduleRequest | StepReply) -> None:
    """Unroutable (its order does not exist): kept where an operator can see it."""
    ctx.store.park_message(queue, reason, encode(message), ctx.clock.now())


def _step_extra(state: OrderState, workflow: Workflow) -> dict[str, object]:
    return {
        "step": workflow.step(state.step_index).name,
        "attempt": state.attempt,
        "mode": state.mode,
        "complete_by": state.complete_by.isoformat() if state.complete_by else None,
    }

"""What a persisted transition sends: the step request of a claimed attempt, a schedule request,
status events to the submitter, the operator alert an Error owes (``alerts.py``).

Shared by every handler, so a transition has the same consequences whoever made it. The work
goes first and the status events after it: a slow status queue never spends a step's budget.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sas.domain.errors import DefinitionMissing, IllegalTransition, NotFound
from sas.domain.messages import (
    ScheduleRequest,
    StatusEvent,
    StatusKind,
    StepRequest,
    wants_status,
)
from sas.domain.model import HistoryEntry, OrderState, ProcessState
from sas.domain.wire import (
    StatusLevel,
    idempotency_key,
    schedule_message_id,
    schedule_wakeup_message_id,
    status_message_id,
    step_request_message_id,
)
from sas.domain.workflow import Workflow
from sas.services import alerts, metrics, telemetry
from sas.services.context import Context

log = logging.getLogger(__name__)

FINISHED_WELL = (
    ProcessState.PROCESSED,
    ProcessState.COMPENSATED,
    ProcessState.CANCELLED,
    ProcessState.TERMINATED,
)
"""Ends no operator action revives (a resubmit takes an Error only)."""

QUEUE_ALLOWANCE_BUDGETS = 4
"""The most a claimed step's deadline is lengthened for its queue's backlog, in step budgets."""


# --- a claimed step ---------------------------------------------------------------------


def with_queue_allowance(ctx: Context, state: OrderState, workflow: Workflow) -> OrderState:
    """A just-claimed step's deadline lengthened by the waits its request can expect in its
    agent's lane and its reply in the replies lane (``Backlog.expected_wait``), together up to
    QUEUE_ALLOWANCE_BUDGETS budgets: under a backlog a deadline that ran from the claim alone
    would expire steps nobody had started, or that were done, and each retry adds to the
    backlog. Without a backlog (or a state that runs no step) it adds nothing."""
    if ctx.backlog is None or not state.is_running or state.complete_by is None:
        return state
    step = workflow.step(state.step_index)
    request_lane = ctx.routes.agent(step.agent, state.priority)
    reply_lane = ctx.routes.lane(ctx.routes.replies, state.priority)
    wait = ctx.backlog.expected_wait((request_lane,)) + ctx.backlog.expected_wait((reply_lane,))
    if wait <= timedelta(0):
        return state
    allowance = min(wait, step.budget * QUEUE_ALLOWANCE_BUDGETS)
    return replace(state, complete_by=state.complete_by + allowance)


def step_history(
    state: OrderState, workflow: Workflow, kind: str, actor: str, detail: str | None = None
) -> HistoryEntry:
    """A history row of ``kind`` for the state's current step and attempt, at its time."""
    return HistoryEntry(
        order_id=state.order_id,
        at=state.updated_at,
        kind=kind,
        attempt=state.attempt,
        step=workflow.step(state.step_index).name,
        mode=state.mode,
        actor=actor,
        detail=detail,
    )


def claim_history(state: OrderState, workflow: Workflow, actor: str) -> HistoryEntry:
    return step_history(state, workflow, "claimed", actor)


def dispatch(ctx: Context, state: OrderState, workflow: Workflow) -> None:
    """Send the step request of the state's current attempt (already persisted). An undo
    reads the completed step's record: what the undo needs."""
    step = workflow.step(state.step_index)
    if not state.is_running or state.complete_by is None:
        raise IllegalTransition(f"order {state.order_id} runs no step to dispatch")
    payload = _step_data(state, workflow)
    if payload is None:
        return  # nothing sent: the step expires and is retried (``input_problem`` checked it)
    key = idempotency_key(state.order_id, state.incarnation, step.name, state.mode)
    action = step.action
    if state.mode == "undo":
        if step.undo is None:
            raise IllegalTransition(f"step {step.name} has no undo action")
        done = {s.name: s for s in ctx.store.get_steps(state.order_id)}.get(step.name)
        payload |= {
            "original_action": step.action,
            "original_key": idempotency_key(state.order_id, state.incarnation, step.name, "do"),
            "original_result": done.result if done else None,
        }
        action = step.undo
    request = StepRequest(
        order_id=state.order_id,
        step=step.name,
        step_index=state.step_index,
        attempt=state.attempt,
        mode=state.mode,
        action=action,
        complete_by=state.complete_by,
        idempotency_key=key,
        payload=payload,
        priority=state.priority,
        incarnation=state.incarnation or None,
        workflow=state.workflow,
        version=state.version,
        budget=step.budget.total_seconds(),
    )
    ctx.transport.send(
        ctx.routes.agent(step.agent, state.priority),
        request,
        message_id=step_request_message_id(key, state.attempt),
        correlation_id=state.order_id,
    )


def _step_data(state: OrderState, workflow: Workflow) -> dict[str, Any] | None:
    """The current step's data, as its ``input`` builds it; None (logged) if the app's builder
    fails or builds something that is not a JSON object."""
    try:
        return workflow.step_data(
            state.step_index, state.order_id, state.details, state.results, state.mode
        )
    except Exception as exc:  # the app's own code: a bug, or results it did not expect
        log.exception(
            "sas.step_input_failed error=%s",
            type(exc).__name__,
            extra={"order_id": state.order_id, "step": workflow.step(state.step_index).name},
        )
        return None


def input_problem(state: OrderState, workflow: Workflow) -> str | None:
    """Why a just-claimed forward step's data does not build, naming the step and the
    exception type (never its message, which may carry the order's data); None if it builds.
    A builder is a pure function of the details and results: a retry fails the same way, so
    the order stops in Error for the app's owner instead of expiring into retries."""
    if not state.is_running or state.mode != "do" or workflow.step(state.step_index).input is None:
        return None
    try:
        workflow.step_data(
            state.step_index, state.order_id, state.details, state.results, state.mode
        )
    except Exception as exc:  # the app's own code: a bug, or results it did not expect
        step = workflow.step(state.step_index).name
        log.exception(
            "sas.step_input_failed error=%s",
            type(exc).__name__,
            extra={"order_id": state.order_id, "step": step},
        )
        return f"{step}: its input builder raised {type(exc).__name__} (a bug in the app)"
    return None


def announce(ctx: Context, state: OrderState, workflow: Workflow) -> None:
    """A forward step's start, to a submitter that asked for every step."""
    if state.mode == "do":
        step = workflow.step(state.step_index).name
        notify(ctx, state, "step_started", ctx.clock.now(), step=step)


# --- asking a Scheduler ----------------------------------------------------------------


def request_schedule(
    ctx: Context, state: OrderState, delay_seconds: float = 0, *, again_at: datetime | None = None
) -> None:
    """Ask a Scheduler to claim ``state``; ``again_at``: a re-ask for the same version."""
    message_id = (
        schedule_message_id(state.order_id, state.updated_at)
        if again_at is None
        else schedule_wakeup_message_id(state.order_id, state.updated_at, again_at)
    )
    with telemetry.resumed(state.traceparent):
        ctx.transport.send(
            ctx.routes.lane(ctx.routes.scheduler, state.priority),
            ScheduleRequest(order_id=state.order_id),
            message_id=message_id,
            correlation_id=state.order_id,
            delay_seconds=max(delay_seconds, 0.0),
        )


def compensate(ctx: Context, state: OrderState, *, reason: str) -> None:
    """Ask a Scheduler to start undoing ``state`` (queued as Pending, undo): ``reason`` is
    ``refused`` (a step failed for good) or ``expired`` (it ran out of attempts)."""
    metrics.instruments.compensations.add(1, {"sas.reason": reason})
    with telemetry.order_span(
        telemetry.COMPENSATE, state.order_id, attempt=state.attempt, mode=state.mode
    ) as span:
        telemetry.annotate(span, reason=reason)
        request_schedule(ctx, state)


def finished(ctx: Context, state: OrderState, etag: str) -> None:
    """Status for a terminal state; for Error, the one operator alert it is owed."""
    now = state.updated_at
    metrics.instruments.orders_finished.add(1, {telemetry.OUTCOME: state.process_state.value})
    log.info("sas.order_finished", extra={"order_id": state.order_id, "state": state.process_state})
    _unindex(ctx, state)
    if state.process_state is ProcessState.PROCESSED:
        notify(ctx, state, "completed", now)
    elif state.process_state is ProcessState.COMPENSATED:
        notify(ctx, state, "compensated", now, detail=state.last_error)
    elif state.process_state is ProcessState.CANCELLED:
        notify(ctx, state, "cancelled", now, detail=state.cancelled)
    elif state.process_state is ProcessState.TERMINATED:
        notify(ctx, state, "terminated", now, detail=state.last_error)
    elif state.process_state is ProcessState.ERROR:
        alerts.settle_alert(ctx, state, etag, wrote_claim=True)
        notify(ctx, state, "failed", now, detail=state.last_error)


def flags_its_marker(ctx: Context, state: OrderState) -> bool:
    """Whether the order finished well and its marker is flagged so (``StateStore.finish_live``):
    under a ``max_in_flight``, whose count must not wait a step budget for the due sweep to
    free the place while submissions wait for it. A workflow with no limit is not counted and
    leaves its marker to that sweep (a request fewer on the in-flight partition)."""
    if state.process_state not in FINISHED_WELL:
        return False
    try:
        return ctx.definition(state).max_in_flight is not None
    except DefinitionMissing:
        return False


def _unindex(ctx: Context, state: OrderState) -> None:
    """Best effort: a marker left as it was is dropped by its due sweep."""
    if not flags_its_marker(ctx, state):
        return
    try:
        ctx.store.finish_live(state.order_id, state.updated_at)
    except Exception:
        log.warning("sas.marker_finish_failed", extra={"order_id": state.order_id}, exc_info=True)


# --- status events to the submitter ------------------------------------------------------


def notify(
    ctx: Context,
    state: OrderState,
    status: StatusKind,
    at: datetime,
    *,
    step: str | None = None,
    detail: str | None = None,
) -> None:
    """``status`` to the order's submitter, if it asked for that kind of event."""
    send_status(ctx, state.reply_to, state.order_id, status, at, state.status_events, step, detail)


def send_status(
    ctx: Context,
    reply_to: str | None,
    order_id: str,
    status: StatusKind,
    at: datetime,
    level: StatusLevel,
    step: str | None = None,
    detail: str | None = None,
) -> None:
    """Best effort: a missing or broken reply-to queue belongs to the submitter and never fails
    or stalls the order itself."""
    if reply_to is None or not wants_status(level, status):
        return
    event = StatusEvent(order_id=order_id, status=status, at=at, step=step, detail=detail)
    extra = {"order_id": order_id, "queue": reply_to, "status": status}
    try:
        ctx.transport.send(
            reply_to,
            event,
            message_id=status_message_id(order_id, status, step, at),
            correlation_id=order_id,
        )
    except NotFound:
        log.warning("sas.status_queue_missing", extra=extra)
    except Exception:  # the submitter's queue is full, disabled or flaky: not our order's fault
        log.warning("sas.status_send_failed", exc_info=True, extra=extra)

"""An operator steers a live order: cancel (undo what it did, end Cancelled), suspend and
resume, terminate (end it where it stands). Each is read, decided (``sas.domain.steering``),
written on the ETag it read with a history row, audited, then followed by what the new state
needs: a Scheduler asked to claim, or the finished order's status."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sas.domain import steering
from sas.domain.errors import (
    ConcurrencyConflict,
    DefinitionMissing,
    IllegalTransition,
    InvalidMessage,
    NotFound,
)
from sas.domain.model import AuditAction, AuditEntry, HistoryEntry, OrderState, ProcessState
from sas.domain.transitions import look_again_at
from sas.domain.workflow import Workflow
from sas.services import audit
from sas.services import consequences as then
from sas.services.context import Context

log = logging.getLogger(__name__)

TRIES = 3
"""A running order changes under the operator (a reply, a claim): read and decide again."""

Decide = Callable[[OrderState, Workflow, datetime], OrderState]


@dataclass(frozen=True)
class Steered:
    before: OrderState
    after: OrderState
    etag: str


def cancel(ctx: Context, order_id: str, *, actor: str, reason: str) -> OrderState:
    """No step goes forward; what was done is undone in reverse; the order ends Cancelled."""
    why = f"cancelled by {actor[: audit.MAX_ACTOR]}: {_reason(reason, 'cancelling')}"
    done = _steer(
        ctx,
        order_id,
        lambda state, workflow, now: steering.cancel(state, now=now, workflow=workflow, why=why),
        kind="cancelled",
        action="cancel",
        actor=actor,
        reason=reason,
    )
    new = done.after
    if new.is_terminal:  # nothing to undo
        then.finished(ctx, new, done.etag)
    elif new.process_state is ProcessState.PENDING:
        then.compensate(ctx, new, reason="cancelled")
        then.notify(ctx, new, "compensating", new.updated_at, detail=why)
    return new


def suspend(ctx: Context, order_id: str, *, actor: str, reason: str | None = None) -> OrderState:
    """Dispatch nothing new and expire nothing until resumed; a running step may finish."""
    new = _hold(ctx, order_id, steering.suspend, "suspended", "suspend", actor, reason)
    then.notify(ctx, new, "suspended", new.updated_at, detail=reason)
    return new


def resume(ctx: Context, order_id: str, *, actor: str, reason: str | None = None) -> OrderState:
    """Carry on from where the order stood."""
    new = _hold(ctx, order_id, steering.resume, "unsuspended", "resume", actor, reason)
    if new.process_state is ProcessState.PENDING:
        then.request_schedule(ctx, new)
    then.notify(ctx, new, "resumed", new.updated_at, detail=reason)
    return new


def terminate(ctx: Context, order_id: str, *, actor: str, reason: str) -> OrderState:
    """End the order now, undoing nothing: what its steps did stays done."""
    why = f"terminated by {actor[: audit.MAX_ACTOR]}: {_reason(reason, 'terminating')}"
    done = _steer(
        ctx,
        order_id,
        lambda state, _workflow, now: steering.terminate(state, now=now, why=why),
        kind="terminated",
        action="terminate",
        actor=actor,
        reason=reason,
    )
    then.finished(ctx, done.after, done.etag)
    return done.after


def _hold(
    ctx: Context,
    order_id: str,
    change: Callable[..., OrderState],
    kind: str,
    action: AuditAction,
    actor: str,
    reason: str | None,
) -> OrderState:
    """Suspend or resume: ``change(state, now=, workflow=)``, no reason required."""

    def decide(state: OrderState, workflow: Workflow, now: datetime) -> OrderState:
        return change(state, now=now, workflow=workflow)

    steered = _steer(ctx, order_id, decide, kind=kind, action=action, actor=actor, reason=reason)
    return steered.after


def _steer(
    ctx: Context,
    order_id: str,
    decide: Decide,
    *,
    kind: str,
    action: AuditAction,
    actor: str,
    reason: str | None,
) -> Steered:
    for tries_left in reversed(range(TRIES)):
        current = ctx.store.get_state(order_id)
        if current is None:
            raise NotFound(f"order {order_id} not found")
        state, now = current.value, ctx.clock.now()
        try:
            workflow = ctx.definition(state)
        except DefinitionMissing as missing:
            raise IllegalTransition(f"order {order_id}: {missing.reason}") from None
        new = decide(state, workflow, now)
        revived = state.is_terminal and not new.is_terminal  # an Error order being undone
        if revived:  # indexed before it is live again, as a resubmit is
            due = look_again_at(new, now=now, workflow=workflow)
            ctx.store.touch_live(order_id, now, due, workflow.name)
        entry = HistoryEntry(
            order_id=order_id,
            at=now,
            kind=kind,
            attempt=new.attempt,
            step=workflow.step(new.step_index).name,
            mode=new.mode,
            actor=actor[: audit.MAX_ACTOR],
            detail=None if reason is None else reason.strip()[: steering.MAX_REASON] or None,
        )
        try:
            etag = ctx.store.update_state(new, current.etag, entry)
        except ConcurrencyConflict:
            if not tries_left:
                raise
            continue
        if revived:
            ctx.store.touch_live(order_id, now, due, workflow.name)
        audit.record(ctx.store, AuditEntry(now, actor, action, order_id, entry.detail))
        log.warning(
            "sas.order_%s", kind, extra={"order_id": order_id, "actor": actor[: audit.MAX_ACTOR]}
        )
        return Steered(state, new, etag)
    raise AssertionError("unreachable")  # pragma: no cover


def _reason(reason: str, doing: str) -> str:
    if not reason.strip():
        raise InvalidMessage(f"{doing} an order needs a reason")
    return reason.strip()[: steering.MAX_REASON]

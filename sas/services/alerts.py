"""The operator alert an Error owes: sent exactly once across instances, then cleared."""

from __future__ import annotations

import logging
from datetime import datetime
from enum import StrEnum

from sas.domain.errors import ConcurrencyConflict, IllegalTransition, NotFound
from sas.domain.messages import OperatorAlert
from sas.domain.model import AlertRecord, HistoryEntry, OrderState
from sas.domain.recovery import alert_sent, claim_alert
from sas.domain.wire import alert_message_id
from sas.services import metrics
from sas.services.context import Context

log = logging.getLogger(__name__)


class AlertOutcome(StrEnum):
    NOT_OWED = "not_owed"
    SENT = "sent"
    """Sent by this call, and the debt cleared (or cleared by whoever wrote next)."""
    CLAIMED_ELSEWHERE = "claimed_elsewhere"
    """Another instance holds the claim: it sends; if it died, a sweep after the lease does."""


def claiming_alert(ctx: Context, state: OrderState) -> OrderState:
    """``state`` with the claim on its alert, if it owes one: written with the transition to
    Error itself, so the instance that decided Error sends the alert at no extra write."""
    if not state.alert_pending:
        return state
    return claim_alert(
        state, instance_id=ctx.instance_id, now=ctx.clock.now(), lease=ctx.alert_lease
    )


def settle_alert(
    ctx: Context, state: OrderState, etag: str, *, wrote_claim: bool = False
) -> AlertOutcome:
    """Send the alert an Error owes, exactly once across instances, then clear the debt.

    Claim (a conditional write, unless this caller wrote the claim with the Error), send,
    clear (a conditional write). Whoever loses the claim sends nothing. A crash after the claim
    leaves the alert owed: once the lease lapses the next sweep claims and sends it again with
    the same alert id."""
    if not state.alert_pending:
        return AlertOutcome.NOT_OWED
    now = ctx.clock.now()
    mine = (
        wrote_claim
        and state.alert_claimed_by == ctx.instance_id
        and state.alert_claimed_until is not None
        and now < state.alert_claimed_until
    )
    if not mine:
        claimed = _claim_alert(ctx, state, etag, now)
        if claimed is None:
            return AlertOutcome.CLAIMED_ELSEWHERE
        state, etag = claimed
    error_at = state.finished_at or state.updated_at
    alert(
        ctx,
        state.order_id,
        state.last_error or "order failed",
        error_at,
        alert_id=alert_message_id(state.order_id, state.attempt, error_at),
        about=state,
    )
    try:
        ctx.store.update_state(alert_sent(state), etag)
    except (ConcurrencyConflict, NotFound):
        # Moved on meanwhile (an operator resubmitted it): nothing is owed any more, or the
        # next sweep finds the debt and, after the lease, sends the same alert id.
        log.info("sas.alert_flag_conflict", extra={"order_id": state.order_id})
    return AlertOutcome.SENT


def _claim_alert(
    ctx: Context, state: OrderState, etag: str, now: datetime
) -> tuple[OrderState, str] | None:
    """Take over the claim on an owed alert (its lease lapsed, counted with the clock-skew
    allowance since another clock timed it); None if someone else holds it or wrote first."""
    try:
        claimed = claim_alert(
            state,
            instance_id=ctx.instance_id,
            now=now,
            lease=ctx.alert_lease,
            clock_skew=ctx.policy.clock_skew,
        )
    except IllegalTransition:
        return None
    history = HistoryEntry(
        order_id=state.order_id,
        at=now,
        kind="alert_claimed",
        attempt=state.attempt,
        mode=state.mode,
        actor=ctx.instance_id,
        detail=f"previous claim by {state.alert_claimed_by or '-'} lapsed",
    )
    try:
        return claimed, ctx.store.update_state(claimed, etag, history)
    except (ConcurrencyConflict, NotFound):
        return None


def alert(
    ctx: Context,
    order_id: str,
    reason: str,
    at: datetime,
    *,
    alert_id: str,
    about: OrderState | None = None,
) -> None:
    """One operator alert: kept (what operators acknowledge; best effort, the message is what
    must go out), a message on the alerts queue and an ERROR log event."""
    record = AlertRecord(
        alert_id=alert_id,
        order_id=order_id,
        at=at,
        reason=reason[:1000],
        workflow="" if about is None else about.workflow,
        step="" if about is None else about.step,
        attempt=0 if about is None else about.attempt,
    )
    try:
        ctx.store.record_alert(record)
    except Exception:
        log.warning("sas.alert_record_failed", exc_info=True, extra={"order_id": order_id})
    metrics.instruments.alerts.add(1)
    log.error(
        "sas.operator_alert order=%s reason=%s",
        order_id,
        reason,
        extra={"order_id": order_id, "reason": reason, "alert_id": alert_id},
    )
    ctx.transport.send(
        ctx.routes.alerts,
        OperatorAlert(alert_id=alert_id, order_id=order_id, reason=reason[:1000], at=at),
        message_id=alert_id,
        correlation_id=order_id,
    )

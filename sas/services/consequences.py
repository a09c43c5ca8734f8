"""What happens after a transition was persisted: follow-up messages, alerts, status events.

Shared by the Scheduler, the Supervisor and the operator, so a given transition has the same
consequences whoever made it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from enum import StrEnum

from sas.domain.clock import Clock
from sas.domain.errors import ConcurrencyConflict, IllegalTransition, NotFound
from sas.domain.messages import (
    OperatorAlert,
    ScheduleRequest,
    StatusEvent,
    StatusKind,
    wants_status,
)
from sas.domain.model import HistoryEntry, OrderState, ProcessState
from sas.domain.transitions import alert_sent, claim_alert
from sas.domain.wire import (
    StatusLevel,
    alert_message_id,
    schedule_message_id,
    schedule_wakeup_message_id,
    status_message_id,
)
from sas.services import telemetry
from sas.services.ports import StateStore, Transport
from sas.services.routes import Routes

log = logging.getLogger(__name__)


ALERT_LEASE = timedelta(seconds=60)
"""How long a claim to send an alert excludes other senders: far longer than one send, retries
included (Service Bus: 10 s; Storage Queues: bounded in ``adapters.clients``), plus twice the
largest clock-skew allowance (``settings.MAX_CLOCK_SKEW_SECONDS``), so only a sender that died
is ever replaced."""


class AlertOutcome(StrEnum):
    NOT_OWED = "not_owed"
    SENT = "sent"
    """Sent by this call, and the debt cleared (or cleared by whoever wrote next)."""
    CLAIMED_ELSEWHERE = "claimed_elsewhere"
    """Another instance holds the claim: it sends; if it died, a sweep after the lease does."""


class Consequences:
    def __init__(
        self,
        store: StateStore,
        transport: Transport,
        routes: Routes,
        clock: Clock,
        *,
        actor: str,
        alert_lease: timedelta = ALERT_LEASE,
        clock_skew: timedelta = timedelta(0),
    ) -> None:
        self._store = store
        self._transport = transport
        self._routes = routes
        self._clock = clock
        self._actor = actor
        self.alert_lease = alert_lease
        self._clock_skew = clock_skew
        self.notify = Notifier(transport, routes)

    def claiming_alert(self, state: OrderState) -> OrderState:
        """``state`` with the claim on its alert, if it owes one: written with the transition
        to Error itself, so the instance that decided Error sends the alert at no extra write."""
        if not state.alert_pending:
            return state
        return claim_alert(
            state, instance_id=self._actor, now=self._clock.now(), lease=self.alert_lease
        )

    def request_schedule(
        self, state: OrderState, delay_seconds: float = 0, *, again_at: datetime | None = None
    ) -> None:
        """Ask a Scheduler to claim ``state``; ``again_at``: a re-ask for the same version."""
        message_id = (
            schedule_message_id(state.order_id, state.updated_at)
            if again_at is None
            else schedule_wakeup_message_id(state.order_id, state.updated_at, again_at)
        )
        with telemetry.resumed(state.traceparent):
            self._transport.send(
                self._routes.lane(self._routes.scheduler, state.priority),
                ScheduleRequest(order_id=state.order_id),
                message_id=message_id,
                correlation_id=state.order_id,
                delay_seconds=delay_seconds,
            )

    def compensate(self, state: OrderState, *, reason: str) -> None:
        """Ask a Scheduler to start undoing ``state`` (already Compensating): ``reason`` is
        ``refused`` (a step failed for good) or ``expired`` (it ran out of attempts)."""
        telemetry.instruments.compensations.add(1, {"sas.reason": reason})
        with telemetry.order_span(
            telemetry.COMPENSATE, state.order_id, attempt=state.attempt, mode=state.mode
        ) as span:
            telemetry.annotate(span, reason=reason)
            self.request_schedule(state)

    def finished(self, state: OrderState, etag: str) -> None:
        """Status for a terminal state; for Error, the one operator alert it is owed."""
        now = state.updated_at
        telemetry.instruments.orders_finished.add(1, {telemetry.OUTCOME: state.process_state.value})
        if state.process_state is ProcessState.PROCESSED:
            self.notify.about(state, "completed", now)
        elif state.process_state is ProcessState.COMPENSATED:
            self.notify.about(state, "compensated", now, detail=state.last_error)
        elif state.process_state is ProcessState.ERROR:
            self.settle_alert(state, etag, wrote_claim=True)
            self.notify.about(state, "failed", now, detail=state.last_error)

    def settle_alert(
        self, state: OrderState, etag: str, *, wrote_claim: bool = False
    ) -> AlertOutcome:
        """Send the alert an Error owes, exactly once across instances, then clear the debt.

        Claim (a conditional write), send, clear (a conditional write). Whoever loses the
        claim sends nothing. A crash after the claim leaves the alert owed: once the lease
        lapses the next sweep claims and sends it again with the same alert id."""
        if not state.alert_pending:
            return AlertOutcome.NOT_OWED
        now = self._clock.now()
        # Only the writer of the claim sends under it: a sweep in the same process shares the
        # actor name, and claim_alert refuses it any live claim.
        mine = (
            wrote_claim
            and state.alert_claimed_by == self._actor
            and state.alert_claimed_until is not None
            and now < state.alert_claimed_until
        )
        if not mine:
            try:
                claimed = claim_alert(
                    state,
                    instance_id=self._actor,
                    now=now,
                    lease=self.alert_lease,
                    clock_skew=self._clock_skew,
                )
            except IllegalTransition:
                return AlertOutcome.CLAIMED_ELSEWHERE
            history = HistoryEntry(
                order_id=state.order_id,
                at=now,
                kind="alert_claimed",
                attempt=state.attempt,
                mode=state.mode,
                actor=self._actor,
                detail=f"previous claim by {state.alert_claimed_by or '-'} lapsed",
            )
            try:
                etag = self._store.update_state(claimed, etag, history)
            except (ConcurrencyConflict, NotFound):
                return AlertOutcome.CLAIMED_ELSEWHERE
            state = claimed
        error_at = state.finished_at or state.updated_at
        self.notify.alert(
            state.order_id,
            state.last_error or "order failed",
            error_at,
            alert_id=alert_message_id(state.order_id, state.attempt, error_at),
        )
        try:
            self._store.update_state(alert_sent(state), etag)
        except (ConcurrencyConflict, NotFound):
            # Moved on meanwhile (an operator resubmitted it): nothing is owed any more, or
            # the next sweep finds the debt and, after the lease, sends the same alert id.
            log.info("sas.alert_flag_conflict", extra={"order_id": state.order_id})
        return AlertOutcome.SENT


class Notifier:
    """Status events to the submitter and alerts to operators.

    A status event is best effort: a missing or broken reply-to queue belongs to the
    submitter and must never fail or stall the order itself.
    """

    def __init__(self, transport: Transport, routes: Routes) -> None:
        self._transport = transport
        self._routes = routes

    def about(
        self,
        state: OrderState,
        status: StatusKind,
        at: datetime,
        *,
        step: str | None = None,
        detail: str | None = None,
    ) -> None:
        """``status`` to the order's submitter, if it asked for that kind of event."""
        self.status(
            state.reply_to,
            state.order_id,
            status,
            at,
            level=state.status_events,
            step=step,
            detail=detail,
        )

    def status(
        self,
        reply_to: str | None,
        order_id: str,
        status: StatusKind,
        at: datetime,
        *,
        level: StatusLevel,
        step: str | None = None,
        detail: str | None = None,
    ) -> None:
        if reply_to is None or not wants_status(level, status):
            return
        event = StatusEvent(order_id=order_id, status=status, at=at, step=step, detail=detail)
        try:
            self._transport.send(
                reply_to,
                event,
                message_id=status_message_id(order_id, status, step, at),
                correlation_id=order_id,
            )
        except NotFound:
            log.warning(
                "sas.status_queue_missing",
                extra={"order_id": order_id, "queue": reply_to, "status": status},
            )
        except (
            Exception
        ):  # the submitter's queue is full, disabled, or flaky: not our order's fault
            log.warning(
                "sas.status_send_failed",
                exc_info=True,
                extra={"order_id": order_id, "queue": reply_to, "status": status},
            )

    def alert(self, order_id: str, reason: str, at: datetime, *, alert_id: str) -> None:
        """One operator alert: a message on the alerts queue and an ERROR log event."""
        telemetry.instruments.alerts.add(1)
        log.error(
            "sas.operator_alert order=%s reason=%s",
            order_id,
            reason,
            extra={"order_id": order_id, "reason": reason, "alert_id": alert_id},
        )
        self._transport.send(
            self._routes.alerts,
            OperatorAlert(alert_id=alert_id, order_id=order_id, reason=reason[:1000], at=at),
            message_id=alert_id,
            correlation_id=order_id,
        )

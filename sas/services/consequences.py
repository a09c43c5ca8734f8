"""What happens after a transition was persisted: follow-up messages, alerts, status events.

Shared by the Scheduler, the Supervisor and the operator, so a given transition has the same
consequences whoever made it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sas.domain.errors import ConcurrencyConflict, NotFound
from sas.domain.messages import OperatorAlert, ScheduleRequest, StatusEvent, StatusKind
from sas.domain.model import OrderState, ProcessState
from sas.domain.transitions import alert_sent
from sas.domain.wire import alert_message_id, schedule_message_id, status_message_id
from sas.services.ports import StateStore, Transport
from sas.services.routes import Routes

log = logging.getLogger(__name__)


class Consequences:
    def __init__(self, store: StateStore, transport: Transport, routes: Routes) -> None:
        self._store = store
        self._transport = transport
        self._routes = routes
        self.notify = Notifier(transport, routes)

    def request_schedule(self, state: OrderState, delay_seconds: float = 0) -> None:
        self._transport.send(
            self._routes.scheduler,
            ScheduleRequest(order_id=state.order_id),
            message_id=schedule_message_id(state.order_id, state.updated_at),
            correlation_id=state.order_id,
            delay_seconds=delay_seconds,
        )

    def finished(self, state: OrderState, etag: str) -> None:
        """Status for a terminal state; for Error, the one operator alert it is owed."""
        now = state.updated_at
        if state.process_state is ProcessState.PROCESSED:
            self.notify.status(state.reply_to, state.order_id, "completed", now)
        elif state.process_state is ProcessState.COMPENSATED:
            self.notify.status(
                state.reply_to, state.order_id, "compensated", now, detail=state.last_error
            )
        elif state.process_state is ProcessState.ERROR:
            self.settle_alert(state, etag)
            self.notify.status(
                state.reply_to, state.order_id, "failed", now, detail=state.last_error
            )

    def settle_alert(self, state: OrderState, etag: str) -> bool:
        """Send the alert an Error owes, then clear the debt (conditionally).

        A crash between the two re-sends it on the Supervisor's next sweep, with the same
        message id, which Service Bus duplicate detection drops."""
        if not state.alert_pending:
            return False
        self.notify.alert(
            state.order_id,
            state.last_error or "order failed",
            state.updated_at,
            message_id=alert_message_id(state.order_id, state.attempt, state.updated_at),
        )
        try:
            self._store.update_state(alert_sent(state), etag)
        except ConcurrencyConflict:
            log.info("sas.alert_flag_conflict", extra={"order_id": state.order_id})
        return True


class Notifier:
    """Status events to the submitter and alerts to operators.

    A status event is best effort: a missing or broken reply-to queue belongs to the
    submitter and must never fail or stall the order itself.
    """

    def __init__(self, transport: Transport, routes: Routes) -> None:
        self._transport = transport
        self._routes = routes

    def status(
        self,
        reply_to: str | None,
        order_id: str,
        status: StatusKind,
        at: datetime,
        *,
        step: str | None = None,
        detail: str | None = None,
    ) -> None:
        if reply_to is None:
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

    def alert(self, order_id: str, reason: str, at: datetime, *, message_id: str) -> None:
        """One operator alert: a message on the alerts queue and an ERROR log event."""
        log.error(
            "sas.operator_alert order=%s reason=%s",
            order_id,
            reason,
            extra={"order_id": order_id, "reason": reason},
        )
        self._transport.send(
            self._routes.alerts,
            OperatorAlert(order_id=order_id, reason=reason[:1000], at=at),
            message_id=message_id,
            correlation_id=order_id,
        )

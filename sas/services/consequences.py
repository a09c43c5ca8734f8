"""What happens after a transition was persisted: follow-up messages, alerts, status events.

Shared by the Scheduler, the Supervisor and the operator, so a given transition has the same
consequences whoever made it.
"""

from __future__ import annotations

import logging

from sas.domain.errors import ConcurrencyConflict
from sas.domain.messages import ScheduleRequest
from sas.domain.model import OrderState, ProcessState
from sas.domain.transitions import alert_sent
from sas.services.ports import StateStore, Transport
from sas.services.routes import Notifier, Routes

log = logging.getLogger(__name__)


def schedule_message_id(state: OrderState) -> str:
    """Unique per persisted state version: a re-send of the same request is a duplicate
    (Service Bus drops it), while a new retry or resubmission never is."""
    return f"{state.order_id}:schedule:{state.updated_at.timestamp():.6f}"


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
            message_id=schedule_message_id(state),
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
            message_id=f"{state.order_id}:alert:{state.attempt}:{state.updated_at.timestamp():.6f}",
        )
        try:
            self._store.update_state(alert_sent(state), etag)
        except ConcurrencyConflict:
            log.info("sas.alert_flag_conflict", extra={"order_id": state.order_id})
        return True

"""Submission: the order and its state inserted together (or not at all), then scheduled."""

from __future__ import annotations

import logging
from enum import StrEnum

from sas.domain.clock import Clock
from sas.domain.errors import AlreadyExists, InvalidMessage
from sas.domain.messages import OrderSubmitted
from sas.domain.model import HistoryEntry, OrderRecord, ProcessState
from sas.domain.transitions import initial_state
from sas.domain.workflow import WORKFLOWS
from sas.services.consequences import Consequences
from sas.services.ports import StateStore, Transport
from sas.services.routes import Routes

log = logging.getLogger(__name__)


class SubmissionOutcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


class Submission:
    def __init__(
        self, store: StateStore, transport: Transport, routes: Routes, clock: Clock
    ) -> None:
        self._store = store
        self._clock = clock
        self._then = Consequences(store, transport, routes, clock, actor="submit")

    def submit(self, message: OrderSubmitted) -> SubmissionOutcome:
        workflow = WORKFLOWS.get(message.workflow)
        if workflow is None:
            raise InvalidMessage(f"unknown workflow {message.workflow!r}")
        now = self._clock.now()
        order = OrderRecord(
            order_id=message.order_id,
            workflow=workflow.name,
            details=message.details.model_dump(mode="json"),
            fingerprint=message.fingerprint(),
            submitted_at=now,
            reply_to=message.reply_to,
        )
        extra = {"order_id": message.order_id}
        state = initial_state(order.order_id, workflow, reply_to=message.reply_to, now=now)
        # Indexed before it exists: a crash after this leaves a marker the Supervisor sweeps
        # away, never an order the Supervisor cannot see.
        self._store.touch_live(order.order_id, now)
        history = HistoryEntry(order.order_id, now, "submitted", attempt=0, actor="submit")
        try:
            self._store.create_order(order, state, history)
        except AlreadyExists:
            return self._resubmitted(order)
        log.info("sas.order_accepted", extra=extra)
        self._then.request_schedule(state)
        self._then.notify.status(order.reply_to, order.order_id, "received", now)
        return SubmissionOutcome.ACCEPTED

    def _resubmitted(self, order: OrderRecord) -> SubmissionOutcome:
        """A redelivery changes nothing; a different order under a taken id is refused."""
        extra = {"order_id": order.order_id}
        existing = self._store.get_order(order.order_id)
        if existing is None or existing.fingerprint != order.fingerprint:
            log.warning("sas.order_id_conflict", extra=extra)
            self._then.notify.status(
                order.reply_to,
                order.order_id,
                "rejected",
                self._clock.now(),
                detail="order id already used for a different order",
            )
            return SubmissionOutcome.CONFLICT
        log.info("sas.order_duplicate", extra=extra)
        current = self._store.get_state(order.order_id)
        if current is not None and current.value.process_state is ProcessState.PENDING:
            # The first delivery may have died between the insert and the send: ask again
            # (same message id, so a send that did happen is a duplicate). Harmless otherwise,
            # since a claim is a conditional write.
            self._then.request_schedule(current.value)
        return SubmissionOutcome.DUPLICATE

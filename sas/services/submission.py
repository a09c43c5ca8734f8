"""Submission: the order and its state inserted together (or not at all), then scheduled."""

from __future__ import annotations

import logging
from enum import StrEnum

from sas.domain.clock import Clock
from sas.domain.errors import AlreadyExists, InvalidMessage
from sas.domain.messages import OrderSubmitted, encode
from sas.domain.model import HistoryEntry, OrderRecord, ProcessState
from sas.domain.transitions import initial_state
from sas.domain.wire import POISON_SUFFIX
from sas.domain.workflow import WORKFLOWS
from sas.services.consequences import Consequences
from sas.services.ports import StateStore, Transport
from sas.services.routes import Routes

log = logging.getLogger(__name__)


class SubmissionOutcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


DEFAULT_REPLY_TO_PREFIXES: tuple[str, ...] = ("status-",)


class Submission:
    def __init__(
        self,
        store: StateStore,
        transport: Transport,
        routes: Routes,
        clock: Clock,
        *,
        reply_to_prefixes: tuple[str, ...] = DEFAULT_REPLY_TO_PREFIXES,
    ) -> None:
        self._store = store
        self._clock = clock
        self._then = Consequences(store, transport, routes, clock, actor="submit")
        self._routes = routes
        self._reply_to_prefixes = reply_to_prefixes
        own = (
            routes.orders,
            routes.scheduler,
            routes.replies,
            routes.alerts,
            *routes.agents.values(),
        )
        self._own_queues = frozenset((*own, *(f"{queue}{POISON_SUFFIX}" for queue in own)))

    def check(self, message: OrderSubmitted) -> None:
        """InvalidMessage (with a reason for the submitter) if the order can't be accepted as
        it stands, whatever the store holds: checked before anything is written."""
        if message.workflow not in WORKFLOWS:
            raise InvalidMessage(f"unknown workflow {message.workflow!r}")
        reply_to = message.reply_to
        if reply_to is None:
            return
        # Status events go where the submitter says: never into the app's own queues, where
        # they could be taken for work or alerts, and only where the operator allows.
        if reply_to in self._own_queues:
            raise InvalidMessage("reply_to names one of the app's own queues")
        if not reply_to.startswith(self._reply_to_prefixes):
            allowed = ", ".join(f"{prefix}*" for prefix in self._reply_to_prefixes)
            raise InvalidMessage(f"reply_to must match {allowed}")

    def submit(self, message: OrderSubmitted) -> SubmissionOutcome:
        self.check(message)
        workflow = WORKFLOWS[message.workflow]
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
            return self._resubmitted(order, message)
        log.info("sas.order_accepted", extra=extra)
        self._then.request_schedule(state)
        self._then.notify.status(order.reply_to, order.order_id, "received", now)
        return SubmissionOutcome.ACCEPTED

    def _resubmitted(self, order: OrderRecord, message: OrderSubmitted) -> SubmissionOutcome:
        """A redelivery changes nothing; a different order under a taken id is refused, and
        kept where an operator sees it (the original order is untouched)."""
        extra = {"order_id": order.order_id}
        existing = self._store.get_order(order.order_id)
        if existing is None or existing.fingerprint != order.fingerprint:
            parked_id = self._store.park_message(
                self._routes.orders,
                "order id already used for a different order",
                encode(message),
                self._clock.now(),
            )
            log.warning("sas.order_id_conflict", extra={**extra, "parked_id": parked_id})
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

"""Submission: the order and its state inserted together (or not at all), its first step
claimed in the same transaction, and that step's request sent.

Claiming here costs nothing extra: the insert already holds the order's partition, so the
claim rides in the same entity-group transaction, and no ScheduleRequest hop is needed.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from enum import StrEnum

from sas.domain.clock import Clock
from sas.domain.errors import AlreadyExists, InvalidMessage
from sas.domain.messages import OrderSubmitted, encode
from sas.domain.model import HistoryEntry, OrderRecord, OrderState, ProcessState
from sas.domain.priority import AdmissionPolicy, Waiting
from sas.domain.transitions import claim, initial_state, look_again_at
from sas.domain.wire import POISON_SUFFIX, deferred_submission_message_id
from sas.domain.workflow import WORKFLOWS, Workflow
from sas.services import telemetry
from sas.services.backlog import Backlog
from sas.services.consequences import Consequences
from sas.services.dispatch import Dispatcher
from sas.services.ports import StateStore, Transport
from sas.services.recent import RecentStates
from sas.services.routes import Routes
from sas.services.routing import Router

log = logging.getLogger(__name__)


class SubmissionOutcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    DEFERRED = "deferred"
    """A low-priority order put back for later while higher lanes are backlogged."""


DEFAULT_REPLY_TO_PREFIXES: tuple[str, ...] = ("status-",)


class Submission:
    def __init__(
        self,
        store: StateStore,
        transport: Transport,
        routes: Routes,
        clock: Clock,
        *,
        instance_id: str = "submit",
        reply_to_prefixes: tuple[str, ...] = DEFAULT_REPLY_TO_PREFIXES,
        admission: AdmissionPolicy | None = None,
        router: Router | None = None,
        queue_allowance: bool = False,
        recent: RecentStates | None = None,
    ) -> None:
        """``recent``: where the states this process writes are kept for its Scheduler."""
        self._store = store
        self._recent = recent
        self._transport = transport
        self._admission = admission or AdmissionPolicy()
        self._backlog = Backlog(transport, clock)
        self._clock = clock
        self._instance_id = instance_id
        self._then = Consequences(store, transport, routes, clock, actor="submit")
        self._dispatcher = Dispatcher(
            store, transport, routes, clock, router, queue_allowance=queue_allowance
        )
        self._routes = routes
        self._reply_to_prefixes = reply_to_prefixes
        own = (*routes.consumed, routes.alerts)
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
        # The order's trace: the submitter's, when its message carried one (the entrypoint
        # made it current), else a new one that starts here.
        with telemetry.order_span(
            telemetry.SUBMIT, message.order_id, priority=message.priority
        ) as span:
            outcome = self._submit(message)
            telemetry.annotate(span, outcome=outcome.value)
            return outcome

    def _submit(self, message: OrderSubmitted) -> SubmissionOutcome:
        self.check(message)
        workflow = WORKFLOWS[message.workflow]
        now = self._clock.now()
        if message.priority == "low":
            delay = self._admission.deferral(
                message.priority,
                deferred_since=message.deferred_since,
                now=now,
                higher=self._higher_waiting(),
            )
            if delay is not None:
                return self._defer(message, now, delay)
        details = message.details.model_dump(mode="json")
        order = OrderRecord(
            order_id=message.order_id,
            workflow=workflow.name,
            details=details,
            fingerprint=message.fingerprint(),
            submitted_at=now,
            reply_to=message.reply_to,
            priority=message.priority,
        )
        extra = {"order_id": message.order_id}
        pending = initial_state(
            order.order_id,
            workflow,
            reply_to=message.reply_to,
            now=now,
            details=details,
            status_events=message.status_events,
            priority=message.priority,
        )
        claimed = claim(pending, instance_id=self._instance_id, now=now, workflow=workflow)
        claimed = self._dispatcher.route(claimed, workflow, now)
        claimed = replace(claimed, traceparent=telemetry.current_traceparent())
        # Indexed before it exists: a crash after this leaves a marker the Supervisor sweeps
        # away, never an order the Supervisor cannot see. The marker's ETag and touch id go in
        # the state: the Scheduler that finishes the order drops the marker on the one, or
        # marks it finished for the other (marker_moves.py).
        touch = uuid.uuid4().hex
        marker_etag = self._store.touch_live(
            order.order_id, now, look_again_at(claimed, now=now, workflow=workflow), touch
        )
        claimed = replace(claimed, marker_etag=marker_etag, marker_touch=touch)
        history = [
            HistoryEntry(order.order_id, now, "submitted", attempt=0, actor="submit"),
            self._dispatcher.claim_history(claimed, workflow, self._instance_id),
        ]
        try:
            etag = self._store.create_order(order, claimed, history)
        except AlreadyExists:
            return self._resubmitted(order, message)
        if self._recent is not None:
            self._recent.remember(claimed, etag)
        log.info("sas.order_accepted", extra=extra)
        if not claimed.is_running:  # deferred: no endpoint had room
            wait = (claimed.not_before or now) - now
            self._then.request_schedule(claimed, delay_seconds=wait.total_seconds())
            log.info("sas.step_deferred", extra={**extra, "step": history[1].step})
            self._then.notify.about(claimed, "received", now)
            return SubmissionOutcome.ACCEPTED
        log.info(
            "sas.step_claimed",
            extra={**extra, "step": history[1].step, "attempt": claimed.attempt, "mode": "do"},
        )
        self._dispatcher.dispatch(claimed, workflow, etag)  # the work first: its deadline runs
        self._then.notify.about(claimed, "received", now)
        self._dispatcher.announce(claimed, workflow)
        return SubmissionOutcome.ACCEPTED

    def _higher_waiting(self) -> Waiting:
        """What waits in the high and normal lanes of the queues the app consumes: the work a
        low-priority order would otherwise be let in beside. Not the scheduler's lanes: they
        hold delayed messages (retry backoffs, deferred steps), and a peek dates a message
        from when it was sent, not from when it became due."""
        scheduler = set(self._routes.all_lanes(self._routes.scheduler))
        lanes = self._routes.lanes_for(("high", "normal"))
        return self._backlog.waiting(tuple(q for q in lanes if q not in scheduler))

    def _defer(self, message: OrderSubmitted, now: datetime, delay: timedelta) -> SubmissionOutcome:
        """Back into the low lane for ``delay``, remembering when the first deferral was (the
        copy is a message of its own; the original is settled once the copy is sent)."""
        since = message.deferred_since if message.deferred_since is not None else now
        self._transport.send(
            self._routes.lane(self._routes.orders, "low"),
            message.model_copy(update={"deferred_since": min(since, now)}),
            message_id=deferred_submission_message_id(message.order_id, now),
            correlation_id=message.order_id,
            delay_seconds=delay.total_seconds(),
        )
        log.info(
            "sas.submission_deferred",
            extra={"order_id": message.order_id, "delay": delay.total_seconds()},
        )
        return SubmissionOutcome.DEFERRED

    def _resubmitted(self, order: OrderRecord, message: OrderSubmitted) -> SubmissionOutcome:
        """A redelivery changes nothing; a different order under a taken id is refused, and
        kept where an operator sees it (the original order is untouched)."""
        extra = {"order_id": order.order_id}
        current = self._store.get_state(order.order_id)
        if current is not None:
            # This delivery's index touch moved the marker's due time to its own clock; put
            # it back where the existing order needs it (never after its deadline).
            workflow = WORKFLOWS.get(current.value.workflow)
            if workflow is not None:
                now = self._clock.now()
                due = look_again_at(current.value, now=now, workflow=workflow)
                self._store.touch_live(order.order_id, now, due)
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
                level=message.status_events,
                detail="order id already used for a different order",
            )
            return SubmissionOutcome.CONFLICT
        log.info("sas.order_duplicate", extra=extra)
        if current is not None:
            self._resume(current.value, WORKFLOWS[order.workflow])
        return SubmissionOutcome.DUPLICATE

    def _resume(self, state: OrderState, workflow: Workflow) -> None:
        """The first delivery may have died between the insert and the send: send again what
        it would have sent (the same message id, so a send that did happen is a duplicate on
        Service Bus; on Storage Queues the agent's call repeats under the same idempotency
        key and the second reply is fenced off). Only while the order still stands where the
        submission left it."""
        if state.process_state is ProcessState.PENDING:  # deferred, or an earlier version
            self._then.request_schedule(state)
        elif (
            state.process_state is ProcessState.PROCESSING
            and state.attempt == 1
            and state.step_index == 0
            and self._clock.now() < (state.complete_by or state.updated_at)
        ):
            self._dispatcher.dispatch(state, workflow)

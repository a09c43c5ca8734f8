"""The Scheduler: claims orders, dispatches steps to agents, applies their replies.

Every state change is read -> pure transition -> write conditional on the ETag read.
Losing that race is a normal outcome, never an error: somebody else moved the order on.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from sas.domain.clock import Clock
from sas.domain.errors import ConcurrencyConflict, IllegalTransition, StaleReply
from sas.domain.messages import ScheduleRequest, StepReply, StepRequest
from sas.domain.model import OrderState, ProcessState, StepRecord
from sas.domain.transitions import claim, complete_step, fail_step
from sas.domain.workflow import Workflow, workflow_named
from sas.services.ports import StateStore, Transport
from sas.services.routes import Notifier, Routes

log = logging.getLogger(__name__)

_REPLY_RETRIES = 3


class ScheduleOutcome(StrEnum):
    CLAIMED = "claimed"
    LOST_RACE = "lost_race"
    NOT_PENDING = "not_pending"
    UNKNOWN_ORDER = "unknown_order"


class ReplyOutcome(StrEnum):
    ADVANCED = "advanced"
    PROCESSED = "processed"
    FAILED = "failed"
    STALE = "stale"
    UNKNOWN_ORDER = "unknown_order"


class Scheduler:
    def __init__(
        self,
        store: StateStore,
        transport: Transport,
        routes: Routes,
        clock: Clock,
        instance_id: str,
    ) -> None:
        self._store = store
        self._transport = transport
        self._routes = routes
        self._clock = clock
        self._instance_id = instance_id
        self._notify = Notifier(transport, routes)

    def schedule(self, request: ScheduleRequest) -> ScheduleOutcome:
        extra: dict[str, object] = {"order_id": request.order_id}
        current = self._store.get_state(request.order_id)
        if current is None:
            log.warning("sas.schedule_unknown_order", extra=extra)
            return ScheduleOutcome.UNKNOWN_ORDER
        workflow = workflow_named(current.value.workflow)
        try:
            claimed = claim(
                current.value,
                instance_id=self._instance_id,
                now=self._clock.now(),
                workflow=workflow,
            )
        except IllegalTransition:
            log.info("sas.schedule_not_pending", extra=extra)
            return ScheduleOutcome.NOT_PENDING
        try:
            self._store.update_state(claimed, current.etag)
        except ConcurrencyConflict:
            log.info("sas.claim_lost", extra=extra)
            return ScheduleOutcome.LOST_RACE
        log.info("sas.step_claimed", extra={**extra, **_step_extra(claimed, workflow)})
        self._dispatch(claimed, workflow)
        return ScheduleOutcome.CLAIMED

    def on_reply(self, reply: StepReply) -> ReplyOutcome:
        # A conflict means the state moved under us (a supervisor, a duplicate reply):
        # read again and let the fence decide whether this reply still applies.
        for _ in range(_REPLY_RETRIES):
            try:
                return self._apply_reply(reply)
            except ConcurrencyConflict:
                log.info("sas.reply_conflict_retry", extra={"order_id": reply.order_id})
        return self._apply_reply(reply)

    def _apply_reply(self, reply: StepReply) -> ReplyOutcome:
        extra: dict[str, object] = {
            "order_id": reply.order_id,
            "step": reply.step,
            "attempt": reply.attempt,
        }
        current = self._store.get_state(reply.order_id)
        if current is None:
            log.warning("sas.reply_unknown_order", extra=extra)
            return ReplyOutcome.UNKNOWN_ORDER
        state, workflow = current.value, workflow_named(current.value.workflow)
        now = self._clock.now()
        try:
            if workflow.step(reply.step_index).name != reply.step:
                raise StaleReply(f"step {reply.step_index} is not {reply.step!r}")
            if reply.outcome == "error":
                next_state = fail_step(
                    state,
                    attempt=reply.attempt,
                    step_index=reply.step_index,
                    now=now,
                    reason=f"{reply.step}: {reply.error or 'remote refused the step'}",
                )
            else:
                next_state = complete_step(
                    state,
                    attempt=reply.attempt,
                    step_index=reply.step_index,
                    instance_id=self._instance_id,
                    now=now,
                    workflow=workflow,
                )
        except (StaleReply, IndexError):
            log.warning(
                "sas.reply_stale",
                extra={**extra, "current_attempt": state.attempt, "state": state.process_state},
            )
            return ReplyOutcome.STALE

        if reply.outcome == "error":
            self._store.update_state(next_state, current.etag)
            log.warning("sas.step_failed", extra=extra)
            self._notify.alert(reply.order_id, next_state.last_error or "step failed", now)
            self._notify.status(state.reply_to, reply.order_id, "failed", now, step=reply.step)
            return ReplyOutcome.FAILED

        # Recorded before the state moves on, so compensation data is durable before the
        # step counts as done; a redelivery after a crash here writes the same record again.
        self._store.record_step(
            StepRecord(
                order_id=reply.order_id,
                index=reply.step_index,
                name=reply.step,
                attempt=reply.attempt,
                completed_at=now,
                result=reply.result,
            )
        )
        self._store.update_state(next_state, current.etag)
        log.info("sas.step_completed", extra=extra)
        self._notify.status(state.reply_to, reply.order_id, "step_completed", now, step=reply.step)
        if next_state.process_state is ProcessState.PROCESSED:
            log.info("sas.order_processed", extra={"order_id": reply.order_id})
            self._notify.status(state.reply_to, reply.order_id, "completed", now)
            return ReplyOutcome.PROCESSED
        self._dispatch(next_state, workflow)
        return ReplyOutcome.ADVANCED

    def _dispatch(self, state: OrderState, workflow: Workflow) -> None:
        """Send the StepRequest for the state's current attempt (already persisted)."""
        step = workflow.step(state.step_index)
        order = self._store.get_order(state.order_id)
        if order is None or state.complete_by is None:
            raise IllegalTransition(f"order {state.order_id} cannot be dispatched")
        request = StepRequest(
            order_id=state.order_id,
            step=step.name,
            step_index=state.step_index,
            attempt=state.attempt,
            action=step.action,
            complete_by=state.complete_by,
            idempotency_key=f"{state.order_id}:{step.name}",
            payload={"order_id": state.order_id, **order.details},
        )
        self._transport.send(
            self._routes.agent(step.agent),
            request,
            message_id=f"{state.order_id}:{step.name}:{state.attempt}",
            correlation_id=state.order_id,
        )
        self._notify.status(
            state.reply_to, state.order_id, "step_started", self._clock.now(), step=step.name
        )


def _step_extra(state: OrderState, workflow: Workflow) -> dict[str, object]:
    return {
        "step": workflow.step(state.step_index).name,
        "attempt": state.attempt,
        "complete_by": state.complete_by.isoformat() if state.complete_by else None,
    }

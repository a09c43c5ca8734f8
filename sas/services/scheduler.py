"""The Scheduler: claims orders, dispatches steps (and undo steps) to agents, applies replies.

Every state change is read -> pure transition -> write conditional on the ETag read, with its
history entry in the same transaction. Losing that race is a normal outcome, never an error:
somebody else moved the order on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from enum import StrEnum

from sas.domain.carried import carried_state
from sas.domain.clock import Clock
from sas.domain.errors import ConcurrencyConflict, IllegalTransition, NotFound
from sas.domain.messages import Message, ScheduleRequest, StatusKind, StepReply, encode
from sas.domain.model import HistoryEntry, OrderState, StepRecord, Versioned
from sas.domain.transitions import Fence, NotYet, ReplyDecision, Then, claim, decide_reply, fence
from sas.domain.workflow import Workflow, workflow_named
from sas.services import telemetry
from sas.services.consequences import Consequences
from sas.services.dispatch import Dispatcher
from sas.services.marker_moves import MarkerMoves
from sas.services.ports import StateStore, Transport
from sas.services.recent import RecentStates
from sas.services.routes import Routes
from sas.services.routing import Router

log = logging.getLogger(__name__)

_REPLY_RETRIES = 3


class ScheduleOutcome(StrEnum):
    CLAIMED = "claimed"
    LOST_RACE = "lost_race"
    NOT_PENDING = "not_pending"
    NOT_YET = "not_yet"
    UNKNOWN_ORDER = "unknown_order"
    DEFERRED = "deferred"
    """No endpoint had room: Pending again, asked again after a backoff."""


class ReplyOutcome(StrEnum):
    ADVANCED = "advanced"
    FINISHED = "finished"
    COMPENSATING = "compensating"
    DEFERRED = "deferred"
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
        router: Router | None = None,
        queue_allowance: bool = False,
        recent: RecentStates | None = None,
        moves: MarkerMoves | None = None,
    ) -> None:
        """``recent``: the states this process wrote, shared with its Submission (a reply
        that comes back here then needs no read); a Scheduler of its own by default.
        ``moves``: moves the in-flight markers of the orders it writes (one of its own by
        default)."""
        self._store = store
        self._recent = recent if recent is not None else RecentStates()
        self._moves = moves if moves is not None else MarkerMoves(store, clock)
        self._transport = transport
        self._routes = routes
        self._clock = clock
        self._instance_id = instance_id
        self._then = Consequences(store, transport, routes, clock, actor=instance_id)
        self._dispatcher = Dispatcher(
            store, transport, routes, clock, router, queue_allowance=queue_allowance
        )

    def schedule(self, request: ScheduleRequest) -> ScheduleOutcome:
        current = self._store.get_state(request.order_id)
        # A request that carries no context (sent before tracing, or by hand) continues the
        # order's stored trace.
        with telemetry.order_span(
            telemetry.SCHEDULE,
            request.order_id,
            parent=None if current is None else current.value.traceparent,
        ) as span:
            outcome = self._schedule(request, current)
            telemetry.annotate(span, outcome=outcome.value)
            return outcome

    def _schedule(
        self, request: ScheduleRequest, current: Versioned[OrderState] | None
    ) -> ScheduleOutcome:
        extra: dict[str, object] = {"order_id": request.order_id}
        if current is None:
            self._park(self._routes.scheduler, "schedule request for an unknown order", request)
            log.warning("sas.schedule_unknown_order", extra=extra)
            return ScheduleOutcome.UNKNOWN_ORDER
        workflow = workflow_named(current.value.workflow)
        now = self._clock.now()
        try:
            claimed = claim(
                current.value, instance_id=self._instance_id, now=now, workflow=workflow
            )
        except NotYet:
            # Early: a duplicate, or this instance's clock runs behind the Supervisor's. Ask
            # again when the backoff ends rather than consume the only wake-up there is.
            log.info("sas.schedule_backing_off", extra=extra)
            wait = current.value.not_before - now if current.value.not_before else None
            self._then.request_schedule(
                current.value,
                delay_seconds=(wait.total_seconds() if wait else 0) + 0.5,
                again_at=now,
            )
            return ScheduleOutcome.NOT_YET
        except IllegalTransition:
            log.info("sas.schedule_not_pending", extra=extra)
            return ScheduleOutcome.NOT_PENDING
        claimed = self._dispatcher.route(claimed, workflow, now)
        try:
            etag = self._store.update_state(
                claimed,
                current.etag,
                self._dispatcher.claim_history(claimed, workflow, self._instance_id),
            )
        except ConcurrencyConflict:
            log.info("sas.claim_lost", extra=extra)
            return ScheduleOutcome.LOST_RACE
        self._recent.remember(claimed, etag)
        if not claimed.is_running:
            self._ask_again(claimed, now)
            self._moves.after_write(current.value, claimed, now)
            return ScheduleOutcome.DEFERRED
        log.info("sas.step_claimed", extra={**extra, **_step_extra(claimed, workflow)})
        self._dispatcher.dispatch(claimed, workflow, etag)
        self._dispatcher.announce(claimed, workflow)
        self._moves.after_write(current.value, claimed, now)  # after the step is on its way
        return ScheduleOutcome.CLAIMED

    def on_reply(self, reply: StepReply) -> ReplyOutcome:
        with telemetry.order_span(
            telemetry.REPLY,
            reply.order_id,
            step=reply.step,
            attempt=reply.attempt,
            mode=reply.mode,
            endpoint=reply.endpoint,
        ) as span:
            outcome = self._on_reply(reply)
            telemetry.annotate(span, outcome=outcome.value, reply=reply.outcome)
            return outcome

    def _on_reply(self, reply: StepReply) -> ReplyOutcome:
        # Start from the state the reply carries back, else the one this process remembers
        # writing: either saves a read. A conflict means the state moved under us (a
        # supervisor, a duplicate reply): read again and let the fence decide whether this
        # reply still applies.
        known = self._carried(reply) or self._recent.get(reply.order_id)
        if known is not None:
            try:
                return self._apply_reply(reply, known)
            except ConcurrencyConflict:  # moved (or purged) since it was written
                self._recent.forget(reply.order_id)
        for _ in range(_REPLY_RETRIES):
            try:
                return self._apply_reply(reply)
            except ConcurrencyConflict:
                log.info("sas.reply_conflict_retry", extra={"order_id": reply.order_id})
        return self._apply_reply(reply)

    def _carried(self, reply: StepReply) -> Versioned[OrderState] | None:
        if reply.carried_state is None:
            return None
        try:
            return carried_state(reply.carried_state, reply.order_id, self._store.carry_key())
        except Exception:  # decided on a read instead (the store has logged why)
            log.debug("sas.carried_state_skipped", exc_info=True)
            return None

    def _apply_reply(
        self, reply: StepReply, known: Versioned[OrderState] | None = None
    ) -> ReplyOutcome:
        """``known``: a state written at its ETag, to start from instead of reading (carried
        back by the reply, or remembered by this process)."""
        extra: dict[str, object] = {
            "order_id": reply.order_id,
            "step": reply.step,
            "attempt": reply.attempt,
            "mode": reply.mode,
        }
        remembered = known is not None
        current = known if known is not None else self._store.get_state(reply.order_id)
        if current is None:
            self._park(self._routes.replies, "reply for an unknown order", reply)
            log.warning("sas.reply_unknown_order", extra=extra)
            return ReplyOutcome.UNKNOWN_ORDER
        state, workflow = current.value, workflow_named(current.value.workflow)
        verdict = fence(
            state,
            workflow,
            step_index=reply.step_index,
            step=reply.step,
            attempt=reply.attempt,
            mode=reply.mode,
            outcome=reply.outcome,
        )
        if not verdict.applies:
            if remembered:  # never refused on a known state: someone may have moved it since
                return self._apply_reply(reply)
            return self._drop_stale(reply, state, verdict, extra)
        if verdict is Fence.EARLIER_ATTEMPT:
            log.info(
                "sas.reply_of_earlier_attempt",
                extra={**extra, "current_attempt": state.attempt, "state": state.process_state},
            )
        now = self._clock.now()
        decision = decide_reply(
            state, reply, instance_id=self._instance_id, now=now, workflow=workflow
        )
        decision = replace(decision, state=self._then.claiming_alert(decision.state))
        if decision.then is Then.DISPATCH:
            routed = self._dispatcher.route(decision.state, workflow, now)
            then = Then.DISPATCH if routed.is_running else Then.DEFER
            decision = replace(decision, state=routed, then=then)
        # What the undo will need is kept in the transaction that makes the step count as
        # done: never one without the other.
        done = (
            StepRecord(
                order_id=reply.order_id,
                index=reply.step_index,
                name=reply.step,
                attempt=reply.attempt,
                completed_at=now,
                result=reply.result,
            )
            if reply.outcome == "ok" and reply.mode == "do"
            else None
        )
        history = HistoryEntry(
            order_id=reply.order_id,
            at=now,
            kind=decision.history_kind,
            attempt=reply.attempt,
            step=reply.step,
            mode=reply.mode,
            actor=self._instance_id,
            detail=reply.error
            or (
                f"applied at attempt {state.attempt} ({state.process_state})"
                if verdict is Fence.EARLIER_ATTEMPT
                else None
            ),
            endpoint=reply.endpoint,
        )
        entries = [history]
        if decision.then is Then.DISPATCH or (
            decision.then is Then.DEFER and reply.outcome != "deferred"
        ):  # the next step claimed (or deferred for want of room): on record, with its endpoint
            entries.append(
                self._dispatcher.claim_history(decision.state, workflow, self._instance_id)
            )
        try:
            etag = self._store.update_state(decision.state, current.etag, entries, step=done)
        except NotFound:
            if not remembered:
                raise
            raise ConcurrencyConflict(reply.order_id) from None  # gone since: read and decide
        self._recent.remember(decision.state, etag)
        log.info("sas.step_%s", decision.history_kind, extra=extra)
        progress: StatusKind | None = None
        if reply.outcome == "ok":
            progress = "step_undone" if reply.mode == "undo" else "step_completed"

        def announce_progress() -> None:  # best effort: Notifier.status never raises
            if progress is not None:
                self._then.notify.about(state, progress, now, step=reply.step)

        outcome = self._follow(decision, etag, workflow, announce_progress)
        self._moves.after_write(state, decision.state, now)  # after the next step is on its way
        return outcome

    def _follow(
        self,
        decision: ReplyDecision,
        etag: str,
        workflow: Workflow,
        announce_progress: Callable[[], None],
    ) -> ReplyOutcome:
        """The work that follows first (a step's deadline is already running), then the
        status events: a slow status queue must never spend a step's budget."""
        state = decision.state
        if decision.then is Then.FINISH:
            log.info(
                "sas.order_finished",
                extra={"order_id": state.order_id, "state": state.process_state},
            )
            announce_progress()
            self._then.finished(state, etag)
            return ReplyOutcome.FINISHED
        if decision.then is Then.DEFER:
            self._ask_again(state, state.updated_at)
            announce_progress()
            return ReplyOutcome.DEFERRED
        if decision.then is Then.COMPENSATE:
            log.warning("sas.compensation_started", extra={"order_id": state.order_id})
            self._then.compensate(state, reason="refused")
            announce_progress()
            self._then.notify.about(
                state, "compensating", state.updated_at, detail=state.last_error
            )
            return ReplyOutcome.COMPENSATING
        self._dispatcher.dispatch(state, workflow, etag)
        announce_progress()
        self._dispatcher.announce(state, workflow)
        return ReplyOutcome.ADVANCED

    def _ask_again(self, deferred: OrderState, now: datetime) -> None:
        """A deferred step: a Scheduler claims it again once its backoff is over."""
        wait = (deferred.not_before or now) - now
        log.info(
            "sas.step_deferred",
            extra={
                "order_id": deferred.order_id,
                "step_index": deferred.step_index,
                "deferrals": deferred.deferrals,
                "delay": wait.total_seconds(),
            },
        )
        self._then.request_schedule(deferred, delay_seconds=max(wait.total_seconds(), 0.0))

    def _park(self, queue: str, reason: str, message: Message) -> None:
        """Unroutable (its order does not exist): kept where an operator can see it."""
        self._store.park_message(queue, reason, encode(message), self._clock.now())

    def _drop_stale(
        self, reply: StepReply, state: OrderState, verdict: Fence, extra: dict[str, object]
    ) -> ReplyOutcome:
        """Fencing in action: recorded (for the ledger of what happened), never applied."""
        log.warning(
            "sas.reply_stale",
            extra={
                **extra,
                "fence": verdict.value,
                "current_attempt": state.attempt,
                "state": state.process_state,
            },
        )
        self._store.add_history(
            HistoryEntry(
                order_id=reply.order_id,
                at=self._clock.now(),
                kind="reply_dropped",
                attempt=reply.attempt,
                step=reply.step,
                mode=reply.mode,
                actor=self._instance_id,
                detail=f"{reply.outcome} {verdict.value}: current attempt {state.attempt}, "
                f"{state.process_state}",
            )
        )
        return ReplyOutcome.STALE


def _step_extra(state: OrderState, workflow: Workflow) -> dict[str, object]:
    return {
        "step": workflow.step(state.step_index).name,
        "attempt": state.attempt,
        "mode": state.mode,
        "complete_by": state.complete_by.isoformat() if state.complete_by else None,
    }

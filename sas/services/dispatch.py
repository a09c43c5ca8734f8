"""Routing and sending the step request of a claimed attempt: shared by the Submission (which
claims the first step itself) and the Scheduler (every later claim)."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sas.domain.carried import carry
from sas.domain.clock import Clock
from sas.domain.endpoints import DeferralPolicy
from sas.domain.errors import IllegalTransition
from sas.domain.messages import StepRequest
from sas.domain.model import HistoryEntry, OrderState
from sas.domain.transitions import DEFERRAL, defer, with_endpoint
from sas.domain.wire import idempotency_key, step_request_message_id
from sas.domain.workflow import Workflow
from sas.services.backlog import Backlog
from sas.services.consequences import Notifier
from sas.services.ports import StateStore, Transport
from sas.services.routes import Routes
from sas.services.routing import Router

log = logging.getLogger(__name__)

QUEUE_ALLOWANCE_BUDGETS = 4
"""The most a claimed step's deadline is lengthened for its queue's backlog, in step budgets."""


class Dispatcher:
    def __init__(
        self,
        store: StateStore,
        transport: Transport,
        routes: Routes,
        clock: Clock,
        router: Router | None = None,
        deferral: DeferralPolicy = DEFERRAL,
        *,
        queue_allowance: bool = False,
    ) -> None:
        """``queue_allowance``: a claimed step's deadline also covers the wait its request
        will have in its agent's lane (``route``)."""
        self._store = store
        self._transport = transport
        self._routes = routes
        self._clock = clock
        self._router = router
        self.deferral = deferral
        self._backlog = Backlog(transport, clock) if queue_allowance else None
        self._notify = Notifier(transport, routes)

    def route(self, claimed: OrderState, workflow: Workflow, now: datetime) -> OrderState:
        """A just-claimed state with its endpoint chosen (a retry's previous one first), or
        deferred (Pending for a backoff) when no endpoint of its service has room; its
        deadline lengthened by the queue allowance. Unchanged when no step runs."""
        if not claimed.is_running:
            return claimed
        step = workflow.step(claimed.step_index)
        routed = self._with_queue_allowance(claimed, step.budget, step.agent, now)
        if self._router is None:
            return routed
        chosen = self._router.choose(step.agent, prefer=claimed.endpoint)
        if chosen is not None:
            return with_endpoint(routed, chosen.name)
        delay = self.deferral.delay(claimed.deferrals + 1)
        return defer(claimed, now=now, delay=delay, workflow=workflow)

    def _with_queue_allowance(
        self, claimed: OrderState, budget: timedelta, agent: str, now: datetime
    ) -> OrderState:
        """Under a backlog a request waits in its agent's lane before any agent can start it,
        and its reply waits in the replies lane before a Scheduler applies it; a deadline that
        ran from the claim alone would expire steps that were done or never started, and each
        expiry adds a retry to the backlog. So the deadline also covers the waits this step can
        expect in both lanes (``Backlog.expected_wait``: a lane's oldest message's wait so far,
        stretched while its head moves on more slowly than time goes by), up to
        QUEUE_ALLOWANCE_BUDGETS budgets. Without a backlog it adds nothing."""
        if self._backlog is None or claimed.complete_by is None:
            return claimed
        request_lane = self._routes.agent(agent, claimed.priority)
        reply_lane = self._routes.lane(self._routes.replies, claimed.priority)
        wait = self._backlog.expected_wait((request_lane,), now) + self._backlog.expected_wait(
            (reply_lane,), now
        )
        if wait <= timedelta(0):
            return claimed
        allowance = min(wait, budget * QUEUE_ALLOWANCE_BUDGETS)
        return replace(claimed, complete_by=claimed.complete_by + allowance)

    @staticmethod
    def claim_history(state: OrderState, workflow: Workflow, actor: str) -> HistoryEntry:
        """The history row of a claim ``route`` decided: where the step went, or that it was
        deferred and until when."""
        step = workflow.step(state.step_index)
        deferred = not state.is_running
        return HistoryEntry(
            order_id=state.order_id,
            at=state.updated_at,
            kind="deferred" if deferred else "claimed",
            attempt=state.attempt,
            step=step.name,
            mode=state.mode,
            actor=actor,
            detail=(
                f"no endpoint of {step.agent} has room; asked again at "
                f"{state.not_before.isoformat() if state.not_before else '-'}"
                if deferred
                else None
            ),
            endpoint=state.endpoint,
        )

    def dispatch(self, state: OrderState, workflow: Workflow, etag: str | None = None) -> None:
        """Send the StepRequest for the state's current attempt (already persisted), and
        nothing else (``announce`` tells the submitter). ``etag``: what the write of ``state``
        returned; the request then carries both (sas/domain/carried.py).

        Reads nothing on a forward step: the state carries the order's details. An undo
        reads the completed step's record (what the undo needs); a state written before
        details were kept with it reads the order row."""
        step = workflow.step(state.step_index)
        if not state.is_running or state.complete_by is None:
            raise IllegalTransition(f"order {state.order_id} runs no step to dispatch")
        details = state.details
        if details is None:
            order = self._store.get_order(state.order_id)
            if order is None:
                raise IllegalTransition(f"order {state.order_id} cannot be dispatched")
            details = order.details
        payload = {"order_id": state.order_id, **details}
        action, key = step.action, idempotency_key(state.order_id, step.name, state.mode)
        if state.mode == "undo":
            if step.undo is None:
                raise IllegalTransition(f"step {step.name} has no undo action")
            done = {s.index: s for s in self._store.get_steps(state.order_id)}.get(state.step_index)
            payload |= {
                "original_action": step.action,
                "original_key": idempotency_key(state.order_id, step.name, "do"),
                "original_result": done.result if done else None,
            }
            action = step.undo
        request = StepRequest(
            order_id=state.order_id,
            step=step.name,
            step_index=state.step_index,
            attempt=state.attempt,
            mode=state.mode,
            action=action,
            complete_by=state.complete_by,
            idempotency_key=key,
            payload=payload,
            priority=state.priority,
            endpoint=state.endpoint,
            carried_state=None if etag is None else self._carry(state, etag),
        )
        self._transport.send(
            self._routes.agent(step.agent, state.priority),
            request,
            message_id=step_request_message_id(
                state.order_id, step.name, state.mode, state.attempt
            ),
            correlation_id=state.order_id,
        )

    def _carry(self, state: OrderState, etag: str) -> dict[str, Any] | None:
        """Never fails the dispatch: a request without it costs its reply one read."""
        try:
            return carry(state, etag, self._store.carry_key())
        except Exception:  # the store has logged why (once a minute at most)
            log.debug("sas.carry_skipped", exc_info=True)
            return None

    def announce(self, state: OrderState, workflow: Workflow) -> None:
        """The step's start, to a submitter that asked for every step: only after its request
        is sent, so a slow status queue never spends the step's budget."""
        if state.mode == "do":
            step = workflow.step(state.step_index).name
            self._notify.about(state, "step_started", self._clock.now(), step=step)

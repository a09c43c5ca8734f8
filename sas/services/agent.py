"""The Agent: one remote service call per step request, bounded by the complete-by time.

Retries transient faults with exponential backoff and jitter (honouring Retry-After), only
while the deadline allows. Past complete-by it stops and sends nothing:
another attempt may already be scheduled, and the Scheduler would drop the reply anyway.

An optional circuit breaker, shared by every instance of this agent, is asked before each try:
an open breaker refuses with a TransientRemoteError carrying the seconds until it may close, so
the same backoff waits for it and the same deadline check gives up in time.

With a router (sas/services/routing.py), the call goes to one of the service's endpoints: the
one the Scheduler chose if it is still healthy and has room, else another that has; each
endpoint has its own breaker. When none has room, nothing is called and a ``deferred`` reply
sends the step back to the Scheduler for a later attempt (no failure is counted).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential_jitter

from sas.domain.clock import Clock
from sas.domain.endpoints import Endpoint
from sas.domain.errors import PermanentRemoteError, TransientRemoteError
from sas.domain.messages import StepReply, StepRequest, result_problem
from sas.domain.wire import step_reply_message_id
from sas.domain.workflow import longest_step_budget
from sas.services import telemetry
from sas.services.breaker import CircuitBreaker
from sas.services.ports import RemoteService, Transport
from sas.services.routes import Routes
from sas.services.routing import Router

log = logging.getLogger(__name__)


class AgentOutcome(StrEnum):
    REPLIED = "replied"
    REFUSED = "refused"
    """The remote refused for good: an error reply was sent."""
    EXPIRED = "expired"
    """The request arrived past complete-by: dropped unread."""
    GAVE_UP = "gave_up"
    """Transient faults outlasted the deadline: nothing sent, the Supervisor will recover."""
    LATE = "late"
    """The call finished past complete-by: the reply was suppressed."""
    DEFERRED = "deferred"
    """No endpoint had room: nothing called, a deferred reply sent."""


_FAILED = frozenset({AgentOutcome.REFUSED, AgentOutcome.GAVE_UP, AgentOutcome.LATE})


class _DeadlineReached(Exception):
    pass


class _NoRoom(Exception):
    """No endpoint has room for the next try: the step is deferred, not failed."""


@dataclass
class _Route:
    """Where one attempt's tries go: the Scheduler's choice first; after a try fails
    transiently on an endpoint, another one if it has room."""

    prefer: str | None
    avoid: str | None = None
    held: Endpoint | None = None
    """Taken before the first try (to defer at once when nothing has room)."""
    used: Endpoint | None = None
    """The endpoint that answered (the reply says which)."""

    def take(self, router: Router | None, agent: str) -> Endpoint | None:
        if router is None:
            return None
        endpoint, self.held = self.held, None
        if endpoint is None:
            endpoint = router.acquire(agent, prefer=self.prefer, avoid=self.avoid)
        if endpoint is None:
            raise _NoRoom
        return endpoint


class AgentRunner:
    def __init__(
        self,
        agent: str,
        remote: RemoteService,
        transport: Transport,
        routes: Routes,
        clock: Clock,
        *,
        sleep: Callable[[float], None] = time.sleep,
        max_call_seconds: float = 10.0,
        safety_margin: timedelta = timedelta(milliseconds=250),
        breaker: CircuitBreaker | None = None,
        router: Router | None = None,
        breaker_for: Callable[[Endpoint], CircuitBreaker] | None = None,
    ) -> None:
        self._agent = agent
        self._remote = remote
        self._transport = transport
        self._routes = routes
        self._clock = clock
        self._sleep = sleep
        self._max_call_seconds = max_call_seconds
        self._margin = safety_margin
        self._breaker = breaker
        self._router = router
        self._breaker_for = breaker_for
        self._backoff = wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2)

    def handle(self, request: StepRequest) -> AgentOutcome:
        started = time.monotonic()
        with telemetry.order_span(
            telemetry.AGENT,
            request.order_id,
            step=request.step,
            attempt=request.attempt,
            mode=request.mode,
            priority=request.priority,
            endpoint=request.endpoint,
        ) as span:
            outcome = self._handle(request)
            telemetry.annotate(span, outcome=outcome.value)
            if outcome in _FAILED:
                telemetry.fail(span, outcome.value)
        telemetry.instruments.step_duration.record(
            time.monotonic() - started,
            {
                telemetry.STEP: request.step,
                telemetry.MODE: request.mode,
                telemetry.OUTCOME: outcome.value,
            },
        )
        return outcome

    def _handle(self, request: StepRequest) -> AgentOutcome:
        extra = {"order_id": request.order_id, "step": request.step, "attempt": request.attempt}
        if self._clock.now() >= request.complete_by:
            log.info("sas.step_request_expired", extra=extra)
            return AgentOutcome.EXPIRED
        route = _Route(prefer=request.endpoint)
        if self._router is not None:
            route.held = self._router.acquire(self._agent, prefer=request.endpoint)
            if route.held is None:
                return self._send_reply(request, extra, outcome="deferred")
        try:
            result = self._call_with_retries(request, route)
        except PermanentRemoteError as exc:
            return self._reply(request, extra, route.used, error=exc.reason)
        except (TransientRemoteError, _DeadlineReached):
            log.warning("sas.agent_gave_up", extra=extra)
            return AgentOutcome.GAVE_UP
        except _NoRoom:  # after a failed try, every endpoint filled up: defer, not fail
            if self._clock.now() >= request.complete_by:
                log.warning("sas.step_reply_suppressed_late", extra=extra)
                return AgentOutcome.LATE
            return self._send_reply(request, extra, outcome="deferred")
        finally:
            if self._router is not None and route.held is not None:
                self._router.release(route.held)  # taken for a try that never ran
        return self._reply(request, extra, route.used, result=result)

    def _reply(
        self,
        request: StepRequest,
        extra: dict[str, object],
        endpoint: Endpoint | None,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> AgentOutcome:
        if self._clock.now() >= request.complete_by:
            log.warning("sas.step_reply_suppressed_late", extra=extra)
            return AgentOutcome.LATE
        return self._send_reply(
            request,
            extra,
            outcome="ok" if error is None else "error",
            endpoint=endpoint,
            result=result,
            error=error,
        )

    def _send_reply(
        self,
        request: StepRequest,
        extra: dict[str, object],
        *,
        outcome: Literal["ok", "error", "deferred"],
        endpoint: Endpoint | None = None,
        result: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> AgentOutcome:
        reply = StepReply(
            order_id=request.order_id,
            step=request.step,
            step_index=request.step_index,
            attempt=request.attempt,
            mode=request.mode,
            outcome=outcome,
            result=_usable_result(result or {}, extra),
            error=None if error is None else _printable(error),
            endpoint=None if endpoint is None else endpoint.name,
            carried_state=request.carried_state,
        )
        self._transport.send(
            self._routes.lane(self._routes.replies, request.priority),
            reply,
            message_id=step_reply_message_id(
                request.order_id, request.step, request.mode, request.attempt
            ),
            correlation_id=request.order_id,
        )
        if outcome == "deferred":
            log.info("sas.step_deferred_no_room", extra=extra)
            return AgentOutcome.DEFERRED
        if error is None:
            log.info("sas.step_replied", extra=extra)
            return AgentOutcome.REPLIED
        log.warning("sas.step_refused", extra={**extra, "reason": error[:200]})
        return AgentOutcome.REFUSED

    def _call_with_retries(self, request: StepRequest, route: _Route) -> dict[str, Any]:
        deadline = (
            min(request.complete_by, self._clock.now() + longest_step_budget()) - self._margin
        )
        extra = {"order_id": request.order_id, "step": request.step, "attempt": request.attempt}
        router = self._router
        alternatives = router is not None and len(router.endpoints(self._agent)) > 1

        def call() -> dict[str, Any]:
            if self._clock.now() >= deadline:
                raise _DeadlineReached
            endpoint = route.take(router, self._agent)
            try:
                return attempt(endpoint)
            except TransientRemoteError as exc:
                if endpoint is None or not alternatives:
                    raise
                # Fail over: the next try goes to another endpoint if one has room, without
                # waiting for this one's breaker (the ledger is shared: no effect twice).
                route.avoid, route.prefer = endpoint.name, None
                raise TransientRemoteError(exc.reason) from None
            finally:
                if router is not None and endpoint is not None:
                    router.release(endpoint)

        def attempt(endpoint: Endpoint | None) -> dict[str, Any]:
            breaker = self._breaker
            if endpoint is not None and self._breaker_for is not None:
                breaker = self._breaker_for(endpoint)
            if breaker is not None:
                breaker.before_call()  # an open circuit raises TransientRemoteError(retry_after)
            remaining = (deadline - self._clock.now()).total_seconds()
            if remaining <= 0:
                raise _DeadlineReached
            try:
                with telemetry.child_span(
                    telemetry.REMOTE_CALL,
                    action=request.action,
                    endpoint=None if endpoint is None else endpoint.name,
                ):
                    result = self._remote.perform(
                        self._agent if endpoint is None else endpoint.target,
                        request.action,
                        idempotency_key=request.idempotency_key,
                        payload=request.payload,
                        timeout=min(remaining, self._max_call_seconds),
                    )
            except TransientRemoteError:
                if breaker is not None:
                    breaker.record_failure()
                raise
            except PermanentRemoteError:
                route.used = endpoint
                if breaker is not None:
                    breaker.record_success()  # the service answered: it is up
                raise
            route.used = endpoint
            if breaker is not None:
                breaker.record_success()
            return result

        def wait(state: RetryCallState) -> float:
            backoff = self._backoff(state)
            exc = state.outcome.exception() if state.outcome else None
            hinted = exc.retry_after if isinstance(exc, TransientRemoteError) else None
            return max(backoff, hinted or 0.0)

        def stop(state: RetryCallState) -> bool:
            return _would_pass(self._clock.now(), state.upcoming_sleep, deadline)

        def before_sleep(state: RetryCallState) -> None:
            telemetry.instruments.retries.add(
                1, {"sas.kind": "remote", telemetry.STEP: request.step}
            )
            log.info(
                "sas.remote_retry",
                extra={**extra, "try": state.attempt_number, "sleep": state.upcoming_sleep},
            )

        retrying = Retrying(
            retry=retry_if_exception_type(TransientRemoteError),
            wait=wait,
            stop=stop,
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        result: dict[str, Any] = retrying(call)
        return result


def _usable_result(result: dict[str, Any], extra: dict[str, object]) -> dict[str, Any]:
    """The remote's answer if a reply can carry it and the step record keep it; else a
    stand-in that says why (a reply that could not be sent or parsed would lose the step)."""
    problem = result_problem(result)
    if problem is None:
        return result
    log.warning("sas.remote_result_unusable", extra={**extra, "problem": problem})
    return {"truncated": True, "reason": problem}


def _printable(reason: str) -> str:
    """A refusal's reason as text any message can carry (a lone surrogate cannot)."""
    return reason.encode("utf-8", "replace").decode("utf-8")[:1000]


def _would_pass(now: datetime, sleep_seconds: float, deadline: datetime) -> bool:
    # In seconds, not datetimes: an absurd wait must stop the retries, not overflow.
    return sleep_seconds >= (deadline - now).total_seconds()

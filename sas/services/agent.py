"""The Agent: one remote service call per step request, bounded by the step's budget.

It records the attempt's start first (``StepStart``) unless the claim's deadline still leaves
a whole budget (``transitions.START_SLACK``): the budget runs from the start, however long the
request waited in its queue, and the Supervisor holds off while it runs; an attempt the
Supervisor gave up first (the same row, ``abandoned``) runs nothing. Retries transient
faults with exponential backoff and jitter (honouring Retry-After), only while the budget
allows. Past it, it stops and sends nothing: the Supervisor will schedule another attempt.
Every attempt calls with the step's one idempotency key, so the remote applies the effect once
whichever attempt's call gets through.

A circuit breaker per remote target, shared by every agent instance, is asked before each try
and told how it ended: a transient fault as the remote's failure, unless the fault is the
order's own (``TransientRemoteError.order_scoped``), which counts as the remote answering.
If a target with one endpoint has it open before the attempt has called anything, the step is
deferred (a ``deferred`` reply carrying the seconds until the circuit may close): other orders'
failures opened it, so it costs this one no failure and no wait for its deadline. Once a call
was made, an open circuit is one more transient fault: the backoff waits for it and the
deadline check gives up in time. With several endpoints
(sas/services/routing.py) each try goes to one with room, the healthy ones first; a try that
fails transiently moves the next one elsewhere; when none has room, nothing is called and a
``deferred`` reply sends the step back to the Scheduler for a later attempt (no failure counted).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential_jitter

from sas.domain.endpoints import Endpoint
from sas.domain.errors import PermanentRemoteError, TransientRemoteError
from sas.domain.messages import MAX_RETRY_AFTER_SECONDS, StepReply, StepRequest, result_problem
from sas.domain.model import StepStart
from sas.domain.wire import step_reply_message_id, step_request_message_id
from sas.services import metrics, telemetry, versions
from sas.services.actions import ActionContext, run_action
from sas.services.context import Agents, Context

log = logging.getLogger(__name__)

BACKOFF = wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2)


class AgentOutcome(StrEnum):
    REPLIED = "replied"
    REFUSED = "refused"
    """The remote refused for good: an error reply was sent."""
    EXPIRED = "expired"
    """Given up by the Supervisor before any start, or delivered again past its first start's
    budget (sent before starts were recorded: past complete-by): dropped unread."""
    GAVE_UP = "gave_up"
    """Transient faults outlasted the deadline: nothing sent, the Supervisor will recover."""
    LATE = "late"
    """The call finished past its start's budget (``run_by``): the reply was suppressed."""
    DEFERRED = "deferred"
    """No endpoint had room, or the circuit was open: nothing called, a deferred reply sent."""
    HELD = "held"
    """The Python action is not deployed here (a newer version's): left for a host with it."""


_FAILED = frozenset({AgentOutcome.REFUSED, AgentOutcome.GAVE_UP, AgentOutcome.LATE})


class _DeadlineReached(Exception):
    pass


class _NoRoom(Exception):
    """No endpoint has room for the next try: the step is deferred, not failed."""


class _CircuitOpen(TransientRemoteError):
    """The breaker refused the try: nothing was called."""


class _Refused(Exception):
    """The breaker refused the attempt before it called anything: the step is deferred."""

    def __init__(self, retry_after: float | None) -> None:
        super().__init__(retry_after)
        self.retry_after = retry_after


@dataclass
class _Attempt:
    """One step request's tries: where they go, and what answered."""

    agent: str
    request: StepRequest
    deadline: datetime
    """``run_by`` less the safety margin, and never further than the longest budget."""
    run_by: datetime
    """When the attempt must have answered: its start plus the step's budget."""
    avoid: str | None = None
    """The endpoint whose try just failed transiently: the next one goes elsewhere."""
    used: Endpoint | None = None
    """The endpoint that answered (the reply says which)."""
    called: bool = False
    """Whether any try reached the action (a remote call, or the app's Python function)."""


def run_step(ctx: Context, agent: str, request: StepRequest) -> AgentOutcome:
    started = time.monotonic()
    with telemetry.order_span(
        telemetry.AGENT,
        request.order_id,
        step=request.step,
        attempt=request.attempt,
        mode=request.mode,
        priority=request.priority,
    ) as span:
        outcome = _run(ctx, agent, request)
        telemetry.annotate(span, outcome=outcome.value)
        if outcome in _FAILED:
            telemetry.fail(span, outcome.value)
    metrics.instruments.step_duration.record(
        time.monotonic() - started,
        {
            telemetry.STEP: request.step,
            telemetry.MODE: request.mode,
            telemetry.OUTCOME: outcome.value,
        },
    )
    return outcome


def _run(ctx: Context, agent: str, request: StepRequest) -> AgentOutcome:
    assert ctx.agents is not None, "a process that runs agents is given their remote"  # noqa: S101
    extra = {"order_id": request.order_id, "step": request.step, "attempt": request.attempt}
    now = ctx.clock.now()
    if request.budget is None and now >= request.complete_by:
        log.info("sas.step_request_expired", extra=extra)  # sent before starts were recorded
        return AgentOutcome.EXPIRED
    python = ctx.agents.python.get(agent)
    if python is not None and request.action not in python.actions:
        # An action of a newer version than this host has (a deploy in progress): a host that
        # has it runs it, while the Supervisor still waits for it. Any other step runs
        # whatever its version.
        queue = ctx.routes.agent(agent, request.priority)
        message_id = step_request_message_id(request.idempotency_key, request.attempt)
        why = f"{agent} has no action {request.action} here"
        within = request.complete_by + ctx.policy.queue_wait_limit - now
        versions.hold(ctx, queue, request, message_id, why, within=within)
        return AgentOutcome.HELD
    started = _start(ctx, request, now)
    if started.abandoned or now >= started.run_by:
        # Given up by the Supervisor before any start, or delivered again after its first
        # start's budget: either way that attempt is over, and may have been undone.
        log.info("sas.step_request_expired", extra=extra)
        return AgentOutcome.EXPIRED
    run_by = started.run_by
    deadline = min(run_by, now + ctx.workflows.longest_step_budget) - ctx.agents.safety_margin
    attempt = _Attempt(agent, request, deadline, run_by)
    try:
        result = _call_with_retries(ctx, ctx.agents, attempt)
    except PermanentRemoteError as exc:
        return _reply(ctx, attempt, "error", error=exc.reason)
    except (TransientRemoteError, _DeadlineReached):
        log.warning("sas.agent_gave_up", extra=extra)
        return AgentOutcome.GAVE_UP
    except _NoRoom:
        return _reply(ctx, attempt, "deferred")
    except _Refused as refused:
        return _reply(ctx, attempt, "deferred", retry_after=refused.retry_after)
    return _reply(ctx, attempt, "ok", result=result)


def _start(ctx: Context, request: StepRequest, now: datetime) -> StepStart:
    """Record that this attempt started; its budget runs from its first start. Returns the
    attempt's row as its first writer left it: this start, an earlier one, or a Supervisor's
    abandonment (then nothing may run). The insert decides, not a clock: a Supervisor gives an
    unstarted attempt up by inserting the same row (``supervisor._queue_wait``), only once the
    claim's deadline has passed, when no agent can start within its slack. Time the request
    spent queued is not the step's."""
    budget = timedelta(seconds=request.budget or 0)
    start = StepStart(
        order_id=request.order_id,
        key=request.idempotency_key,
        attempt=request.attempt,
        started_at=now,
        run_by=now + min(budget, ctx.workflows.longest_step_budget),
        instance=ctx.instance_id,
    )
    if request.budget is None or start.run_by <= request.complete_by:
        # The claim's deadline leaves a whole budget (started within its slack, or sent before
        # starts were recorded): the Supervisor waits that long anyway, so nothing is written.
        return replace(start, run_by=request.complete_by)
    return ctx.store.record_start(start)


def _call_with_retries(ctx: Context, agents: Agents, attempt: _Attempt) -> dict[str, Any]:
    request = attempt.request
    extra = {"order_id": request.order_id, "step": request.step, "attempt": request.attempt}

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        hinted = exc.retry_after if isinstance(exc, TransientRemoteError) else None
        return max(BACKOFF(state), hinted or 0.0)

    def stop(state: RetryCallState) -> bool:
        # In seconds, not datetimes: an absurd wait must stop the retries, not overflow.
        left = (attempt.deadline - ctx.clock.now()).total_seconds()
        return state.upcoming_sleep >= left

    def before_sleep(state: RetryCallState) -> None:
        metrics.instruments.retries.add(1, {"sas.kind": "remote", telemetry.STEP: request.step})
        log.info(
            "sas.remote_retry",
            extra={**extra, "try": state.attempt_number, "sleep": state.upcoming_sleep},
        )

    retrying = Retrying(
        retry=retry_if_exception_type(TransientRemoteError),
        wait=wait,
        stop=stop,
        sleep=agents.sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    result: dict[str, Any] = retrying(_try_once, ctx, agents, attempt)
    return result


def _try_once(ctx: Context, agents: Agents, attempt: _Attempt) -> dict[str, Any]:
    """One try, on an endpoint with room (when the service has several)."""
    if ctx.clock.now() >= attempt.deadline:
        raise _DeadlineReached
    endpoint = None
    if agents.router is not None and attempt.agent not in agents.python:  # HTTP agents only
        endpoint = agents.router.acquire(attempt.agent, avoid=attempt.avoid)
        if endpoint is None:
            raise _NoRoom
    try:
        return _call(ctx, agents, attempt, endpoint)
    except TransientRemoteError as exc:
        if endpoint is None or len(agents.endpoints(attempt.agent)) < 2:
            if isinstance(exc, _CircuitOpen) and not attempt.called:
                raise _Refused(exc.retry_after) from None
            raise
        # Fail over: the next try goes to another endpoint if one has room, without waiting
        # for this one's breaker (endpoints share the provider's ledger: no effect twice).
        attempt.avoid = endpoint.name
        raise TransientRemoteError(exc.reason) from None
    finally:
        if agents.router is not None and endpoint is not None:
            agents.router.release(endpoint)


def _call(
    ctx: Context, agents: Agents, attempt: _Attempt, endpoint: Endpoint | None
) -> dict[str, Any]:
    request = attempt.request
    target = attempt.agent if endpoint is None else endpoint.target
    breaker = agents.breaker_of(target)
    if breaker is not None:
        try:
            breaker.before_call()
        except TransientRemoteError as refused:  # open: no call now
            raise _CircuitOpen(refused.reason, refused.retry_after) from None
    remaining = (attempt.deadline - ctx.clock.now()).total_seconds()
    if remaining <= 0:
        raise _DeadlineReached
    attempt.called = True
    try:
        with telemetry.child_span(
            telemetry.REMOTE_CALL,
            action=request.action,
            endpoint=None if endpoint is None else endpoint.name,
        ):
            result = _perform(ctx, agents, attempt, target, min(remaining, agents.max_call_seconds))
    except TransientRemoteError as exc:
        if breaker is not None and exc.order_scoped:
            breaker.record_success()  # the service answered: the fault is the order's
        elif breaker is not None:
            breaker.record_failure()
        raise
    except PermanentRemoteError:
        attempt.used = endpoint
        if breaker is not None:
            breaker.record_success()  # the service answered: it is up
        raise
    attempt.used = endpoint
    if breaker is not None:
        breaker.record_success()
    return result


def _perform(
    ctx: Context, agents: Agents, attempt: _Attempt, target: str, timeout: float
) -> dict[str, Any]:
    """The step's action: the app's Python function, or a call to the remote service."""
    request = attempt.request
    python = agents.python.get(attempt.agent)
    if python is None:
        return agents.remote.perform(
            target,
            request.action,
            idempotency_key=request.idempotency_key,
            payload=request.payload,
            timeout=timeout,
        )
    context = ActionContext(
        order_id=request.order_id,
        agent=attempt.agent,
        step=request.step,
        action=request.action,
        mode=request.mode,
        attempt=request.attempt,
        idempotency_key=request.idempotency_key,
        deadline=attempt.deadline,
        clock=ctx.clock,
        settings={key: agents.settings[key] for key in python.settings if key in agents.settings},
    )
    return run_action(python, context, dict(request.payload))


def _reply(
    ctx: Context,
    attempt: _Attempt,
    outcome: Literal["ok", "error", "deferred"],
    *,
    result: dict[str, Any] | None = None,
    error: str | None = None,
    retry_after: float | None = None,
) -> AgentOutcome:
    request = attempt.request
    extra = {"order_id": request.order_id, "step": request.step, "attempt": request.attempt}
    if ctx.clock.now() >= attempt.run_by:
        log.warning("sas.step_reply_suppressed_late", extra=extra)
        return AgentOutcome.LATE
    reply = StepReply(
        order_id=request.order_id,
        step=request.step,
        step_index=request.step_index,
        attempt=request.attempt,
        mode=request.mode,
        outcome=outcome,
        result=_usable_result(result or {}, extra),
        error=None if error is None else _printable(error),
        endpoint=None if attempt.used is None else attempt.used.name,
        incarnation=request.incarnation,
        retry_after=None if retry_after is None else min(retry_after, MAX_RETRY_AFTER_SECONDS),
    )
    ctx.transport.send(
        ctx.routes.lane(ctx.routes.replies, request.priority),
        reply,
        message_id=step_reply_message_id(request.idempotency_key, request.attempt),
        correlation_id=request.order_id,
    )
    if outcome == "deferred":
        event = "sas.step_deferred_no_room" if retry_after is None else "sas.step_deferred_open"
        log.info(event, extra=extra)
        return AgentOutcome.DEFERRED
    if error is None:
        log.info("sas.step_replied", extra=extra)
        return AgentOutcome.REPLIED
    log.warning("sas.step_refused", extra={**extra, "reason": error[:200]})
    return AgentOutcome.REFUSED


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

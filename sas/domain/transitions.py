"""Legal transitions of an order's state, as pure functions (no I/O, no clock).

Each returns the next state or raises IllegalTransition; the caller persists the result with
a write conditional on the ETag it read, so of two concurrent transitions one loses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sas.domain.clock import readable
from sas.domain.endpoints import DeferralPolicy
from sas.domain.errors import IllegalTransition, StaleReply
from sas.domain.messages import ReplyKind, StepReply
from sas.domain.model import OrderState, ProcessState
from sas.domain.wire import DEFAULT_PRIORITY, Mode, Priority, StatusLevel
from sas.domain.workflow import START_SLACK, Workflow

MAX_ERROR_LENGTH = 1000
DEFERRAL = DeferralPolicy()


class NotYet(IllegalTransition):
    """The order is in a retry backoff: not claimable before ``not_before``."""


def initial_state(
    order_id: str,
    workflow: Workflow,
    *,
    reply_to: str | None,
    now: datetime,
    details: Mapping[str, Any] | None = None,
    status_events: StatusLevel = "outcome",
    priority: Priority = DEFAULT_PRIORITY,
    incarnation: str = "",
) -> OrderState:
    """Pending, unlocked, attempt 0, with a pickup deadline; bound to ``workflow``'s version."""
    return OrderState(
        order_id=order_id,
        workflow=workflow.name,
        version=workflow.version,
        definition=workflow.fingerprint,
        incarnation=incarnation,
        step=workflow.step(0).name,
        first_attempt=1,
        process_state=ProcessState.PENDING,
        submitted_at=now,
        updated_at=now,
        complete_by=now + workflow.pickup_budget,
        reply_to=reply_to,
        status_events=status_events,
        details=details or {},
        priority=priority,
    )


def look_again_at(state: OrderState, *, now: datetime, workflow: Workflow) -> datetime:
    """When the Supervisor must look at this order next (its in-flight marker's ``due_at``).

    The earlier of the order's own deadline and ``now`` + the workflow's shortest budget: any
    transition made after ``now`` sets a deadline at least that far from its own time, so the
    marker is due no later than any deadline the order can have until it is looked at again.
    By another instance's clock that transition's time may read up to the skew allowance
    earlier, but the Supervisor judges a deadline only that much after it passed, so the bound
    still holds. A terminal order is due now: its marker is to be dropped."""
    horizon = now + workflow.shortest_budget
    if state.is_terminal:
        return now
    if state.complete_by is None:
        return horizon
    return min(state.complete_by, horizon)


def claim(state: OrderState, *, instance_id: str, now: datetime, workflow: Workflow) -> OrderState:
    """A Scheduler takes a Pending, unlocked order: lock, next attempt, deadline, running."""
    if state.process_state is not ProcessState.PENDING or state.locked_by is not None:
        raise IllegalTransition(
            f"order {state.order_id} is {state.process_state} locked by {state.locked_by!r}"
        )
    if state.suspended:
        raise IllegalTransition(f"order {state.order_id} is suspended")
    if state.cancelled is not None and state.mode == "do":
        raise IllegalTransition(f"order {state.order_id} is cancelled: no step goes forward")
    if state.not_before is not None and now < state.not_before:
        raise NotYet(f"order {state.order_id} backs off until {readable(state.not_before)}")
    return _start(
        state, state.step_index, state.mode, instance_id=instance_id, now=now, workflow=workflow
    )


class Fence(StrEnum):
    """Whether a reply may move the order: the one decision of fencing."""

    CURRENT = "current"
    """The running attempt's reply: apply it."""
    EARLIER_ATTEMPT = "earlier_attempt"
    """An ``ok`` from an attempt that is no longer running, of the step and direction the order
    still waits on: apply it (every attempt used the step's one idempotency key)."""
    NOT_RUNNING = "not_running"
    """The order is finished, or waits for a retry and the reply is not an ``ok``."""
    OTHER_ATTEMPT = "other_attempt"
    """A refusal or deferral of an earlier attempt, or an attempt above the current one, which
    nobody claimed (forged)."""
    OTHER_STEP = "other_step"
    """Not the step, or not the direction (do/undo), the order waits on; or an attempt made
    before this step (in this direction) was first claimed, which was another step's."""
    OTHER_INCARNATION = "other_incarnation"
    """A reply to an earlier submission of the same order id (purged since)."""
    UNKNOWN_STEP = "unknown_step"
    """The workflow has no such step: index out of range or name not at that index."""

    @property
    def applies(self) -> bool:
        return self in (Fence.CURRENT, Fence.EARLIER_ATTEMPT)


def fence(
    state: OrderState,
    workflow: Workflow,
    *,
    step_index: int,
    step: str,
    attempt: int,
    mode: Mode,
    outcome: ReplyKind = "ok",
    incarnation: str = "",
) -> Fence:
    """The reply rule: a step's ``ok`` applies while the order still waits on that step and
    direction, whatever attempt sent it; a refusal or deferral only for the running attempt.

    Every attempt of a step calls the remote with the same idempotency key, so the remote
    applied the step's effect once, whichever attempt's call did it: an ``ok`` that arrives
    after its attempt expired (a reply delayed in a backlog) still says the step is done, and
    once it is applied the other attempts' replies are the stale ones (the order moved on).
    A refusal applied nothing and a deferral called nothing, so they speak only for their own
    attempt: a later attempt may still succeed. The attempt stays the fencing token: a reply
    can never move an order that left the step (compensating, finished) or came back to it,
    nor claim an attempt nobody made, nor one that was made for another step.
    ``workflow`` is the version the order is bound to."""
    if incarnation != state.incarnation:
        return Fence.OTHER_INCARNATION
    if not 0 <= step_index < len(workflow.steps) or workflow.steps[step_index].name != step:
        return Fence.UNKNOWN_STEP
    if state.is_terminal:
        return Fence.NOT_RUNNING
    if state.step_index != step_index or state.mode != mode or attempt < state.first_attempt:
        return Fence.OTHER_STEP
    if attempt > state.attempt:
        return Fence.OTHER_ATTEMPT
    if state.is_running and attempt == state.attempt:
        return Fence.CURRENT
    if outcome == "ok":
        return Fence.EARLIER_ATTEMPT
    return Fence.NOT_RUNNING if not state.is_running else Fence.OTHER_ATTEMPT


def check_reply(
    state: OrderState,
    workflow: Workflow,
    *,
    attempt: int,
    step_index: int,
    mode: Mode = "do",
    outcome: ReplyKind = "ok",
    incarnation: str | None = None,
) -> None:
    """Precondition of the reply transitions: StaleReply unless ``fence`` lets it apply.

    Callers decide with ``fence`` first; this guards the transitions against misuse."""
    in_range = 0 <= step_index < len(workflow.steps)
    step = workflow.steps[step_index].name if in_range else ""
    verdict = fence(
        state,
        workflow,
        step_index=step_index,
        step=step,
        attempt=attempt,
        mode=mode,
        outcome=outcome,
        incarnation=state.incarnation if incarnation is None else incarnation,
    )
    if not verdict.applies:
        raise StaleReply(
            f"{outcome} reply for attempt {attempt} step {step_index} ({mode}); order "
            f"{state.order_id} is {state.process_state} at attempt {state.attempt} step "
            f"{state.step_index} ({state.mode})"
        )


class Then(StrEnum):
    """What must happen after a reply's transition is persisted."""

    DISPATCH = "dispatch"
    """The next step (or undo) is claimed already: send its request to its agent."""
    COMPENSATE = "compensate"
    """Compensation is queued (Pending, undo): ask a Scheduler to claim its first undo."""
    FINISH = "finish"
    """The order is terminal: status to the submitter, the alert an Error owes."""
    DEFER = "defer"
    """The step waits for an endpoint with room: ask a Scheduler again after ``not_before``."""
    HOLD = "hold"
    """The order is suspended: nothing is asked for until it is resumed."""
    SCHEDULE = "schedule"
    """A skipped step: the next one waits (Pending, do) for a Scheduler to claim it."""


@dataclass(frozen=True)
class ReplyDecision:
    """A current reply, decided: the state to persist, its history kind, and what follows."""

    state: OrderState
    then: Then
    history_kind: str
    """``completed``, ``undone`` or ``refused``."""
    skipped: bool = False
    """The refusal skipped its step (``on_failure="continue"``): whether the order goes on,
    waits for a resume or ended Processed, its submitter is told."""


def decide_reply(
    state: OrderState,
    reply: StepReply,
    *,
    instance_id: str,
    now: datetime,
    workflow: Workflow,
    deferral: DeferralPolicy = DEFERRAL,
) -> ReplyDecision:
    """Apply a reply that ``fence`` found current (StaleReply otherwise)."""
    if reply.outcome == "deferred":
        check_reply(
            state,
            workflow,
            attempt=reply.attempt,
            step_index=reply.step_index,
            mode=reply.mode,
            outcome="deferred",
            incarnation=reply.incarnation or "",
        )
        deferred = defer(
            state,
            now=now,
            delay=deferral.delay(state.deferrals + 1, at_least=reply.retry_after),
            workflow=workflow,
        )
        moved = deferred.is_terminal or deferred.mode != state.mode or deferred.suspended
        return ReplyDecision(deferred, _then(deferred) if moved else Then.DEFER, "deferred")
    if reply.outcome == "error":
        reason = f"{reply.step} ({reply.mode}): {reply.error or 'remote refused'}"
        next_state = refuse_step(
            state,
            attempt=reply.attempt,
            step_index=reply.step_index,
            mode=reply.mode,
            now=now,
            reason=reason,
            workflow=workflow,
        )
        skipped = skips(state, workflow, step_index=reply.step_index, mode=reply.mode)
        return ReplyDecision(next_state, _then(next_state), "refused", skipped=skipped)
    next_state = _completed(state, reply, instance_id=instance_id, now=now, workflow=workflow)
    kind = "undone" if reply.mode == "undo" else "completed"
    return ReplyDecision(next_state, _then(next_state), kind)


def _completed(
    state: OrderState, reply: StepReply, *, instance_id: str, now: datetime, workflow: Workflow
) -> OrderState:
    """An ``ok`` reply applied; a forward step's result kept for the steps after it."""
    next_state = complete_step(
        state,
        attempt=reply.attempt,
        step_index=reply.step_index,
        mode=reply.mode,
        instance_id=instance_id,
        now=now,
        workflow=workflow,
    )
    if reply.mode == "undo":
        return next_state
    return replace(next_state, results={**state.results, reply.step: reply.result})


def defer(state: OrderState, *, now: datetime, delay: timedelta, workflow: Workflow) -> OrderState:
    """A claimed step that no endpoint can take now goes back to Pending for ``delay``.

    Nothing was called, so it is no failure: the failure count stays, the deferral count
    grows (it sets the next delay). The attempt it was claimed with is never sent again: the
    next claim takes a new one. A cancelled order is undone instead (from this step: an
    earlier attempt of it may have been applied); a suspended one waits with no deadline."""
    if not state.is_running:
        raise IllegalTransition(f"order {state.order_id} runs no step to defer")
    if state.cancelled is not None and state.mode == "do":
        return begin_compensation(
            state, from_index=state.step_index, now=now, workflow=workflow, reason=state.cancelled
        )
    if state.suspended:
        return replace(hold(state, now=now, workflow=workflow), deferrals=state.deferrals + 1)
    return replace(
        state,
        process_state=ProcessState.PENDING,
        locked_by=None,
        not_before=now + delay,
        complete_by=now + delay + workflow.pickup_budget,
        deferrals=state.deferrals + 1,
        updated_at=now,
        waiting=None,
    )


def _then(state: OrderState) -> Then:
    # After a current reply the only ways back to Pending are begin_compensation, a skipped
    # step and a hold.
    if state.is_terminal:
        return Then.FINISH
    if state.suspended and state.process_state is ProcessState.PENDING:
        return Then.HOLD
    if state.process_state is ProcessState.PENDING:
        return Then.COMPENSATE if state.mode == "undo" else Then.SCHEDULE
    return Then.DISPATCH


def complete_step(
    state: OrderState,
    *,
    attempt: int,
    step_index: int,
    instance_id: str,
    now: datetime,
    workflow: Workflow,
    mode: Mode = "do",
) -> OrderState:
    """The current step (or undo) succeeded: claim the next one at once, or finish.

    A cancelled order undoes from this step down instead of going on; a suspended one holds
    the next step unclaimed until it is resumed."""
    check_reply(state, workflow, attempt=attempt, step_index=step_index, mode=mode)
    if mode == "undo":
        following = workflow.next_undo(step_index - 1)
        if following is None:
            return _finish(state, _undone(state), now, last_error=state.last_error)
        if state.suspended:
            return _held(state, following, "undo", now=now, workflow=workflow)
        return _start(state, following, "undo", instance_id=instance_id, now=now, workflow=workflow)
    if state.cancelled is not None:
        return begin_compensation(
            state, from_index=step_index, now=now, workflow=workflow, reason=state.cancelled
        )
    if step_index + 1 < len(workflow.steps):
        if state.suspended:
            return _held(state, step_index + 1, "do", now=now, workflow=workflow)
        return _start(
            state, step_index + 1, "do", instance_id=instance_id, now=now, workflow=workflow
        )
    return _finish(state, ProcessState.PROCESSED, now, last_error=None)


def refuse_step(
    state: OrderState,
    *,
    attempt: int,
    step_index: int,
    now: datetime,
    reason: str,
    workflow: Workflow,
    mode: Mode = "do",
) -> OrderState:
    """The remote refused for good (non-transient): compensate or stop in Error.

    The refusing attempt had no effect, so compensation starts below the step, unless an
    earlier attempt of the step was claimed: its call may still have been applied (a refusal
    can answer a retry that overlapped it), so the undo starts at the step itself, which
    undoes nothing if nothing was applied. Whether one was is the attempt, not the failure
    count, which a resubmit, a suspension's held expiry or the load's spared one leave at 0.
    A refused undo cannot be retried into success: an operator must look.
    """
    check_reply(state, workflow, attempt=attempt, step_index=step_index, mode=mode, outcome="error")
    if skips(state, workflow, step_index=step_index, mode=mode):
        return skip_step(state, now=now, workflow=workflow, reason=reason)
    if mode == "do" and (
        workflow.failure_policy(step_index) == "compensate" or state.cancelled is not None
    ):
        tried_before = state.failure_count > 0 or attempt > max(state.first_attempt, 1)
        start = step_index if tried_before else step_index - 1
        return begin_compensation(
            state, from_index=start, now=now, workflow=workflow, reason=reason
        )
    return to_error(state, now=now, reason=reason)


def skips(state: OrderState, workflow: Workflow, *, step_index: int, mode: Mode) -> bool:
    """Whether a final failure of the step skips it: a forward step that may be skipped
    (``on_failure="continue"``) of an order nobody cancelled (a cancelled one is undone)."""
    return (
        mode == "do"
        and state.cancelled is None
        and workflow.failure_policy(step_index) == "continue"
    )


def skip_step(state: OrderState, *, now: datetime, workflow: Workflow, reason: str) -> OrderState:
    """A step that may be skipped (``on_failure="continue"``) failed for good: the order goes
    on without its result, Pending at the next step for a Scheduler to claim (held if
    suspended), or Processed after the last."""
    index = state.step_index + 1
    if index >= len(workflow.steps):
        return _finish(state, ProcessState.PROCESSED, now, last_error=None)
    held = replace(
        _held(state, index, "do", now=now, workflow=workflow), last_error=_bounded(reason)
    )
    return held if state.suspended else replace(held, complete_by=now + workflow.pickup_budget)


def begin_compensation(
    state: OrderState, *, from_index: int, now: datetime, workflow: Workflow, reason: str
) -> OrderState:
    """Queue the undo of ``from_index`` and every step below it (those with an undo action);
    a suspended order's undo waits for its resume."""
    first = workflow.next_undo(from_index)
    if first is None:
        return _finish(state, _undone(state), now, last_error=_bounded(reason))
    return replace(
        state,
        process_state=ProcessState.PENDING,
        mode="undo",
        step_index=first,
        step=workflow.step(first).name,
        first_attempt=state.attempt + 1,
        locked_by=None,
        failure_count=0,
        deferrals=0,
        load_expiries=0,
        not_before=None,
        updated_at=now,
        last_error=_bounded(reason),
        waiting=None,
        complete_by=None if state.suspended else now + workflow.pickup_budget,
    )


def to_error(state: OrderState, *, now: datetime, reason: str) -> OrderState:
    """Error needs an operator; the alert is owed until ``alert_sent`` clears the flag."""
    return replace(
        _finish(state, ProcessState.ERROR, now, last_error=_bounded(reason)), alert_pending=True
    )


def _start(
    state: OrderState,
    index: int,
    mode: Mode,
    *,
    instance_id: str,
    now: datetime,
    workflow: Workflow,
) -> OrderState:
    step = workflow.step(index)
    advancing = index != state.step_index or mode != state.mode
    return replace(
        state,
        process_state=ProcessState.PROCESSING if mode == "do" else ProcessState.COMPENSATING,
        mode=mode,
        locked_by=instance_id,
        attempt=state.attempt + 1,
        step_index=index,
        step=step.name,
        first_attempt=state.attempt + 1 if advancing else state.first_attempt,
        complete_by=now + step.budget + START_SLACK,
        not_before=None,
        failure_count=0 if advancing else state.failure_count,
        deferrals=0 if advancing else state.deferrals,
        load_expiries=0 if advancing else state.load_expiries,
        updated_at=now,
        waiting=None,
    )


def hold(state: OrderState, *, now: datetime, workflow: Workflow) -> OrderState:
    """A suspended order's current step (given up, or not claimed yet) waits for the resume."""
    return _held(state, state.step_index, state.mode, now=now, workflow=workflow)


def _held(
    state: OrderState, index: int, mode: Mode, *, now: datetime, workflow: Workflow
) -> OrderState:
    """Suspended: the step at ``index`` waits unclaimed, with no deadline, for the resume."""
    advancing = index != state.step_index or mode != state.mode
    return replace(
        state,
        process_state=ProcessState.PENDING,
        mode=mode,
        locked_by=None,
        step_index=index,
        step=workflow.step(index).name,
        first_attempt=state.attempt + 1 if advancing else state.first_attempt,
        failure_count=0 if advancing else state.failure_count,
        deferrals=0 if advancing else state.deferrals,
        load_expiries=0 if advancing else state.load_expiries,
        not_before=None,
        complete_by=None,
        updated_at=now,
        waiting=None,
    )


def _undone(state: OrderState) -> ProcessState:
    """How an order whose every effect was undone ends: as its operator asked, or failed."""
    return ProcessState.COMPENSATED if state.cancelled is None else ProcessState.CANCELLED


def _finish(
    state: OrderState, final: ProcessState, now: datetime, *, last_error: str | None
) -> OrderState:
    return replace(
        state,
        suspended=False,
        process_state=final,
        locked_by=None,
        complete_by=None,
        not_before=None,
        updated_at=now,
        finished_at=now,
        last_error=last_error,
        waiting=None,
    )


def _bounded(reason: str) -> str:
    return reason[:MAX_ERROR_LENGTH]

"""What the Supervisor and operators decide, as pure functions: a step's deadline passed
(retry, compensate or Error), the alert an Error owes, an operator's resubmit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from sas.domain.errors import IllegalTransition
from sas.domain.model import OrderState, ProcessState, StepStart
from sas.domain.transitions import begin_compensation, hold, skip_step, to_error
from sas.domain.workflow import Workflow


@dataclass(frozen=True)
class RetryPolicy:
    """The Supervisor's policy for expired records (docs/architecture.md, "Recovery")."""

    max_failures: int = 3
    """Expiries of one step before it is deemed non-transient."""
    base_backoff: timedelta = timedelta(seconds=2)
    max_backoff: timedelta = timedelta(minutes=1)
    clock_skew: timedelta = timedelta(0)
    """The clock-skew allowance. Every role reads the store's time as its process estimates
    it (sas/services/store_time.py); a deadline counts as passed only this long after it
    passed by the Supervisor's estimate, so two estimates' error never expires a step its
    agent may still finish. Recovery comes that much later."""

    queue_wait_limit: timedelta = timedelta(minutes=15)
    """How long a request or reply may wait in a busy queue before its step is recovered as
    expired anyway (a message lost with nothing else to show for it)."""
    max_load_expiries: int = 5
    """Expiries of one step that are not counted as failures because the Supervisor was
    saturated when they came (the deadline was the load's, not the step's); past these, an
    expiry counts whatever the load, so a step that never finishes still fails."""

    def __post_init__(self) -> None:
        if self.max_failures < 1:
            raise ValueError("max_failures must be at least 1")
        if self.max_load_expiries < 0:
            raise ValueError("max_load_expiries must not be negative")
        if self.clock_skew < timedelta(0):
            raise ValueError("clock_skew must not be negative")

    def expired(self, state: OrderState, now: datetime) -> bool:
        """A live record whose deadline (plus the skew allowance) has passed."""
        if state.is_terminal or state.complete_by is None:
            return False
        return state.complete_by + self.clock_skew <= now

    def threshold(self, step_max_failures: int | None) -> int:
        """Expiries that fail a step for good: its own threshold, else the policy's."""
        return step_max_failures or self.max_failures

    def backoff(self, failures: int) -> timedelta:
        """Wait before retry number ``failures``: doubling, capped."""
        doublings = min(max(failures - 1, 0), 32)  # past the cap long before: no overflow
        doubled: timedelta = self.base_backoff * 2**doublings
        return min(doubled, self.max_backoff)


class Waits(StrEnum):
    """Why an order past its deadline has not expired: its step is only waiting."""

    RUNNING = "running"
    """An agent started the attempt and its budget, counted from the start, has not run out."""
    REQUEST_QUEUED = "request_queued"
    """Not started, and the queue its request went to still holds messages."""
    REPLY_QUEUED = "reply_queued"
    """Started and past its budget, and the replies queue still holds messages: its reply,
    sent in time, may be among them."""


@dataclass(frozen=True)
class Wait:
    why: Waits
    until: datetime
    """When the Supervisor looks at the order again."""


def queue_wait(
    state: OrderState,
    *,
    now: datetime,
    policy: RetryPolicy,
    start: StepStart | None,
    request_lane_busy: bool,
    reply_lane_busy: bool,
    recheck: timedelta,
) -> Wait | None:
    """Whether an order whose deadline passed is still only waiting, not expired (None).

    A step's budget runs from when an agent starts it (``start``), not from when it was queued:
    time spent in a queue is not the step's failure, and sending the request again would only
    add to the queue. So an order is recovered only when its agent started it and did not
    answer in time, or when its request or reply is nowhere to be seen: the queue that would
    hold it is empty. A busy queue is trusted for ``queue_wait_limit`` at most (a lost message
    behind a queue that never empties). ``start`` is of the running attempt (do or undo);
    ``request_lane_busy`` is of its agent's lane, or the Scheduler's for a Pending order.
    The order is looked at again within ``recheck`` (its workflow's shortest budget: the
    soonest deadline a transition made meanwhile can set, see ``look_again_at``)."""
    deadline = state.complete_by
    if state.is_terminal or deadline is None:
        return None
    again = now + recheck
    if start is not None and state.is_running:
        run_by = start.run_by + policy.clock_skew
        if now < run_by:
            return Wait(Waits.RUNNING, min(run_by, again))
        if reply_lane_busy and now < start.run_by + policy.queue_wait_limit:
            return Wait(Waits.REPLY_QUEUED, again)
        return None
    if now >= deadline + policy.queue_wait_limit + policy.clock_skew:
        return None  # agents start nothing past the limit
    if request_lane_busy:
        return Wait(Waits.REQUEST_QUEUED, again)
    if reply_lane_busy:  # an agent that started within the claim's slack records no start
        return Wait(Waits.REPLY_QUEUED, again)
    return None


class ExpiryAction(StrEnum):
    RETRY = "retry"
    """Pending again after a backoff, the failure counted (unless the load's: ``counted``)."""
    COMPENSATE = "compensate"
    """Past the threshold: compensation queued."""
    COMPENSATED = "compensated"
    """Past the threshold with nothing to undo: finished as Compensated."""
    ERROR = "error"
    """Past the threshold and no compensation possible: Error, an operator alert owed."""
    HELD = "held"
    """Suspended: the step waits, uncounted and with no deadline, for the resume."""
    SKIPPED = "skipped"
    """Past the threshold, a step that may be skipped: the order goes on at the next step
    (Pending), or ends Processed after the last."""


@dataclass(frozen=True)
class Expiry:
    """What the Supervisor decided for an expired record."""

    state: OrderState
    action: ExpiryAction
    delay: timedelta = timedelta(0)
    counted: bool = True
    """False for an expiry taken as the load's (``expire``'s ``saturated``)."""


def expire(
    state: OrderState,
    *,
    now: datetime,
    workflow: Workflow,
    policy: RetryPolicy,
    saturated: bool = False,
) -> Expiry:
    """A live record whose deadline passed: count the failure, then retry or give up.

    A timed-out step and a crashed one look the same. Past the threshold a forward step is
    compensated *including itself*: it may have been applied before its reply was lost, and
    undo actions are no-ops for effects that never happened. ``saturated``: the Supervisor held
    retries back lately (``retry_budget.py``), so the deadline is taken as the load's and the
    expiry retried uncounted, ``max_load_expiries`` times per step at most."""
    if not policy.expired(state, now):
        raise IllegalTransition(f"order {state.order_id} has not expired")
    if steered := _steered(state, now=now, workflow=workflow):
        return steered
    failures, step = state.failure_count + 1, workflow.step(state.step_index).name
    spared = saturated and state.load_expiries < policy.max_load_expiries
    if spared or failures < policy.threshold(workflow.step(state.step_index).max_failures):
        delay = policy.backoff(failures)
        return Expiry(
            replace(
                state,
                process_state=ProcessState.PENDING,
                locked_by=None,
                failure_count=state.failure_count if spared else failures,
                load_expiries=state.load_expiries + spared,
                not_before=now + delay,
                complete_by=now + delay + workflow.pickup_budget,
                updated_at=now,
                last_error=f"{step} ({state.mode}) expired at attempt {state.attempt}",
                waiting=None,
            ),
            ExpiryAction.RETRY,
            delay,
            counted=not spared,
        )
    return _failed_for_good(state, failures, now=now, workflow=workflow)


def _failed_for_good(
    state: OrderState, failures: int, *, now: datetime, workflow: Workflow
) -> Expiry:
    """Past the threshold: what the step's failure policy says (an undo always errors)."""
    reason = f"{workflow.step(state.step_index).name} ({state.mode}) expired {failures} times"
    on_failure = workflow.failure_policy(state.step_index)
    if state.mode == "do" and on_failure == "continue":
        return Expiry(
            skip_step(state, now=now, workflow=workflow, reason=reason), ExpiryAction.SKIPPED
        )
    if state.mode == "do" and on_failure == "compensate":
        compensating = begin_compensation(
            state, from_index=state.step_index, now=now, workflow=workflow, reason=reason
        )
        compensating = replace(compensating, failure_count=0)
        action = ExpiryAction.COMPENSATED if compensating.is_terminal else ExpiryAction.COMPENSATE
        return Expiry(compensating, action)
    error = to_error(replace(state, failure_count=failures), now=now, reason=reason)
    return Expiry(error, ExpiryAction.ERROR)


def _steered(state: OrderState, *, now: datetime, workflow: Workflow) -> Expiry | None:
    """An operator's say first: a cancelled order is undone from the expired step (it may have
    been applied); a suspended one waits. Neither counts as the step's failure."""
    if state.cancelled is not None and state.mode == "do":
        undo = begin_compensation(
            state, from_index=state.step_index, now=now, workflow=workflow, reason=state.cancelled
        )
        action = ExpiryAction.COMPENSATED if undo.is_terminal else ExpiryAction.COMPENSATE
        return Expiry(undo, action, counted=False)
    if state.suspended:
        return Expiry(hold(state, now=now, workflow=workflow), ExpiryAction.HELD, counted=False)
    return None


def claim_alert(
    state: OrderState,
    *,
    instance_id: str,
    now: datetime,
    lease: timedelta,
    clock_skew: timedelta = timedelta(0),
) -> OrderState:
    """Take the right to send the alert an Error owes, for ``lease``.

    Persisted (conditionally) *before* the alert is sent, so of several Supervisors and the
    Scheduler that just wrote Error exactly one sends it. A live claim excludes everyone,
    its own holder's instance included: the Scheduler and a Supervisor share one instance id
    in a Functions host, so "same instance" never means "the caller that wrote the claim".
    A claim whose lease ran out (its holder died between the claim and the send) may be
    taken over: the alert then goes out again with the same alert id, which is what
    consumers de-duplicate on. ``clock_skew``: the claim was timed by another instance's
    clock, so it counts as lapsed only that much later by ours."""
    if not state.alert_pending:
        raise IllegalTransition(f"order {state.order_id} owes no alert")
    held = state.alert_claimed_until is not None and now < state.alert_claimed_until + clock_skew
    if held:
        raise IllegalTransition(
            f"alert of {state.order_id} is being sent by {state.alert_claimed_by!r}"
        )
    return replace(state, alert_claimed_by=instance_id, alert_claimed_until=now + lease)


def alert_sent(state: OrderState) -> OrderState:
    if not state.alert_pending:
        raise IllegalTransition(f"order {state.order_id} owes no alert")
    return replace(state, alert_pending=False, alert_claimed_by=None, alert_claimed_until=None)


def _operator_may_act(state: OrderState) -> None:
    """An operator acts on an Error order whose alert went out; IllegalTransition otherwise."""
    if state.process_state is not ProcessState.ERROR:
        raise IllegalTransition(f"order {state.order_id} is {state.process_state}, not Error")
    if state.alert_pending:
        # Acting now would cancel the episode's one alert before it went out.
        raise IllegalTransition(
            f"order {state.order_id}: its operator alert is still being sent; try again shortly"
        )


def close(state: OrderState, *, now: datetime) -> OrderState:
    """An operator settled an Error order by hand: closed for good (purge may remove it later,
    counting its retention from now). An order waiting for a workflow version that is not
    deployed may be closed too: it is run on no other."""
    if state.waiting is None or state.is_terminal:
        _operator_may_act(state)
    return replace(
        state,
        process_state=ProcessState.CLOSED,
        locked_by=None,
        not_before=None,
        complete_by=None,
        updated_at=now,
        finished_at=now,
        waiting=None,
    )


def resubmit(state: OrderState, *, now: datetime, workflow: Workflow) -> OrderState:
    """An operator fixed the cause: run the failed step (or undo) again from a clean count."""
    _operator_may_act(state)
    return replace(
        state,
        process_state=ProcessState.PENDING,
        locked_by=None,
        failure_count=0,
        load_expiries=0,
        deferrals=0,
        not_before=None,
        complete_by=now + workflow.pickup_budget,
        updated_at=now,
        finished_at=None,
        alert_pending=False,
        alert_claimed_by=None,
        alert_claimed_until=None,
    )

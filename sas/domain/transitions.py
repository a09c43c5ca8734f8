"""Legal transitions of an order's state, as pure functions (no I/O, no clock).

Each returns the next state or raises IllegalTransition; the caller persists the result with
a write conditional on the ETag it read, so a concurrent transition makes one of them lose.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from sas.domain.errors import IllegalTransition, StaleReply
from sas.domain.model import OrderState, ProcessState
from sas.domain.workflow import Workflow

MAX_ERROR_LENGTH = 1000


def initial_state(
    order_id: str, workflow: Workflow, *, reply_to: str | None, now: datetime
) -> OrderState:
    """Pending, unlocked, attempt 0, with a pickup deadline."""
    return OrderState(
        order_id=order_id,
        workflow=workflow.name,
        process_state=ProcessState.PENDING,
        submitted_at=now,
        updated_at=now,
        complete_by=now + workflow.pickup_budget,
        reply_to=reply_to,
    )


def claim(state: OrderState, *, instance_id: str, now: datetime, workflow: Workflow) -> OrderState:
    """A Scheduler takes a Pending, unlocked order: lock, next attempt, deadline, Processing."""
    if state.process_state is not ProcessState.PENDING or state.locked_by is not None:
        raise IllegalTransition(
            f"order {state.order_id} is {state.process_state} locked by {state.locked_by!r}"
        )
    return _start_step(state, state.step_index, instance_id=instance_id, now=now, workflow=workflow)


def check_reply(state: OrderState, *, attempt: int, step_index: int) -> None:
    """Fencing: only a reply for the current attempt of the current running step applies."""
    if (
        state.process_state is not ProcessState.PROCESSING
        or state.attempt != attempt
        or state.step_index != step_index
    ):
        raise StaleReply(
            f"reply for attempt {attempt} step {step_index}; order {state.order_id} is "
            f"{state.process_state} at attempt {state.attempt} step {state.step_index}"
        )


def complete_step(
    state: OrderState,
    *,
    attempt: int,
    step_index: int,
    instance_id: str,
    now: datetime,
    workflow: Workflow,
) -> OrderState:
    """The current step succeeded: claim the next step at once, or finish as Processed."""
    check_reply(state, attempt=attempt, step_index=step_index)
    next_index = step_index + 1
    if next_index < len(workflow.steps):
        return _start_step(state, next_index, instance_id=instance_id, now=now, workflow=workflow)
    return replace(
        state,
        process_state=ProcessState.PROCESSED,
        locked_by=None,
        complete_by=None,
        updated_at=now,
        finished_at=now,
        last_error=None,
    )


def fail_step(
    state: OrderState, *, attempt: int, step_index: int, now: datetime, reason: str
) -> OrderState:
    """The current step failed for good (non-transient): the order is in Error."""
    check_reply(state, attempt=attempt, step_index=step_index)
    return replace(
        state,
        process_state=ProcessState.ERROR,
        locked_by=None,
        complete_by=None,
        updated_at=now,
        finished_at=now,
        last_error=reason[:MAX_ERROR_LENGTH],
    )


def _start_step(
    state: OrderState, index: int, *, instance_id: str, now: datetime, workflow: Workflow
) -> OrderState:
    step = workflow.step(index)
    return replace(
        state,
        process_state=ProcessState.PROCESSING,
        locked_by=instance_id,
        attempt=state.attempt + 1,
        step_index=index,
        complete_by=now + step.budget,
        updated_at=now,
    )

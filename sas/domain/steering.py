"""What an operator may do to a live order: cancel it (undo what was done), suspend and
resume it, or terminate it (end it where it stands). Pure functions, as the transitions are:
the caller writes the result conditionally on the ETag it read."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from sas.domain.errors import IllegalTransition
from sas.domain.model import OrderState, ProcessState
from sas.domain.transitions import begin_compensation, hold
from sas.domain.workflow import Workflow

MAX_REASON = 500


def cancel(state: OrderState, *, now: datetime, workflow: Workflow, why: str) -> OrderState:
    """No step goes forward from now; what was done is undone in reverse; the order ends
    Cancelled (Error, with an alert, if an undo fails for good).

    A step running forward is left to finish: its reply (or its expiry) turns the order to
    its undo, from that step down, so a late ``ok`` is recorded and undone, never lost. An
    order waiting for its next step, or stopped in Error part-way, is undone from its current
    step at once: an earlier attempt of it may have been applied, and undoing what never
    happened changes nothing. Cancel overrides a suspend."""
    _live_or_stopped(state, "cancelled")
    if state.cancelled is not None:
        raise IllegalTransition(f"order {state.order_id} is being cancelled already")
    if state.mode == "undo":
        raise IllegalTransition(
            f"order {state.order_id} is being undone already ({state.process_state})"
            if not state.is_terminal
            else f"order {state.order_id} stopped in its undo: resubmit retries it"
        )
    marked = replace(state, cancelled=_bounded(why), suspended=False, updated_at=now)
    if state.process_state is ProcessState.PROCESSING:
        return marked
    # A step claimed at least once may have been applied (undoing what never was changes
    # nothing); one never claimed starts the undo below it.
    claimed = state.attempt >= state.first_attempt
    undone = begin_compensation(
        replace(marked, alert_pending=False, alert_claimed_by=None, alert_claimed_until=None),
        from_index=state.step_index if claimed else state.step_index - 1,
        now=now,
        workflow=workflow,
        reason=marked.cancelled or why,
    )
    return replace(undone, finished_at=undone.finished_at if undone.is_terminal else None)


def suspend(state: OrderState, *, now: datetime, workflow: Workflow) -> OrderState:
    """Nothing new is dispatched and no deadline expires the order until it is resumed; a
    step already running may finish, and is recorded."""
    _live(state, "suspended")
    if state.suspended:
        raise IllegalTransition(f"order {state.order_id} is suspended already")
    marked = replace(state, suspended=True, updated_at=now)
    if state.is_running:
        return marked
    return hold(marked, now=now, workflow=workflow)


def resume(state: OrderState, *, now: datetime, workflow: Workflow) -> OrderState:
    """Carry on from where the order stood: a waiting step is claimable again at once."""
    if not state.suspended:
        raise IllegalTransition(f"order {state.order_id} is not suspended")
    resumed = replace(state, suspended=False, updated_at=now)
    if state.is_running:
        return resumed
    return replace(resumed, not_before=None, complete_by=now + workflow.pickup_budget)


def terminate(state: OrderState, *, now: datetime, why: str) -> OrderState:
    """End the order now and undo nothing (for what a cancel cannot settle): a step still
    running is fenced off, its reply dropped."""
    _live(state, "terminated")
    return replace(
        state,
        process_state=ProcessState.TERMINATED,
        suspended=False,
        locked_by=None,
        complete_by=None,
        not_before=None,
        updated_at=now,
        finished_at=now,
        last_error=_bounded(why),
        waiting=None,
    )


def _live(state: OrderState, done: str) -> None:
    if state.process_state is ProcessState.ERROR:
        raise IllegalTransition(
            f"order {state.order_id} is Error: it cannot be {done} (resubmit it, cancel it to "
            "undo what it did, or close it once settled by hand)"
        )
    if state.is_terminal:
        raise IllegalTransition(
            f"order {state.order_id} is {state.process_state}: it cannot be {done}"
        )


def _live_or_stopped(state: OrderState, done: str) -> None:
    """Live, or in Error with its alert sent (an operator may undo what it did)."""
    if state.process_state is ProcessState.ERROR:
        if state.alert_pending:
            raise IllegalTransition(
                f"order {state.order_id}: its operator alert is still being sent; try again shortly"
            )
        return
    _live(state, done)


def _bounded(why: str) -> str:
    return why.strip()[:MAX_REASON]

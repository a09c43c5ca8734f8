"""Orders bound to a workflow version this host does not have.

An order runs only on the definition it began with (``Context.definition``). A host without it
(an old host mid-deploy, or a deploy that dropped or changed the version) never runs the order
on another: it puts the order's messages back for a host that has it, and the Supervisor keeps
the order waiting, visibly (its state says why, one alert per missing definition), until the
version is deployed again or an operator closes the order.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

from sas.domain.errors import ConcurrencyConflict, DefinitionMissing, NotFound
from sas.domain.messages import OrderSubmitted, ScheduleRequest, StepReply, StepRequest
from sas.domain.model import HistoryEntry, MissingDefinition, OrderState, ProcessState, Versioned
from sas.domain.wire import held_message_id, missing_alert_id, missing_definition_key
from sas.services import alerts
from sas.services.context import Context

log = logging.getLogger(__name__)

HOLD_FIRST = timedelta(seconds=15)
HOLD_LONGEST = timedelta(minutes=5)
"""A held message comes back after half the time it has been held, within these bounds: soon
during a deploy, rarely while a version stays missing."""
WAIT_RECHECK = timedelta(minutes=1)
"""How often the Supervisor looks at an order waiting for its version: it resumes within this
of the version's return."""

Holdable = OrderSubmitted | ScheduleRequest | StepRequest | StepReply


def hold(ctx: Context, queue: str, message: Holdable, message_id: str, why: str) -> None:
    """Put ``message`` back on ``queue`` for a host that has the version its order needs;
    nothing is parked or failed, and the order itself is not touched."""
    now = ctx.clock.now()
    since = message.held_since or now
    delay = min(max((now - since) / 2, HOLD_FIRST), HOLD_LONGEST)
    ctx.transport.send(
        queue,
        message.model_copy(update={"held_since": since}),
        message_id=held_message_id(message_id, now),
        correlation_id=message.order_id,
        delay_seconds=delay.total_seconds(),
    )
    log.warning(
        "sas.message_held reason=%s",
        why,
        extra={"order_id": message.order_id, "type": message.type, "delay": delay.seconds},
    )


def wait(ctx: Context, current: Versioned[OrderState], missing: DefinitionMissing) -> str:
    """An order whose deadline passed while its definition is missing: not expired (which
    would retry or undo it on a definition it did not begin with) but kept waiting, its
    deadline moved on so the Supervisor looks again, and the alert owed for the definition."""
    state, now = current.value, ctx.clock.now()
    waiting = replace(state, waiting=missing.reason, complete_by=now + WAIT_RECHECK)
    history = None
    if state.waiting != missing.reason:
        history = HistoryEntry(
            order_id=state.order_id,
            at=now,
            kind="waiting",
            attempt=state.attempt,
            step=state.step or None,
            mode=state.mode,
            actor=ctx.instance_id,
            detail=missing.reason,
        )
    try:
        ctx.store.update_state(waiting, current.etag, history)
    except (ConcurrencyConflict, NotFound):
        return "lost_race"
    key = missing_definition_key(state.workflow, state.version, state.definition)
    if ctx.store.note_missing(MissingDefinition(key, missing.reason, now)):
        reason = f"orders wait: {missing.reason}"
        alerts.alert(ctx, state.order_id, reason, now, alert_id=missing_alert_id(key, now))
    log.warning("sas.order_waiting reason=%s", missing.reason, extra={"order_id": state.order_id})
    return "waiting"


def resume(ctx: Context, current: Versioned[OrderState]) -> OrderState | None:
    """The definition of an order that waited is here again: its current step is asked for
    again (Pending, no failure counted; a new attempt under the step's one key). Returns the
    state written, None if somebody else wrote first."""
    state, now = current.value, ctx.clock.now()
    workflow = ctx.definition(state)
    resumed = replace(
        state,
        process_state=ProcessState.PENDING,
        locked_by=None,
        waiting=None,
        not_before=None,
        complete_by=now + workflow.pickup_budget,
        updated_at=now,
    )
    history = HistoryEntry(
        order_id=state.order_id,
        at=now,
        kind="resumed",
        attempt=state.attempt,
        step=state.step or None,
        mode=state.mode,
        actor=ctx.instance_id,
        detail=f"{workflow.label} is deployed again",
    )
    try:
        ctx.store.update_state(resumed, current.etag, history)
    except (ConcurrencyConflict, NotFound):
        return None
    ctx.store.forget_missing(
        missing_definition_key(state.workflow, state.version, state.definition)
    )
    log.info("sas.order_resumed", extra={"order_id": state.order_id})
    return resumed

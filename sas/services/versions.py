"""Orders bound to a workflow version this host does not have.

An order runs only on the definition it began with (``Context.definition``). A host without it
never runs the order on another. Mid-deploy (the order's version is newer than any this host
has) it puts the order's messages back for a host that has it, soon, and its Supervisor leaves
the order to a Supervisor that has the version. When the version is missing for longer, or was
removed or changed, the Supervisor keeps the order waiting, visibly: its state says why, one
operator alert goes out per missing definition and day, and the order's expiry is recovered as
usual once the version is deployed again (or an operator closes the order).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

from sas.domain.errors import ConcurrencyConflict, DefinitionMissing, NotFound
from sas.domain.messages import OrderSubmitted, ScheduleRequest, StepReply, StepRequest
from sas.domain.model import HistoryEntry, MissingDefinition, OrderState, Versioned
from sas.domain.wire import held_message_id, missing_alert_id, missing_definition_key
from sas.services import alerts
from sas.services.context import Context

log = logging.getLogger(__name__)

HOLD_FIRST = timedelta(seconds=1)
HOLD_SHORTEST = timedelta(milliseconds=200)
HOLD_LONGEST = timedelta(minutes=5)
"""A held message comes back after as long as it has been held, within these bounds: at once
during a deploy (a host that has the version is likely there), rarely while it stays missing."""
NEWER_GRACE = timedelta(minutes=10)
"""How long after its deadline an order of a newer version than this host's is left to the
hosts that have it (a deploy in progress) before it counts as waiting for a missing version."""
NEWER_RECHECK = timedelta(seconds=5)
WAIT_RECHECK = timedelta(minutes=1)
"""How often the Supervisor looks at an order waiting for its version: it is recovered within
this of the version's return."""
ALERT_AGAIN_AFTER = timedelta(days=1)
"""A definition still (or again) missing this long after its alert is alerted again."""

Holdable = OrderSubmitted | ScheduleRequest | StepRequest | StepReply


def hold(
    ctx: Context,
    queue: str,
    message: Holdable,
    message_id: str,
    why: str,
    *,
    within: timedelta | None = None,
) -> None:
    """Put ``message`` back on ``queue`` for a host that has the version its order needs
    (``within``: come back before this has passed); nothing is parked or failed, and the
    order itself is not touched."""
    now = ctx.clock.now()
    since = message.held_since or now
    delay = min(max(now - since, HOLD_FIRST), HOLD_LONGEST)
    if within is not None:  # back while there is time to act on it
        delay = max(min(delay, within / 2), HOLD_SHORTEST)
    holds = (message.holds or 0) + 1
    ctx.transport.send(
        queue,
        message.model_copy(update={"held_since": since, "holds": holds}),
        message_id=held_message_id(message_id, holds),
        correlation_id=message.order_id,
        delay_seconds=delay.total_seconds(),
    )
    log.warning(
        "sas.message_held reason=%s",
        why,
        extra={"order_id": message.order_id, "type": message.type, "holds": holds},
    )


def leave_to_newer_hosts(missing: DefinitionMissing, state: OrderState, now: datetime) -> bool:
    """Whether an expired order's recovery is left to the hosts that have its version: it is
    newer than any here (a deploy in progress) and its deadline passed only lately."""
    deadline = state.complete_by or state.updated_at
    return missing.newer and now - deadline < NEWER_GRACE


def wait(ctx: Context, current: Versioned[OrderState], missing: DefinitionMissing) -> str:
    """An expired order whose definition is missing: not expired (which would retry or undo it
    on a definition it did not begin with) but kept waiting, its deadline moved on so the
    Supervisor looks again, and the operator alerted once for the definition."""
    state, now = current.value, ctx.clock.now()
    waiting = replace(state, waiting=missing.reason, complete_by=now + WAIT_RECHECK)
    history = None
    if state.waiting != missing.reason:
        history = _entry(ctx, state, "waiting", missing.reason)
    try:
        ctx.store.update_state(waiting, current.etag, history)
    except (ConcurrencyConflict, NotFound):
        return "lost_race"
    _alert_once(ctx, state, missing, now)
    log.warning("sas.order_waiting reason=%s", missing.reason, extra={"order_id": state.order_id})
    return "waiting"


def _alert_once(ctx: Context, state: OrderState, missing: DefinitionMissing, now: datetime) -> None:
    """The alert a missing definition owes, sent before it is noted: a send that fails is
    tried again by the next sweep. Senders racing send the same alert id (one per definition
    and day), which is what consumers and duplicate detection drop copies by."""
    key = missing_definition_key(state.workflow, state.version, state.definition)
    noted = ctx.store.get_missing(key)
    if noted is not None and now - noted.since < ALERT_AGAIN_AFTER:
        return
    reason = f"orders wait: {missing.reason}"
    alert_id = missing_alert_id(key, now)
    alerts.alert(ctx, state.order_id, reason, now, alert_id=alert_id, about=state)
    ctx.store.note_missing(MissingDefinition(key, missing.reason, now))


def resumed(ctx: Context, state: OrderState) -> HistoryEntry:
    """The history line of a waiting order whose definition is back: its expiry is then
    recovered as any other, the failure counted (``forget`` once that is written)."""
    return _entry(ctx, state, "resumed", f"{state.workflow} v{state.version} is deployed again")


def _entry(ctx: Context, state: OrderState, kind: str, detail: str) -> HistoryEntry:
    """A line of the order's history at the step it waits on, written by this instance now."""
    return HistoryEntry(
        order_id=state.order_id,
        at=ctx.clock.now(),
        kind=kind,
        attempt=state.attempt,
        step=state.step or None,
        mode=state.mode,
        actor=ctx.instance_id,
        detail=detail,
    )


def forget(ctx: Context, state: OrderState) -> None:
    """The definition is back: a later absence is a new episode, alerted again."""
    ctx.store.forget_missing(
        missing_definition_key(state.workflow, state.version, state.definition)
    )
    log.info("sas.order_resumed", extra={"order_id": state.order_id})

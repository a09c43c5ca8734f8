"""Submission: the order and its state inserted together (or not at all), its first step
claimed in the same transaction, and that step's request sent.

Claiming here costs nothing extra: the insert already holds the order's partition, so the
claim rides in the same entity-group transaction, and no ScheduleRequest hop is needed.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from enum import StrEnum

from sas.domain.errors import AlreadyExists, DefinitionMissing, InvalidMessage
from sas.domain.messages import OrderSubmitted, encode
from sas.domain.model import HistoryEntry, OrderRecord, OrderState, ProcessState
from sas.domain.priority import Waiting
from sas.domain.transitions import claim, initial_state, look_again_at
from sas.domain.wire import (
    POISON_SUFFIX,
    deferred_submission_message_id,
    new_incarnation,
    room_row_key,
    submission_message_id,
)
from sas.domain.workflow import Workflow
from sas.services import consequences as then
from sas.services import telemetry, versions
from sas.services.context import Context
from sas.services.in_flight import InFlight

log = logging.getLogger(__name__)

SUBMISSION_HOLD_LIMIT = timedelta(hours=1)
"""How long a submission naming a newer workflow version than any host has is put back before
it is refused (parked, with the reason)."""


class SubmissionOutcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    DEFERRED = "deferred"
    """Put back for later: a low-priority order while higher lanes are backlogged."""
    WAITING = "waiting"
    """Kept in the waiting room while its workflow has ``max_in_flight`` orders in flight."""
    HELD = "held"
    """It names a workflow version newer than this host has: left for a host that has it."""


def check(ctx: Context, message: OrderSubmitted) -> None:
    """InvalidMessage (with a reason for the submitter) if the order can't be accepted as it
    stands, whatever the store holds: checked before anything is written."""
    workflow = _workflow(ctx, message)
    try:
        details = workflow.parse_input(message.details)
    except ValueError as exc:
        raise InvalidMessage(str(exc)) from None
    try:  # the first step's data comes from the details alone: it must build now
        workflow.step_data(0, message.order_id, details, {})
    except Exception as exc:  # the app's own builder
        reason = f"details do not build the first step's input ({type(exc).__name__})"
        raise InvalidMessage(reason) from None
    reply_to = message.reply_to
    if reply_to is None:
        return
    # Status events go where the submitter says: never into the app's own queues, where they
    # could be taken for work or alerts, and only where the operator allows.
    own = (*ctx.routes.consumed, ctx.routes.alerts)
    if reply_to in own or reply_to in {f"{queue}{POISON_SUFFIX}" for queue in own}:
        raise InvalidMessage("reply_to names one of the app's own queues")
    if not reply_to.startswith(ctx.reply_to_prefixes):
        allowed = ", ".join(f"{prefix}*" for prefix in ctx.reply_to_prefixes)
        raise InvalidMessage(f"reply_to must match {allowed}")


def _workflow(ctx: Context, message: OrderSubmitted) -> Workflow:
    """The version the order will be bound to: the one it names, else the newest."""
    if message.workflow not in ctx.workflows:
        raise InvalidMessage(f"unknown workflow {message.workflow!r}")
    versions = ctx.workflows.versions(message.workflow)
    if message.version is not None and message.version not in versions:
        if message.version > versions[-1]:
            raise DefinitionMissing(f"{message.workflow} v{message.version} is not deployed")
        deployed = ", ".join(str(v) for v in versions)
        raise InvalidMessage(
            f"workflow {message.workflow!r} has no version {message.version} (deployed: {deployed})"
        )
    return ctx.workflows.named(message.workflow, message.version)


def submit(ctx: Context, message: OrderSubmitted) -> SubmissionOutcome:
    # The order's trace: the submitter's, when its message carried one (the entrypoint made
    # it current), else a new one that starts here.
    with telemetry.order_span(
        telemetry.SUBMIT, message.order_id, priority=message.priority
    ) as span:
        outcome = _submit(ctx, message)
        telemetry.annotate(span, outcome=outcome.value)
        return outcome


def _submit(ctx: Context, message: OrderSubmitted) -> SubmissionOutcome:
    try:
        check(ctx, message)
    except DefinitionMissing as missing:  # a newer version than this host has: mid-deploy
        held = ctx.clock.now() - (message.held_since or ctx.clock.now())
        if held >= SUBMISSION_HOLD_LIMIT:  # no deploy takes this long: a version never made
            raise InvalidMessage(f"{missing.reason} (no host had it for an hour)") from None
        queue = ctx.routes.lane(ctx.routes.orders, message.priority)
        versions.hold(ctx, queue, message, submission_message_id(message.order_id), missing.reason)
        return SubmissionOutcome.HELD
    workflow = _workflow(ctx, message)
    now = ctx.clock.now()
    if message.priority == "low":
        delay = ctx.admission.deferral(
            message.priority,
            deferred_since=message.deferred_since,
            now=now,
            higher=_higher_waiting(ctx),
        )
        if delay is not None:
            return _defer(ctx, message, now, delay)
    if _no_room(ctx, message, workflow):
        return _wait_for_room(ctx, message, workflow, now)
    return _accept(ctx, message, workflow, now)


def _accept(
    ctx: Context, message: OrderSubmitted, workflow: Workflow, now: datetime
) -> SubmissionOutcome:
    order, claimed = _accepted(ctx, message, workflow, now)
    # Indexed before it exists: a crash after this leaves a marker the Supervisor sweeps away,
    # never an order the Supervisor cannot see.
    due = look_again_at(claimed, now=now, workflow=workflow)
    ctx.store.touch_live(order.order_id, now, due, workflow.name)
    history = [
        HistoryEntry(order.order_id, now, "submitted", attempt=0, actor=ctx.instance_id),
        then.claim_history(claimed, workflow, ctx.instance_id),
    ]
    try:
        ctx.store.create_order(order, claimed, history)
    except AlreadyExists:
        if (gate := _gate(ctx, message, workflow)) is not None:
            gate.release(workflow.name)  # the order holds its place already
        return _redelivered(ctx, order, message)
    log.info(
        "sas.step_claimed",
        extra={"order_id": order.order_id, "step": history[1].step, "attempt": 1, "mode": "do"},
    )
    then.dispatch(ctx, claimed, workflow)  # the work first: its deadline runs
    then.notify(ctx, claimed, "received", now)
    then.announce(ctx, claimed, workflow)
    return SubmissionOutcome.ACCEPTED


def _accepted(
    ctx: Context, message: OrderSubmitted, workflow: Workflow, now: datetime
) -> tuple[OrderRecord, OrderState]:
    """The order as it will be kept, and its state with the first step claimed."""
    details = workflow.parse_input(message.details)
    order = OrderRecord(
        order_id=message.order_id,
        workflow=workflow.name,
        details=details,
        fingerprint=message.fingerprint(),
        submitted_at=now,
        reply_to=message.reply_to,
        priority=message.priority,
        version=workflow.version,
        incarnation=new_incarnation(),
    )
    pending = initial_state(
        order.order_id,
        workflow,
        reply_to=message.reply_to,
        now=now,
        details=details,
        status_events=message.status_events,
        priority=message.priority,
        incarnation=order.incarnation,
    )
    claimed = claim(pending, instance_id=ctx.instance_id, now=now, workflow=workflow)
    claimed = replace(claimed, traceparent=telemetry.current_traceparent())
    return order, then.with_queue_allowance(ctx, claimed, workflow)


def _no_room(ctx: Context, message: OrderSubmitted, workflow: Workflow) -> bool:
    """Whether the submission must wait for room under its workflow's ``max_in_flight``; if
    not, its place is reserved in this process's count (a submission that fails after this keeps
    it until the next count, within a second)."""
    gate, limit = _gate(ctx, message, workflow), workflow.max_in_flight
    room = None if limit is None else ctx.in_flight_policy.room(message.priority, limit)
    if gate is None or limit is None or room is None:
        return False
    counted = gate.reserve(workflow.name, limit)
    if counted is None or counted < room:
        return False
    gate.release(workflow.name)
    return True


def _gate(ctx: Context, message: OrderSubmitted, workflow: Workflow) -> InFlight | None:
    """The count the submission takes a place in; None: no limit, high priority, or let in
    from the waiting room (``room_turn``: its marker holds its place already)."""
    limit = workflow.max_in_flight
    if ctx.in_flight is None or limit is None or message.room_turn is not None:
        return None
    return None if ctx.in_flight_policy.room(message.priority, limit) is None else ctx.in_flight


def _wait_for_room(
    ctx: Context, message: OrderSubmitted, workflow: Workflow, now: datetime
) -> SubmissionOutcome:
    """Into the waiting room, nothing else written: the Supervisor lets it in when a sweep
    finds room (sas/services/room.py)."""
    key = room_row_key(workflow.name, message.priority, now, message.order_id)
    ctx.store.wait_for_room(key, message.order_id, encode(message))
    log.info(
        "sas.submission_waiting", extra={"order_id": message.order_id, "workflow": workflow.name}
    )
    return SubmissionOutcome.WAITING


def _higher_waiting(ctx: Context) -> Waiting:
    """What waits in the high and normal lanes of the queues the app consumes: the work a
    low-priority order would otherwise be let in beside. Not the scheduler's lanes: they hold
    delayed messages (retry backoffs, deferred steps), which a peek dates from when they were
    sent, not from when they became due."""
    if ctx.backlog is None:
        return Waiting()
    scheduler = set(ctx.routes.all_lanes(ctx.routes.scheduler))
    lanes = ctx.routes.lanes_for(("high", "normal"))
    return ctx.backlog.waiting(tuple(q for q in lanes if q not in scheduler))


def _defer(
    ctx: Context, message: OrderSubmitted, now: datetime, delay: timedelta
) -> SubmissionOutcome:
    """Back into its lane for ``delay`` (the copy is a message of its own; the original is
    settled once the copy is sent), remembering when the first yield was: its bound counts from
    there."""
    update = {"deferred_since": min(message.deferred_since or now, now)}
    ctx.transport.send(
        ctx.routes.lane(ctx.routes.orders, message.priority),
        message.model_copy(update=update),
        message_id=deferred_submission_message_id(message.order_id, now),
        correlation_id=message.order_id,
        delay_seconds=delay.total_seconds(),
    )
    log.info(
        "sas.submission_deferred",
        extra={"order_id": message.order_id, "delay": delay.total_seconds()},
    )
    return SubmissionOutcome.DEFERRED


def _redelivered(ctx: Context, order: OrderRecord, message: OrderSubmitted) -> SubmissionOutcome:
    """A redelivery changes nothing; a different order under a taken id is refused, and kept
    where an operator sees it (the original order is untouched)."""
    extra = {"order_id": order.order_id}
    current = ctx.store.get_state(order.order_id)
    workflow: Workflow | None = None
    if current is not None and then.flags_its_marker(ctx, current.value):
        # This delivery's index touch counted a finished order again: flag it once more.
        ctx.store.finish_live(order.order_id, ctx.clock.now())
    elif current is not None:
        # This delivery's index touch moved the marker's due time to its own clock; put it
        # back where the existing order needs it (never after its deadline).
        now = ctx.clock.now()
        try:
            workflow = ctx.definition(current.value)
            due = look_again_at(current.value, now=now, workflow=workflow)
        except DefinitionMissing:
            due = now
        ctx.store.touch_live(order.order_id, now, due, current.value.workflow)
    existing = ctx.store.get_order(order.order_id)
    if existing is None or existing.fingerprint != order.fingerprint:
        reason = "order id already used for a different order"
        parked_id = ctx.store.park_message(
            ctx.routes.orders, reason, encode(message), ctx.clock.now()
        )
        log.warning("sas.order_id_conflict", extra={**extra, "parked_id": parked_id})
        then.send_status(
            ctx, order.reply_to, order.order_id, "rejected", ctx.clock.now(),
            message.status_events, detail=reason,
        )  # fmt: skip
        return SubmissionOutcome.CONFLICT
    log.info("sas.order_duplicate", extra=extra)
    if current is not None and workflow is not None:
        _resume(ctx, current.value, workflow)
    return SubmissionOutcome.DUPLICATE


def _resume(ctx: Context, state: OrderState, workflow: Workflow) -> None:
    """The first delivery may have died between the insert and the send: send again what it
    would have sent (the same message id, so a send that did happen is a duplicate on Service
    Bus; on Storage Queues the agent's call repeats under the same idempotency key and the
    second reply is fenced off). Only while the order still stands where the submission left
    it."""
    first_step_running = (
        state.process_state is ProcessState.PROCESSING
        and state.attempt == 1
        and state.step_index == 0
    )
    if first_step_running and ctx.clock.now() < (state.complete_by or state.updated_at):
        then.dispatch(ctx, state, workflow)

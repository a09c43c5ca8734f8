"""The waiting room (docs/architecture.md, "Bounded work in flight"): a submission that finds
its workflow's ``max_in_flight`` places taken is kept in a table partition, nothing else
written (sas/services/submission.py), and each Supervisor sweep, once it has dropped the
markers of finished orders, lets in as many as there is room for: normal before low, first come
first, reading no more rows than there are places. Letting them in creates their markers first
(a hundred to a transaction), so each holds its place from then on, then sends each back to its
orders lane marked (``room_turn``) to go in without being counted again, then takes the sent
ones out of the room (a hundred to a transaction) and the markers of any never sent back. A
waiting row holds a place too, in a submission's count (``InFlight``), so a place freed goes to
it, not to whoever arrives before the next sweep. A crash between a send and the removal sends
it twice: the second is a redelivery, which changes nothing."""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from sas.domain.errors import InvalidMessage
from sas.domain.messages import OrderSubmitted, decode
from sas.domain.model import LiveMarker, WaitingSubmission
from sas.domain.wire import deferred_submission_message_id
from sas.services.context import Context

log = logging.getLogger(__name__)

UNLIMITED_BATCH = 500
"""Submissions let in per sweep for a workflow whose limit (or which) a deploy removed."""


def let_in(ctx: Context, *, parallelism: int = 1) -> int:
    """Let in what each workflow has room for, and send back what waits for a workflow no
    longer deployed (the submission refuses it, as it would have on arrival); returns how many
    went. A failure leaves the rest of its workflow's rows for the next sweep."""
    went = 0
    for name in ctx.workflows.names:
        try:
            went += _let_in(ctx, name, parallelism)
        except Exception:  # the store or the transport: one workflow must not hold the others
            log.warning("sas.room_let_in_failed", extra={"workflow": name}, exc_info=True)
    try:
        went += _send_back_stranded(ctx)
    except Exception:
        log.warning("sas.room_let_in_failed", extra={"workflow": None}, exc_info=True)
    return went


def _send_back_stranded(ctx: Context) -> int:
    now = ctx.clock.now()
    stranded = ctx.store.list_stranded(ctx.workflows.names, UNLIMITED_BATCH)
    for row in stranded:
        message = _read(ctx, row, now)
        if message is None:
            continue
        ctx.transport.send(
            ctx.routes.lane(ctx.routes.orders, message.priority),
            message,
            message_id=deferred_submission_message_id(row.order_id, now),
            correlation_id=row.order_id,
        )
        ctx.store.drop_waiting(row)
    if stranded:
        log.warning("sas.room_stranded_sent_back", extra={"count": len(stranded)})
    return len(stranded)


def _let_in(ctx: Context, name: str, parallelism: int) -> int:
    limit = ctx.workflows.named(name).max_in_flight
    in_flight = 0 if limit is None else ctx.store.count_live(name, limit)
    # No more rows are read than could go in: a full workflow reads none.
    places = UNLIMITED_BATCH if limit is None else limit - in_flight
    if places <= 0:
        return 0
    now = ctx.clock.now()
    chosen = _choose(ctx, ctx.store.list_waiting(name, places), limit, in_flight, now)
    if not chosen:
        return 0
    # Each one's marker holds its place from before its send until its submission writes the
    # order (or the Supervisor drops it as an orphan); an order id with a marker already (an
    # order live or just finished under it) keeps the one it has.
    due = now + ctx.workflows.shortest_budget
    markers = {row.order_id: (row.order_id, now, due, m.workflow) for row, m in chosen}
    created = ctx.store.create_live_all(list(markers.values()))  # an id sent twice: one
    sent: list[tuple[WaitingSubmission, OrderSubmitted]] = []

    def one(item: tuple[WaitingSubmission, OrderSubmitted]) -> None:
        row, message = item
        ctx.transport.send(
            ctx.routes.lane(ctx.routes.orders, message.priority),
            message.model_copy(update={"room_turn": now}),
            message_id=deferred_submission_message_id(row.order_id, now),
            correlation_id=row.order_id,
        )
        sent.append(item)

    try:
        if parallelism == 1 or len(chosen) < 2:
            for item in chosen:
                one(item)
        else:
            with ThreadPoolExecutor(min(parallelism, len(chosen))) as pool:
                tasks = [pool.submit(contextvars.copy_context().run, one, i) for i in chosen]
                for task in tasks:
                    task.result()
    finally:
        _settle(ctx, sent, created)
    log.info("sas.room_let_in", extra={"workflow": name, "count": len(chosen)})
    return len(chosen)


def _settle(
    ctx: Context,
    sent: list[tuple[WaitingSubmission, OrderSubmitted]],
    created: dict[str, LiveMarker],
) -> None:
    """What was sent leaves the room, whatever failed after it; a marker made for a row that
    was never sent is taken back (unless touched since), so that row holds no place but its
    own until the next sweep sends it."""
    went = {row.order_id for row, _ in sent}
    unsent = [marker for order_id, marker in created.items() if order_id not in went]
    try:
        if unsent:
            ctx.store.rearm_live([], unsent)
    finally:
        ctx.store.drop_waiting_all([row for row, _ in sent])


def _choose(
    ctx: Context, waiting: list[WaitingSubmission], limit: int | None, in_flight: int, now: datetime
) -> list[tuple[WaitingSubmission, OrderSubmitted]]:
    """The rows that go in, in turn: normal before low, so once one has no room, none after it
    has."""
    chosen: list[tuple[WaitingSubmission, OrderSubmitted]] = []
    for row in waiting:
        message = _read(ctx, row, now)
        if message is None:
            continue
        room = None if limit is None else ctx.in_flight_policy.room(message.priority, limit)
        if room is not None and in_flight >= room:
            break
        chosen.append((row, message))
        in_flight += 1
    return chosen


def _read(ctx: Context, row: WaitingSubmission, now: datetime) -> OrderSubmitted | None:
    """The submission a row keeps; one that is not (written by no version of this app) is
    parked for an operator instead of blocking the room."""
    try:
        message = decode(OrderSubmitted, row.body)
    except InvalidMessage:
        message = None
    if isinstance(message, OrderSubmitted):
        return message
    ctx.store.park_message(ctx.routes.orders, "unreadable in the waiting room", row.body, now)
    ctx.store.drop_waiting(row)
    log.warning("sas.room_row_unreadable", extra={"row_key": row.row_key})
    return None

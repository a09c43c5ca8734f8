"""The Supervisor: finds expired records and requests recovery (docs/architecture.md, "Recovery").

It queries the in-flight index for the markers that are due (never the order history, never
every live order). An order whose deadline passed (plus the clock-skew allowance) is left alone
while its step only waits: an agent started it and its budget has not run out, or its request
or reply may still be in a queue that holds messages (``recovery.queue_wait``): time queued is
not the step's failure, and another request would only lengthen the queue. Otherwise it counts
a failure and either asks for a retry after a backoff, starts compensation, or sets Error with
one operator alert; a forward step's retry beyond the retry budget (``retry_budget.py``) waits
for a later sweep, uncounted, for a bounded time, and while it holds any back an expiry is taken
as the load's and retried without counting a failure (``RetryPolicy.max_load_expiries``). A due
marker of a healthy order is re-armed to the order's next look; a finished order's marker is
dropped. It changes state only through writes conditional on the ETag it read, so several
Supervisors, doubled or missed ticks, and a reply arriving at the same moment cannot double a
recovery. It never calls an agent itself.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta

from sas.domain.clock import readable
from sas.domain.endpoints import HeldRetries
from sas.domain.errors import ConcurrencyConflict, DefinitionMissing, NotFound
from sas.domain.model import (
    HistoryEntry,
    LiveMarker,
    OrderState,
    StepStart,
    Versioned,
)
from sas.domain.recovery import Expiry, ExpiryAction, Wait, expire, queue_wait
from sas.domain.transitions import look_again_at
from sas.domain.wire import idempotency_key
from sas.domain.workflow import Workflow
from sas.services import alerts, metrics, room, telemetry, versions
from sas.services import consequences as then
from sas.services.alerts import AlertOutcome
from sas.services.context import Context
from sas.services.ports import BudgetStore, StateStore

log = logging.getLogger(__name__)

HELD_RETRY_RECHECK = timedelta(seconds=5)
"""How soon an expired step whose retry the budget held back is looked at again."""
"""Orders whose unindexing gives the retry budget back its share."""
NOT_COUNTED = "not counted: saturated"
"""In the history of an expiry retried without counting a failure (the load's deadline)."""
STEERED = "not counted: an operator's"
"""In the history of an expiry of a cancelled or suspended order: undone, or held."""
ORPHAN_GRACE = timedelta(minutes=5)
"""How long a marker without an order is kept: its submission's insert may still commit."""


def sweep(
    ctx: Context, *, parallelism: int = 1, budgets: BudgetStore | None = None
) -> Counter[str]:
    """One pass over the due markers; returns what it did, by outcome. ``budgets``: where
    the retries the budget held back are published (health shows it saturated)."""
    due = ctx.store.list_due(ctx.clock.now())
    markers = MarkerWrites(ctx.store)
    lanes = BusyLanes(ctx)

    def examine(marker: LiveMarker) -> str:
        try:
            return _examine(ctx, marker, markers, lanes)
        except Exception:  # one broken order must not hide every order after it
            log.exception("sas.supervisor_examine_failed", extra={"order_id": marker.order_id})
            return "failed"

    report: Counter[str] = Counter()
    if parallelism == 1 or len(due) < 2:
        report.update(examine(marker) for marker in due)
    else:
        with ThreadPoolExecutor(min(parallelism, len(due))) as pool:
            # Each task in a copy of the caller's context: what the invocation set there
            # (its log attribution, its span) holds on the pool's threads too.
            tasks = [pool.submit(contextvars.copy_context().run, examine, m) for m in due]
            report.update(task.result() for task in tasks)
    markers.flush()
    let_in = room.let_in(ctx, parallelism=parallelism)  # into the room the drops just freed
    if let_in:
        report["let_in"] = let_in
    if report.total():
        log.info("sas.supervisor_sweep", extra={"report": dict(report), "orders_read": len(due)})
    if budgets is not None:
        publish_budget(ctx, budgets)
    return report


def publish_budget(ctx: Context, budgets: BudgetStore) -> None:
    """Publish the retries held back in the last minute while there are any, and once more
    when they are down to none: a write per sweep only while saturated."""
    now = ctx.clock.now()
    budget = ctx.retry_budget
    held = budget.held_recently(now)
    if held == 0 and not budget.published:
        return
    try:
        budgets.publish(HeldRetries(ctx.instance_id, held, now))
    except Exception:  # a figure for operators: the sweep's work is done either way
        log.warning("sas.budget_publish_failed", exc_info=True)
        return
    budget.published = held


def _examine(ctx: Context, marker: LiveMarker, markers: MarkerWrites, lanes: BusyLanes) -> str:
    if marker.finished:  # its order finished well: nothing to read
        markers.drop(marker)
        ctx.retry_budget.finished()
        return "unindexed"
    now = ctx.clock.now()
    current = ctx.store.get_state(marker.order_id)
    if current is None:
        return _orphan(ctx, marker, markers, now)
    state = current.value
    if state.is_terminal:
        return _finished(ctx, marker, current, markers, now)
    if not ctx.policy.expired(state, now):
        markers.rearm(marker, _next_look(ctx, state, now))
        return "healthy"
    try:
        workflow = ctx.definition(state)
    except DefinitionMissing as missing:
        if versions.leave_to_newer_hosts(missing, state, now):
            recheck = min(versions.NEWER_RECHECK, ctx.workflows.shortest_budget)
            markers.rearm(marker, now + recheck)
            return "left_to_newer_hosts"
        outcome = versions.wait(ctx, current, missing)
        if outcome == "waiting":  # lost: whoever wrote first decides the marker
            markers.rearm(marker, now + versions.WAIT_RECHECK)
        return outcome
    waits = _queue_wait(ctx, state, workflow, lanes, now)
    if waits is not None:
        markers.rearm(marker, waits.until)
        return waits.why.value
    # A timer has no trace of its own: the recovery joins the order's.
    with telemetry.order_span(
        telemetry.RECOVER,
        state.order_id,
        step=workflow.step(state.step_index).name,
        attempt=state.attempt,
        mode=state.mode,
        priority=state.priority,
        parent=state.traceparent,
    ) as span:
        outcome = _recover(ctx, marker, current, markers, now)
        telemetry.annotate(span, outcome=outcome)
        return outcome


def _queue_wait(
    ctx: Context, state: OrderState, workflow: Workflow, lanes: BusyLanes, now: datetime
) -> Wait | None:
    """Whether the expired order's step is only waiting: started and within its budget, or
    its request or reply still possibly queued (``recovery.queue_wait``)."""
    step = workflow.step(state.step_index)
    if not state.is_running:
        busy = lanes.busy(ctx.routes.lane(ctx.routes.scheduler, state.priority))
        return queue_wait(
            state, now=now, policy=ctx.policy, start=None, request_lane_busy=busy,
            reply_lane_busy=False, recheck=workflow.shortest_budget,
        )  # fmt: skip
    # The queues before the start: a request the agent held (a queue counts it) while its
    # start was read is in neither, or started where a later look sees it.
    request_busy = lanes.busy(ctx.routes.agent(step.agent, state.priority))
    reply_busy = lanes.busy(ctx.routes.lane(ctx.routes.replies, state.priority))
    key = idempotency_key(state.order_id, state.incarnation, step.name, state.mode)
    start = ctx.store.get_start(state.order_id, key, state.attempt)

    def decide(start: StepStart | None) -> Wait | None:
        return queue_wait(
            state, now=now, policy=ctx.policy, start=start, request_lane_busy=request_busy,
            reply_lane_busy=reply_busy, recheck=workflow.shortest_budget,
        )  # fmt: skip

    if start is not None and start.abandoned:  # given up before, by a sweep cut short
        return None  # no agent will run it: recover it now
    waits = decide(start)
    if waits is not None or start is not None:
        return waits
    # Not started and nothing holds it off: give the attempt up first, by the insert an agent
    # starting it would make, so that none starts it after its recovery (and maybe its undo).
    first = ctx.store.record_start(
        StepStart(state.order_id, key, state.attempt, now, now, ctx.instance_id, abandoned=True)
    )
    return None if first.abandoned else decide(first)  # else: an agent started it just now


def _orphan(ctx: Context, marker: LiveMarker, markers: MarkerWrites, now: datetime) -> str:
    """Indexed by a submission that never inserted (a crash, or a refused duplicate id): its
    insert may still commit, so it is looked at again well before the grace ends (then the
    order's first deadline is no further away than this), and dropped after it."""
    if now - marker.touched_at > ORPHAN_GRACE and ctx.store.drop_live(marker):
        return "orphan_dropped"
    markers.rearm(
        marker, min(marker.touched_at + ORPHAN_GRACE, now + ctx.workflows.shortest_budget)
    )
    return "orphan_waiting"


def _finished(
    ctx: Context,
    marker: LiveMarker,
    current: Versioned[OrderState],
    markers: MarkerWrites,
    now: datetime,
) -> str:
    """Settle the alert an Error still owes, then unindex the order."""
    state = current.value
    alert = alerts.settle_alert(ctx, state, current.etag)
    if alert is AlertOutcome.CLAIMED_ELSEWHERE:
        # Stays indexed until the alert is sent: looked at again once the claim lapses.
        lapses = (state.alert_claimed_until or now) + ctx.policy.clock_skew
        markers.rearm(marker, max(lapses, now))
        return "alert_claimed_elsewhere"
    markers.drop(marker)  # unless touched since: then its toucher's order decides
    # A marker the finish flags (or will: maybe after this drop) gives the share when dropped.
    if state.process_state in then.FINISHED_WELL and not then.flags_its_marker(ctx, state):
        ctx.retry_budget.finished()
    return "alert_resent" if alert is AlertOutcome.SENT else "unindexed"


def _next_look(ctx: Context, state: OrderState, now: datetime) -> datetime:
    try:
        workflow = ctx.definition(state)
    except DefinitionMissing:  # waiting: looked at again when its deadline passes
        return state.complete_by or now + versions.WAIT_RECHECK
    due = look_again_at(state, now=now, workflow=workflow)
    if due <= now and state.complete_by is not None:
        # Within the skew allowance of its deadline: judged expired only this much later.
        return state.complete_by + ctx.policy.clock_skew
    return due


def _recover(
    ctx: Context,
    marker: LiveMarker,
    current: Versioned[OrderState],
    markers: MarkerWrites,
    now: datetime,
) -> str:
    state, workflow = current.value, ctx.definition(current.value)
    saturated = ctx.retry_budget.saturated(now)  # then the deadline is the load's: uncounted
    decided = expire(state, now=now, workflow=workflow, policy=ctx.policy, saturated=saturated)
    budgeted = decided.action is ExpiryAction.RETRY and state.mode == "do"
    expired_at = (state.complete_by or now) + ctx.policy.clock_skew
    if budgeted and not ctx.retry_budget.take(now, expired_at=expired_at):
        # Retries beyond what gets finished only lengthen the queues: wait, uncounted.
        markers.rearm(marker, now + min(HELD_RETRY_RECHECK, workflow.shortest_budget))
        step = workflow.step(state.step_index).name
        # The sweep's report counts them: one line per order would flood a surge.
        log.debug("sas.retry_held_back", extra={"order_id": state.order_id, "step": step})
        return "retry_held_back"
    decided = replace(decided, state=alerts.claiming_alert(ctx, decided.state))
    step = workflow.step(state.step_index).name
    history = [_expiry_history(ctx, state, decided, now)]
    if state.waiting is not None:  # its expiry, left while the definition was missing
        history.insert(0, versions.resumed(ctx, state))
    try:
        etag = ctx.store.update_state(decided.state, current.etag, history)
    except (ConcurrencyConflict, NotFound):
        if budgeted:
            ctx.retry_budget.give_back()  # nothing was sent
        return "lost_race"  # another Supervisor, or the step finished just now
    if state.waiting is not None:
        versions.forget(ctx, state)
    log.warning(
        "sas.step_expired",
        extra={
            "order_id": state.order_id,
            "step": step,
            "attempt": state.attempt,
            "failures": state.failure_count + decided.counted,
            "counted": decided.counted,
            "action": decided.action,
        },
    )
    metrics.instruments.recoveries.add(
        1, {"sas.action": decided.action.value, telemetry.STEP: step}
    )
    if not decided.state.is_terminal:
        markers.rearm(marker, _next_look(ctx, decided.state, now))
    _request_recovery(ctx, decided, step, etag, now)
    return decided.action.value  # the log line shows "retry", not the enum's repr


def _expiry_history(
    ctx: Context, state: OrderState, decided: Expiry, now: datetime
) -> HistoryEntry:
    step = ctx.definition(state).step(state.step_index)
    detail = None
    cancelled = state.cancelled is not None and state.mode == "do"
    if state.complete_by is not None and (cancelled or state.suspended):
        why = "cancelled" if cancelled else "suspended"
        detail = f"{state.process_state} past {readable(state.complete_by)}, {STEERED} ({why})"
    elif state.complete_by is not None and not decided.counted:
        detail = (
            f"{state.process_state} past {readable(state.complete_by)}, {NOT_COUNTED} "
            f"({decided.state.load_expiries} of {ctx.policy.max_load_expiries})"
        )
    elif state.complete_by is not None:
        detail = (
            f"{state.process_state} past {readable(state.complete_by)}, "
            f"failure {state.failure_count + 1} of {ctx.policy.threshold(step.max_failures)}"
        )
    return HistoryEntry(
        order_id=state.order_id,
        at=now,
        kind=f"expired_{decided.action}",
        attempt=state.attempt,
        step=step.name,
        mode=state.mode,
        actor=ctx.instance_id,
        detail=detail,
    )


def _request_recovery(ctx: Context, decided: Expiry, step: str, etag: str, now: datetime) -> None:
    """Ask for what the expiry decided: a retry after its backoff, compensation, or the
    status and alert of a finished order. The Supervisor never calls an agent itself."""
    new = decided.state
    if decided.action is ExpiryAction.RETRY:
        metrics.instruments.retries.add(1, {"sas.kind": "step", telemetry.STEP: step})
        then.request_schedule(ctx, new, delay_seconds=decided.delay.total_seconds())
        then.notify(ctx, new, "step_retry", now, step=step)
    elif decided.action is ExpiryAction.COMPENSATE:
        then.compensate(ctx, new, reason="expired")
        then.notify(ctx, new, "compensating", now, detail=new.last_error)
    elif decided.action is ExpiryAction.HELD:
        log.info("sas.order_held", extra={"order_id": new.order_id, "step": step})
    elif decided.action is ExpiryAction.SKIPPED:
        _skipped(ctx, new, step, etag, now)
    else:
        then.finished(ctx, new, etag)


def _skipped(ctx: Context, new: OrderState, step: str, etag: str, now: datetime) -> None:
    """The next step asked of a Scheduler, or (the last step skipped) the finished order's
    status; its submitter is told of the skip either way."""
    log.warning("sas.step_skipped", extra={"order_id": new.order_id, "step": step})
    if not new.is_terminal:
        then.request_schedule(ctx, new)
    then.notify(ctx, new, "step_skipped", now, step=step)
    if new.is_terminal:
        then.finished(ctx, new, etag)


class BusyLanes:
    """Which queues hold messages, asked once per queue per sweep. A queue that cannot be
    asked counts as busy: recovery waits (a store or queue under strain is no reason to add
    retries), for the queue-wait limit at most."""

    def __init__(self, ctx: Context) -> None:
        self._transport = ctx.transport
        self._lock = threading.Lock()
        self._seen: dict[str, bool] = {}

    def busy(self, queue: str) -> bool:
        with self._lock:
            if queue not in self._seen:
                try:
                    self._seen[queue] = self._transport.holds_messages(queue)
                except Exception:  # unknown: wait (the queue-wait limit still bounds it)
                    log.warning("sas.queue_look_failed", extra={"queue": queue}, exc_info=True)
                    self._seen[queue] = True
            return self._seen[queue]


class MarkerWrites:
    """The markers a sweep re-arms or drops, each on the ETag it was read with. Every marker
    sits in one partition, so they are written a hundred to a request, as soon as a hundred
    are waiting (a long sweep loses none of them if it is cut short), and the rest at the end.
    A drop is sent after whatever the sweep did for its order (an alert first)."""

    BATCH = 100

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._rearms: list[tuple[LiveMarker, datetime]] = []
        self._drops: list[LiveMarker] = []

    def rearm(self, marker: LiveMarker, due_at: datetime) -> None:
        with self._lock:
            self._rearms.append((marker, due_at))
        self._maybe_flush()

    def drop(self, marker: LiveMarker) -> None:
        with self._lock:
            self._drops.append(marker)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        with self._lock:
            if len(self._rearms) + len(self._drops) < self.BATCH:
                return
        self.flush()

    def flush(self) -> None:
        with self._lock:
            rearms, drops, self._rearms, self._drops = self._rearms, self._drops, [], []
        if rearms or drops:
            self._store.rearm_live(rearms, drops)

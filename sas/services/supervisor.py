"""The Supervisor: finds expired records and requests recovery (docs/architecture.md, "Recovery").

It queries the in-flight index for the markers that are due (never the order history, never
every live order), and for each order whose deadline passed it counts a failure and either
asks for a retry after a backoff, starts compensation, or sets Error with one operator alert.
A marker that is due but whose order is healthy is re-armed to the order's next deadline. It
changes state only through writes conditional on the ETag it read, so several Supervisors,
doubled or missed ticks, and a late reply arriving at the same moment cannot double a
recovery. It never calls an agent itself.

A running step whose reply may still be waiting in the replies queue (a reply enqueued no
later than the step's deadline is still there) is not expired yet, for ``RetryPolicy.reply_hold``,
and after that for as long as the replies lane keeps draining (at most
``RetryPolicy.reply_hold_max``): expiring it would throw away a step that finished in time and
run it again. A reply taken may still be on its way through a busy host, so a step is held
for ``RetryPolicy.reply_in_flight`` past its deadline whatever the lane shows, and as long past
the first sweep that saw the lane without such a reply if the lane showed a host behind (such a
reply seen waiting that long already, or, at that first sweep, a front that had: a host behind
is about as slow to apply what it takes), never past ``RetryPolicy.reply_hold_max``.
Nothing is applied late by waiting: the agent sent that reply before its deadline, and the
fence still decides whether it applies.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta

from sas.domain.clock import Clock
from sas.domain.errors import ConcurrencyConflict, NotFound
from sas.domain.model import HistoryEntry, LiveMarker, OrderState
from sas.domain.transitions import ExpiryAction, RetryPolicy, expire, look_again_at
from sas.domain.wire import Priority
from sas.domain.workflow import shortest_budget, workflow_named
from sas.services import telemetry
from sas.services.consequences import AlertOutcome, Consequences
from sas.services.ports import StateStore, Transport
from sas.services.routes import Routes

log = logging.getLogger(__name__)

_FINISHED_UNREAD = "finished_unindexed"
"""A sweep's outcome for a marker a Scheduler marked finished: dropped, the order not read."""


class Supervisor:
    def __init__(
        self,
        store: StateStore,
        transport: Transport,
        routes: Routes,
        clock: Clock,
        instance_id: str,
        policy: RetryPolicy,
        *,
        orphan_grace: timedelta = timedelta(minutes=5),
        parallelism: int = 1,
        legacy_check: timedelta = timedelta(minutes=5),
        before_sweep: Sequence[Callable[[], object]] = (),
        after_sweep: Sequence[Callable[[], object]] = (),
    ) -> None:
        """``before_sweep``: each called before a sweep lists the due markers (the marker
        moves, drops and finish marks this process's Scheduler holds, which would otherwise
        wait for its next write: sent first, the sweep skips the markers they move and drops
        the ones they mark without reading the order). ``after_sweep``: each called after
        every sweep, even one that failed (the gauges, which decide themselves whether to
        sample). A hook that raises is logged and skipped."""
        self._store = store
        self._transport = transport
        self._routes = routes
        self._clock = clock
        self._instance_id = instance_id
        self._policy = policy
        self._orphan_grace = orphan_grace
        self._parallelism = max(parallelism, 1)
        self._legacy_check = legacy_check
        self._legacy_checked_at: datetime | None = None
        self._reply_heads = _LaneHeads(keep=policy.reply_hold_max)
        self._before_sweep = tuple(before_sweep)
        self._after_sweep = tuple(after_sweep)
        self._then = Consequences(
            store, transport, routes, clock, actor=instance_id, clock_skew=policy.clock_skew
        )

    def sweep(self) -> Counter[str]:
        """One pass over the due markers; returns what it did, by outcome."""
        _run_hooks(self._before_sweep)
        try:
            return self._sweep()
        finally:
            _run_hooks(self._after_sweep)

    def _sweep(self) -> Counter[str]:
        now = self._clock.now()
        self._adopt_legacy(now)
        due = self._store.list_due(now)
        replies = _OldestReplies(
            self._transport, self._routes, self._reply_heads, self._clock, started=now
        )
        rearms = _MarkerWrites(self._store)
        report: Counter[str] = Counter()

        def examine(marker: LiveMarker) -> str:
            try:
                return self._examine(marker, replies, rearms)
            except Exception:  # one broken order must not hide every order after it
                log.exception("sas.supervisor_examine_failed", extra={"order_id": marker.order_id})
                return "failed"

        if self._parallelism == 1 or len(due) < 2:
            report.update(examine(marker) for marker in due)
        else:
            with ThreadPoolExecutor(min(self._parallelism, len(due))) as pool:
                report.update(pool.map(examine, due))
        rearms.flush()
        if report.total():  # every due order was read once but the finished ones
            log.info(  # (benchmarks count the reads here)
                "sas.supervisor_sweep",
                extra={
                    "report": dict(report),
                    "orders_read": report.total() - report[_FINISHED_UNREAD],
                },
            )
        return report

    def _adopt_legacy(self, now: datetime) -> None:
        """Markers written by a release before the in-flight table (an upgrade with orders in
        flight, or old instances still running beside new ones during a deploy) are moved into
        it, due at once: looked for on this instance's first sweep and every few minutes."""
        last = self._legacy_checked_at
        if last is not None and now - last < self._legacy_check:
            return
        self._legacy_checked_at = now
        try:
            moved = self._store.adopt_legacy_markers(now)
        except Exception:  # an optimisation of an upgrade must never stop recovery
            log.warning("sas.legacy_markers_failed", exc_info=True)
            return
        if moved:
            log.warning("sas.legacy_markers_adopted", extra={"count": moved})

    def _examine(self, marker: LiveMarker, replies: _OldestReplies, rearms: _MarkerWrites) -> str:
        if marker.finished:
            # A Scheduler saw this submission's order finish, and nothing touched the marker
            # since (marker_moves.py): nothing left to watch, so not read.
            rearms.drop(marker)
            return _FINISHED_UNREAD
        now = self._clock.now()
        current = self._store.get_state(marker.order_id)
        if current is None:
            # Indexed by a submission that never inserted (a crash, or a rejected duplicate
            # id): wait out a generous grace in case the insert is still in flight.
            if now - marker.touched_at > self._orphan_grace and self._store.drop_live(marker):
                return "orphan_dropped"
            # Looked at again well before the grace ends: the insert may commit in between
            # (nothing touches the marker after it), and then the order's first deadline is
            # no further away than this.
            rearms.add(marker, min(marker.touched_at + self._orphan_grace, now + shortest_budget()))
            return "orphan_waiting"
        state = current.value
        if state.is_terminal:
            alert = self._then.settle_alert(state, current.etag)
            if alert is AlertOutcome.CLAIMED_ELSEWHERE:
                # Stays indexed until the alert is sent: looked at again once the claim lapses.
                lapses = (state.alert_claimed_until or now) + self._policy.clock_skew
                rearms.add(marker, max(lapses, now))
                return "alert_claimed_elsewhere"
            rearms.drop(marker)  # unless touched since: then its toucher's order decides
            if alert is AlertOutcome.SENT:
                return "alert_resent"
            return "unindexed"
        if state.complete_by is None or not self._policy.expired(state, now):
            rearms.add(marker, self._next_look(state, now))
            return "healthy"
        hold_ends = self._held_until(state, now, replies)
        if hold_ends is not None:
            log.info(
                "sas.expiry_held_for_reply",
                extra={"order_id": state.order_id, "attempt": state.attempt},
            )
            rearms.add(marker, min(hold_ends, now + self._policy.reply_recheck))
            return "held_for_reply"
        return self._expire(marker, current.etag, state, now, rearms)

    def _next_look(self, state: OrderState, now: datetime) -> datetime:
        due = look_again_at(state, now=now, workflow=workflow_named(state.workflow))
        if due <= now and state.complete_by is not None:
            # Within the skew allowance of its deadline: judged expired only this much later.
            return state.complete_by + self._policy.clock_skew
        return due

    def _held_until(
        self, state: OrderState, now: datetime, replies: _OldestReplies
    ) -> datetime | None:
        """When the hold of an expired running step ends, if a reply enqueued by its deadline
        may still be waiting or on its way (None: expire it now)."""
        if not state.is_running or state.complete_by is None:
            return None
        policy = self._policy
        deadline = state.complete_by + policy.clock_skew
        if now >= deadline + policy.reply_hold_max:
            return None
        oldest = replies.get(state.priority)  # looked at from the deadline on: see taken_at
        if now < deadline + policy.reply_in_flight:  # a reply taken may still be on its way
            return deadline + policy.reply_in_flight
        if oldest is not None and oldest <= deadline:  # a reply sent by the deadline waits
            ends = deadline + policy.reply_hold
            if now < ends:
                return ends
            # A backlog longer than the hold: wait on while it is being worked through.
            if replies.draining(state.priority, window=policy.reply_hold):
                return deadline + policy.reply_hold_max
            return None
        # Every reply sent by the deadline has been taken. If the lane showed a host behind
        # (replies waiting reply_in_flight already), the last one taken may still be on its
        # way: held that long from when a sweep first saw the lane without one.
        taken = replies.taken_at(state.priority, deadline, behind=policy.reply_in_flight)
        if taken is None:
            return None
        ends = min(taken + policy.reply_in_flight, deadline + policy.reply_hold_max)
        return ends if now < ends else None

    def _expire(
        self, marker: LiveMarker, etag: str, state: OrderState, now: datetime, rearms: _MarkerWrites
    ) -> str:
        # A timer has no trace of its own: the recovery joins the order's.
        with telemetry.order_span(
            telemetry.RECOVER,
            state.order_id,
            step=workflow_named(state.workflow).step(state.step_index).name,
            attempt=state.attempt,
            mode=state.mode,
            priority=state.priority,
            parent=state.traceparent,
        ) as span:
            outcome = self._recover(marker, etag, state, now, rearms)
            telemetry.annotate(span, outcome=outcome)
            return outcome

    def _recover(
        self, marker: LiveMarker, etag: str, state: OrderState, now: datetime, rearms: _MarkerWrites
    ) -> str:
        workflow = workflow_named(state.workflow)
        decided = expire(state, now=now, workflow=workflow, policy=self._policy)
        decided = replace(decided, state=self._then.claiming_alert(decided.state))
        step = workflow.step(state.step_index).name
        history = HistoryEntry(
            order_id=state.order_id,
            at=now,
            kind=f"expired_{decided.action}",
            attempt=state.attempt,
            step=step,
            mode=state.mode,
            actor=self._instance_id,
            detail=f"{state.process_state} past {state.complete_by.isoformat()}, "
            f"failure {state.failure_count + 1} of {self._policy.max_failures}"
            if state.complete_by
            else None,
        )
        try:
            etag = self._store.update_state(decided.state, etag, history)
        except (ConcurrencyConflict, NotFound):
            return "lost_race"  # another Supervisor, or the step finished just now
        extra = {
            "order_id": state.order_id,
            "step": step,
            "attempt": state.attempt,
            "failures": state.failure_count + 1,
            "action": decided.action,
        }
        log.warning("sas.step_expired", extra=extra)
        telemetry.instruments.recoveries.add(
            1, {"sas.action": decided.action.value, telemetry.STEP: step}
        )
        new = decided.state
        if not new.is_terminal:
            rearms.add(marker, self._next_look(new, now))
        if decided.action is ExpiryAction.RETRY:
            telemetry.instruments.retries.add(1, {"sas.kind": "step", telemetry.STEP: step})
            self._then.request_schedule(new, delay_seconds=decided.delay.total_seconds())
            self._then.notify.about(new, "step_retry", now, step=step)
        elif decided.action is ExpiryAction.COMPENSATE:
            self._then.compensate(new, reason="expired")
            self._then.notify.about(new, "compensating", now, detail=new.last_error)
        else:
            self._then.finished(new, etag)
        return decided.action


def _run_hooks(hooks: Sequence[Callable[[], object]]) -> None:
    for hook in hooks:
        try:
            hook()
        except Exception:  # housekeeping: never fails the sweep that recovers orders
            log.warning(
                "sas.sweep_hook_failed",
                extra={"hook": getattr(hook, "__qualname__", repr(hook))},
                exc_info=True,
            )


class _MarkerWrites:
    """The markers a sweep moves or drops, each on the ETag it was read with. Every marker
    sits in one partition, so they are written a hundred to a request, as soon as a hundred
    are waiting (a long sweep loses none of them if it is cut short), and the rest at the end.
    A drop is sent after whatever the sweep did for its order (an alert sent first)."""

    BATCH = 100

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._pending: list[tuple[LiveMarker, datetime | None]] = []

    def add(self, marker: LiveMarker, due_at: datetime) -> None:
        self._queue(marker, due_at)

    def drop(self, marker: LiveMarker) -> None:
        self._queue(marker, None)

    def _queue(self, marker: LiveMarker, due_at: datetime | None) -> None:
        with self._lock:
            self._pending.append((marker, due_at))
            if len(self._pending) < self.BATCH:
                return
            batch, self._pending = self._pending, []
        self._write(batch)

    def flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            self._write(batch)

    def _write(self, batch: list[tuple[LiveMarker, datetime | None]]) -> None:
        rearms = [(marker, due_at) for marker, due_at in batch if due_at is not None]
        drops = [marker for marker, due_at in batch if due_at is None]
        self._store.rearm_live(rearms, drops)


class _LaneHeads:
    """What earlier sweeps saw at the front of each replies lane: (when, oldest waiting), kept
    for ``keep``, so a sweep can tell a lane that is being worked through from one that is not
    moving."""

    SEEN = 32
    """Sightings kept per lane at most (a sweep adds at most one)."""

    def __init__(self, keep: timedelta) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._seen: dict[str, deque[tuple[datetime, datetime | None]]] = {}
        self._since: dict[str, datetime] = {}

    def add(self, queue: str, at: datetime, oldest: datetime | None) -> None:
        with self._lock:
            seen = self._seen.setdefault(queue, deque(maxlen=self.SEEN))
            if not seen or at - seen[-1][0] > self._keep:  # a watch starts (again)
                self._since[queue] = at
            seen.append((at, oldest))
            while seen and seen[0][0] < at - self._keep:
                seen.popleft()

    def watched_since(self, queue: str) -> datetime | None:
        """When this watch of the lane began: its first sighting with no gap longer than
        ``keep`` since (None: never watched)."""
        with self._lock:
            return self._since.get(queue)

    def taken_at(self, queue: str, deadline: datetime, *, behind: timedelta) -> datetime | None:
        """When a sweep (at or after the deadline) first saw every message enqueued by
        ``deadline`` gone, since the last one that saw one of them still waiting, provided the
        lane showed a host ``behind``: a message from by the deadline that had waited that
        long already at a sweep since the deadline, or, at that first sweep, a front that had
        (a host that far behind can be as slow to apply a reply once it has taken it, and one
        may have been taken just before). None if the first sweep to see them gone showed no
        host behind, or none has seen them gone yet. Sightings are read in the order they were
        made, whatever the clock said."""
        with self._lock:
            seen = [s for s in self._seen.get(queue, ()) if s[0] >= deadline]
        waited = False
        settled = False
        taken: datetime | None = None
        for at, oldest in seen:
            if oldest is not None and oldest <= deadline:
                if at - oldest >= behind:
                    waited = True
                settled, taken = False, None  # waiting (again: a host that let one go puts it back)
            elif not settled:
                # The first look that finds them gone: taken in between, maybe just before, by
                # a host that is behind if its replies waited that long then or before.
                settled = True
                if waited or (oldest is not None and at - oldest >= behind):
                    taken = at
        return taken

    def between(self, queue: str, start: datetime, end: datetime) -> list[datetime | None]:
        """The oldest waiting message of each sighting from ``start`` up to (not at) ``end``."""
        with self._lock:
            return [oldest for at, oldest in self._seen.get(queue, ()) if start <= at < end]


class _OldestReplies:
    """The oldest waiting message of each replies lane, each peeked at most once per sweep and
    only if a running step of that priority has expired (a quiet sweep costs nothing)."""

    def __init__(
        self,
        transport: Transport,
        routes: Routes,
        heads: _LaneHeads,
        clock: Clock,
        *,
        started: datetime,
    ) -> None:
        """``started``: when the sweep began (``draining`` never compares the lane with this
        sweep's own peek)."""
        self._transport = transport
        self._routes = routes
        self._heads = heads
        self._clock = clock
        self._started = started
        self._lock = threading.Lock()
        self._known: dict[str, datetime | None] = {}
        self._failed: set[str] = set()

    def get(self, priority: Priority) -> datetime | None:
        queue = self._routes.lane(self._routes.replies, priority)
        with self._lock:
            if queue not in self._known:
                try:
                    self._known[queue] = self._transport.oldest_waiting(queue)
                except Exception:  # a failed peek must not stop recovery: hold off nothing
                    log.warning("sas.replies_peek_failed", exc_info=True)
                    self._known[queue] = None
                    self._failed.add(queue)
                else:
                    self._heads.add(queue, self._clock.now(), self._known[queue])
            return self._known[queue]

    def taken_at(
        self, priority: Priority, deadline: datetime, *, behind: timedelta
    ) -> datetime | None:
        """See ``_LaneHeads.taken_at``; this sweep's own peek included, and None if it failed
        (a failed peek holds off nothing)."""
        self.get(priority)
        queue = self._routes.lane(self._routes.replies, priority)
        with self._lock:
            if queue in self._failed:
                return None
        return self._heads.taken_at(queue, deadline, behind=behind)

    def draining(self, priority: Priority, *, window: timedelta) -> bool:
        """Whether the lane's oldest waiting message is newer now than at some earlier sweep
        within ``window`` (a lane not watched for a whole window yet, by this Supervisor since
        it started or since a gap, counts as draining until it has been). A window, not the
        last sweep alone: a host takes messages in batches, which it hides while it works on
        them, so the front of the lane moves in steps."""
        current = self.get(priority)
        queue = self._routes.lane(self._routes.replies, priority)
        since = self._heads.watched_since(queue)
        if since is None or since > self._started - window:
            return True
        before = self._heads.between(queue, self._started - window, self._started)
        if not before:
            return True
        return current is not None and any(
            earlier is not None and current > earlier for earlier in before
        )

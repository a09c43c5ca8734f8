"""The Supervisor: finds expired records and requests recovery (docs/architecture.md, "Recovery").

It queries the in-flight index for the markers that are due (never the order history, never
every live order), and for each order whose deadline passed it counts a failure and either
asks for a retry after a backoff, starts compensation, or sets Error with one operator alert.
A marker that is due but whose order is healthy is re-armed to the order's next deadline. It
changes state only through writes conditional on the ETag it read, so several Supervisors,
doubled or missed ticks, and a late reply arriving at the same moment cannot double a
recovery. It never calls an agent itself.

A running step is expired as soon as its deadline (plus the clock-skew allowance) has passed,
whatever may still be queued for it: a reply its agent sent in time that is still on its way
applies when it arrives (``transitions.fence``), and the retry's call is answered by the remote
from the step's idempotency key.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta

from sas.domain.clock import Clock
from sas.domain.errors import ConcurrencyConflict, NotFound
from sas.domain.model import HistoryEntry, LiveMarker, OrderState
from sas.domain.transitions import ExpiryAction, RetryPolicy, expire, look_again_at
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
        rearms = _MarkerWrites(self._store)
        report: Counter[str] = Counter()

        def examine(marker: LiveMarker) -> str:
            try:
                return self._examine(marker, rearms)
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

    def _examine(self, marker: LiveMarker, rearms: _MarkerWrites) -> str:
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
        return self._expire(marker, current.etag, state, now, rearms)

    def _next_look(self, state: OrderState, now: datetime) -> datetime:
        due = look_again_at(state, now=now, workflow=workflow_named(state.workflow))
        if due <= now and state.complete_by is not None:
            # Within the skew allowance of its deadline: judged expired only this much later.
            return state.complete_by + self._policy.clock_skew
        return due

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

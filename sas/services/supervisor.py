"""The Supervisor: finds expired records and requests recovery (docs/architecture.md, "Recovery").

It sweeps the in-flight index (never the order history), and for each live order whose
deadline passed it counts a failure and either asks for a retry after a backoff, starts
compensation, or sets Error with one operator alert. It changes state only through writes
conditional on the ETag it read, so several Supervisors, doubled or missed ticks, and a late
reply arriving at the same moment cannot double a recovery. It never calls an agent itself.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from datetime import timedelta

from sas.domain.clock import Clock
from sas.domain.errors import ConcurrencyConflict, NotFound
from sas.domain.model import HistoryEntry, LiveMarker
from sas.domain.transitions import ExpiryAction, RetryPolicy, expire
from sas.domain.workflow import workflow_named
from sas.services.consequences import AlertOutcome, Consequences
from sas.services.ports import StateStore, Transport
from sas.services.routes import Routes

log = logging.getLogger(__name__)


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
    ) -> None:
        self._store = store
        self._clock = clock
        self._instance_id = instance_id
        self._policy = policy
        self._orphan_grace = orphan_grace
        self._then = Consequences(
            store, transport, routes, clock, actor=instance_id, clock_skew=policy.clock_skew
        )

    def sweep(self) -> Counter[str]:
        """One pass over the in-flight index; returns what it did, by outcome."""
        report: Counter[str] = Counter()
        for marker in self._store.list_live():
            try:
                report[self._examine(marker)] += 1
            except Exception:  # one broken order must not hide every order after it
                log.exception("sas.supervisor_examine_failed", extra={"order_id": marker.order_id})
                report["failed"] += 1
        if report.total() - report["healthy"]:
            log.info("sas.supervisor_sweep", extra={"report": dict(report)})
        return report

    def _examine(self, marker: LiveMarker) -> str:
        now = self._clock.now()
        current = self._store.get_state(marker.order_id)
        if current is None:
            # Indexed by a submission that never inserted (a crash, or a rejected duplicate
            # id): wait out a generous grace in case the insert is still in flight.
            if now - marker.touched_at > self._orphan_grace and self._store.drop_live(marker):
                return "orphan_dropped"
            return "orphan_waiting"
        state = current.value
        if state.is_terminal:
            alert = self._then.settle_alert(state, current.etag)
            if alert is AlertOutcome.CLAIMED_ELSEWHERE:
                return "alert_claimed_elsewhere"  # stays indexed until the alert is sent
            dropped = self._store.drop_live(marker)
            if alert is AlertOutcome.SENT:
                return "alert_resent"
            return "unindexed" if dropped else "retouched"
        if state.complete_by is None or not self._policy.expired(state, now):
            return "healthy"
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
            f"failure {state.failure_count + 1} of {self._policy.max_failures}",
        )
        try:
            etag = self._store.update_state(decided.state, current.etag, history)
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
        new = decided.state
        if decided.action is ExpiryAction.RETRY:
            self._then.request_schedule(new, delay_seconds=decided.delay.total_seconds())
            self._then.notify.status(new.reply_to, new.order_id, "step_retry", now, step=step)
        elif decided.action is ExpiryAction.COMPENSATE:
            self._then.request_schedule(new)
            self._then.notify.status(
                new.reply_to, new.order_id, "compensating", now, detail=new.last_error
            )
        else:
            self._then.finished(new, etag)
        return decided.action

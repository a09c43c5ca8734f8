"""The operators' health view: orders finished over time and how many failed, each remote
endpoint's breaker and load against its capacity, and the alerts waiting in the alerts queue.
The HTTP API, the dashboard and the `sas health` command all read it from here; it also names
the workflow versions orders wait for (sas/services/versions.py).

Each part is read on its own: one that cannot be read is named in ``problems`` and the others
are still shown. Throughput is counted from the orders' states as they are now (a resubmitted
order that then finished counts as finished, not as its earlier Error), by reading every order
updated in the window: an operator's look, never the order path's.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from sas.domain.breaker import BreakerPolicy, BreakerStatus, in_window
from sas.domain.clock import Clock
from sas.domain.endpoints import Endpoint, EndpointLoad
from sas.domain.errors import InvalidMessage
from sas.domain.messages import OperatorAlert, decode
from sas.domain.model import ProcessState
from sas.services.alert_book import AlertGroup, open_groups
from sas.services.breaker import BreakerStore
from sas.services.ports import BudgetStore, LoadStore, QueueDepth, QueuePeek, StateStore

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_BUCKETS = 61
"""An hour in minutes, and the minute under way."""
MAX_WINDOW = timedelta(days=7)
LOAD_STALE_AFTER = timedelta(seconds=5)
"""A process's load row older than this is not counted (it stopped, or stopped calling)."""
BUDGET_STALE_AFTER = timedelta(minutes=1)
"""A Supervisor's figure older than this is not counted: it publishes each sweep while any
retry was held back within the last minute, and once more when none was."""
FAILED = frozenset({ProcessState.ERROR, ProcessState.COMPENSATED})
"""Finished without doing the work: the failure rate's numerator."""
OUTCOMES = frozenset({ProcessState.PROCESSED, *FAILED})
"""What the app finished with. Closed, Cancelled and Terminated are operators' acts (an Error
order's failure was counted when it failed): counted apart, never as finished."""


@dataclass(frozen=True)
class Bucket:
    """Orders submitted in ``[start, start + bucket)``, and those that finished then, by the
    state they are in now."""

    start: datetime
    submitted: int = 0
    finished: Mapping[ProcessState, int] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(self.finished.get(state, 0) for state in FAILED)


@dataclass(frozen=True)
class EndpointHealth:
    agent: str
    endpoint: str
    target: str
    breaker: BreakerStatus
    """As last written: an open breaker whose ``opened_until`` passed lets the next call probe."""
    calls: int
    """Calls counted in the breaker's window (the last 30 s), as last written."""
    failures: int
    """Of them, the failures of the remote."""
    opened_until: datetime | None
    changed_at: datetime | None
    """When the breaker was last written; None: never (no failure yet)."""
    in_flight: int
    """Calls in flight, summed over the processes that published a count lately."""
    capacity: int | None
    processes: int


@dataclass(frozen=True)
class WaitingAlert:
    alert_id: str
    order_id: str
    reason: str
    at: datetime
    order_state: ProcessState | None
    """The order's state now: None if it is gone (purged)."""
    order_mode: str | None = None
    """``undo`` while it is being undone."""


@dataclass(frozen=True)
class WaitingOrders:
    reason: str
    orders: int


@dataclass(frozen=True)
class HealthReport:
    at: datetime
    since: datetime
    bucket: timedelta
    buckets: list[Bucket]
    endpoints: list[EndpointHealth]
    alerts: list[WaitingAlert]
    """The first alerts waiting in the alerts queue, oldest first (left in the queue)."""
    alerts_waiting: int | None
    """How many wait there, as the transport estimates it (None: could not be read)."""
    problems: list[str]
    waiting: list[WaitingOrders] = field(default_factory=list)
    """Orders waiting for a workflow version the app does not have (or has changed), by
    reason: read with the throughput (a waiting order is written every minute)."""
    retries_held_back: int | None = 0
    """Expired steps the Supervisors' retry budgets held back in their last minute: more than
    none, the app is saturated and those orders wait, uncounted (None: could not be read)."""
    open_alerts: list[AlertGroup] = field(default_factory=list)
    """Alerts neither acknowledged nor left behind by their order, by cause (``alert_book``)."""

    @property
    def saturated(self) -> bool:
        return bool(self.retries_held_back)

    @property
    def finished(self) -> int:
        return sum(n for b in self.buckets for state, n in b.finished.items() if state in OUTCOMES)

    @property
    def failed(self) -> int:
        return sum(b.failed for b in self.buckets)

    @property
    def failure_rate(self) -> float | None:
        """Errors and compensations among the orders the app finished in the window."""
        return None if self.finished == 0 else self.failed / self.finished


@dataclass(frozen=True)
class HealthSources:
    store: StateStore
    breakers: BreakerStore
    loads: LoadStore
    queues: QueuePeek
    depth: QueueDepth
    clock: Clock
    alerts_queue: str
    endpoints: Callable[[], Sequence[Endpoint]]
    """Every remote endpoint the app calls (read when asked, so settings load lazily)."""
    budgets: BudgetStore | None = None
    """The Supervisors' retries held back (None: not shown)."""


class Health:
    def __init__(self, sources: HealthSources) -> None:
        self._s = sources

    def report(self, window: timedelta, *, alerts: int = 20) -> HealthReport:
        """The view over the last ``window``, in at most MAX_BUCKETS equal buckets of whole
        minutes; at most ``alerts`` alerts listed."""
        if not timedelta(minutes=1) <= window <= MAX_WINDOW:
            raise InvalidMessage(f"the window must be 1 minute to {MAX_WINDOW.days} days")
        if not 1 <= alerts <= 100:
            raise InvalidMessage("alerts must be 1..100")
        now = self._s.clock.now()
        # Buckets of whole minutes on a fixed grid, enough of them to cover the whole window
        # (the first one may start before it) and the bucket now under way: MAX_BUCKETS at most.
        minutes = -(-int(window.total_seconds() // 60) // (MAX_BUCKETS - 1))
        bucket = timedelta(minutes=max(minutes, 1))
        since = _floor(now - window, bucket)
        problems: list[str] = []
        waiting: Counter[str] = Counter()
        buckets = _guarded(
            "throughput", problems, lambda: self._buckets(since, bucket, now, waiting)
        )
        endpoints = _guarded("endpoints", problems, self._endpoints)
        listed, alerts_waiting = _guarded("alerts", problems, lambda: self._alerts(alerts)) or (
            [],
            None,
        )
        held = _guarded("retry budget", problems, lambda: self._held_back(now))
        groups = _guarded("open alerts", problems, lambda: open_groups(self._s.store, now))
        return HealthReport(
            now, since, bucket, buckets or [], endpoints or [], listed, alerts_waiting, problems,
            [WaitingOrders(reason, n) for reason, n in sorted(waiting.items())], held,
            groups or [],
        )  # fmt: skip

    def _held_back(self, now: datetime) -> int:
        budgets = self._s.budgets
        if budgets is None:
            return 0
        return sum(
            max(row.held_back, 0) for row in budgets.read() if now - row.at <= BUDGET_STALE_AFTER
        )

    def _buckets(
        self, since: datetime, size: timedelta, now: datetime, waiting: Counter[str]
    ) -> list[Bucket]:
        starts = []
        start = since
        while start <= now:
            starts.append(start)
            start += size
        submitted = [0] * len(starts)
        finished: list[dict[ProcessState, int]] = [{} for _ in starts]
        for versioned in self._s.store.query_states(updated_after=since):
            state = versioned.value
            if state.waiting is not None and not state.is_terminal:
                waiting[state.waiting] += 1
            last = len(starts) - 1  # a time ahead of this clock (another's) counts as now
            if state.submitted_at >= since:
                submitted[min((state.submitted_at - since) // size, last)] += 1
            if state.finished_at is not None and state.finished_at >= since:
                slot = finished[min((state.finished_at - since) // size, last)]
                slot[state.process_state] = slot.get(state.process_state, 0) + 1
        return [
            Bucket(at, count, done)
            for at, count, done in zip(starts, submitted, finished, strict=True)
        ]

    def _endpoints(self) -> list[EndpointHealth]:
        now = self._s.clock.now()
        fresh: dict[str, list[EndpointLoad]] = {}
        for row in self._s.loads.read():
            if now - row.at <= LOAD_STALE_AFTER:
                fresh.setdefault(row.target, []).append(row)
        found = []
        for endpoint in self._s.endpoints():
            versioned = self._s.breakers.get(endpoint.target)
            state = None if versioned is None else versioned.value
            window = () if state is None else in_window(state.window, BreakerPolicy(), now)
            rows = fresh.get(endpoint.target, [])
            found.append(
                EndpointHealth(
                    agent=endpoint.agent,
                    endpoint=endpoint.name,
                    target=endpoint.target,
                    breaker=BreakerStatus.CLOSED if state is None else state.status,
                    calls=sum(tally.calls for tally in window),
                    failures=sum(tally.failures for tally in window),
                    opened_until=None if state is None else state.opened_until,
                    changed_at=None if state is None else state.updated_at,
                    in_flight=sum(max(row.in_flight, 0) for row in rows),
                    capacity=endpoint.capacity,
                    processes=sum(1 for row in rows if row.in_flight > 0),
                )
            )
        return found

    def _alerts(self, limit: int) -> tuple[list[WaitingAlert], int]:
        """The first ``limit`` alerts waiting, and how many wait."""
        waiting = self._s.depth.depth(self._s.alerts_queue)
        found = []
        for body in self._s.queues.peek(self._s.alerts_queue, limit):
            try:
                alert = decode(OperatorAlert, body)
                at = alert.at.astimezone(UTC)
            except (InvalidMessage, OverflowError) as exc:  # not the app's: said once here
                log.warning("sas.alert_unreadable error=%s", type(exc).__name__)
                continue
            versioned = self._s.store.get_state(alert.order_id)
            current = None if versioned is None else versioned.value
            found.append(
                WaitingAlert(
                    alert_id=alert.alert_id,
                    order_id=alert.order_id,
                    reason=alert.reason,
                    at=at,
                    order_state=None if current is None else current.process_state,
                    order_mode=None if current is None else current.mode,
                )
            )
        return sorted(found, key=lambda alert: (alert.at, alert.alert_id))[:limit], waiting


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _floor(at: datetime, size: timedelta) -> datetime:
    """``at`` down to a whole ``size`` since the epoch, so that buckets stay put as time goes."""
    return _EPOCH + ((at - _EPOCH) // size) * size


def _guarded(what: str, problems: list[str], read: Callable[[], T]) -> T | None:
    try:
        return read()
    except Exception as exc:  # one part unread must not hide the others
        log.warning("sas.health_read_failed part=%s", what, exc_info=True)
        first = (str(exc).strip().splitlines() or [""])[0]
        problems.append(f"{what}: {type(exc).__name__}: {first[:200]}")
        return None

"""The health view's logic (sas/services/health.py) on in-memory ports: buckets, failure rate,
breakers with load against capacity, waiting alerts with their orders' states now, the
retries the Supervisors held back, and one part that cannot be read leaving the others shown."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from rich.console import Console

from sas.domain.breaker import BreakerState, BreakerStatus, Tally
from sas.domain.endpoints import Endpoint, EndpointLoad, HeldRetries
from sas.domain.errors import InvalidMessage
from sas.domain.messages import OperatorAlert, encode
from sas.domain.model import OrderState, ProcessState, Versioned
from sas.services.health import Health, HealthSources
from sas.testing.memory import FakeClock, InMemoryBudgets, InMemoryStore
from sas_cli import views

NOW = datetime.fromisoformat("2026-11-26T12:30:20+00:00")


class Breakers:
    def __init__(self, *states: BreakerState) -> None:
        self.states = {state.name: state for state in states}

    def get(self, name: str) -> Versioned[BreakerState] | None:
        found = self.states.get(name)
        return None if found is None else Versioned(found, "e1")

    def put(self, state: BreakerState, etag: str | None) -> str:
        raise AssertionError("the health view never writes")


class Loads:
    def __init__(self, *rows: EndpointLoad) -> None:
        self.rows = list(rows)

    def publish(self, instance_id: str, counts: object, at: datetime) -> None:
        raise AssertionError("the health view never writes")

    def read(self) -> list[EndpointLoad]:
        return self.rows


class Queues:
    def __init__(self, bodies: list[bytes], error: Exception | None = None) -> None:
        self.bodies = bodies
        self.error = error
        self.peeked: list[tuple[str, int]] = []

    def peek(self, queue: str, limit: int) -> list[bytes]:
        self.peeked.append((queue, limit))
        if self.error is not None:
            raise self.error
        return self.bodies[:limit]

    def depth(self, queue: str) -> int:
        if self.error is not None:
            raise self.error
        return len(self.bodies)


def state(
    order_id: str,
    process_state: ProcessState,
    submitted: datetime,
    finished: datetime | None = None,
) -> OrderState:
    return OrderState(
        order_id=order_id,
        workflow="order",
        process_state=process_state,
        submitted_at=submitted,
        updated_at=finished or submitted,
        finished_at=finished,
    )


def health(
    store: InMemoryStore,
    *,
    breakers: Breakers | None = None,
    loads: Loads | None = None,
    queues: Queues | None = None,
    endpoints: tuple[Endpoint, ...] = (),
    budgets: InMemoryBudgets | None = None,
) -> Health:
    peek = queues or Queues([])
    return Health(
        HealthSources(
            store=store,
            breakers=breakers or Breakers(),
            loads=loads or Loads(),
            queues=peek,
            depth=peek,
            clock=FakeClock(NOW),
            alerts_queue="sas-alerts",
            endpoints=lambda: endpoints,
            budgets=budgets,
        )
    )


def put(store: InMemoryStore, *states: OrderState) -> None:
    for one in states:
        store.states[one.order_id] = (one, f"W/{one.order_id}")


def minutes_ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def test_orders_are_counted_in_the_minute_they_were_submitted_and_finished():
    store = InMemoryStore()
    put(
        store,
        state("a", ProcessState.PROCESSED, minutes_ago(3), minutes_ago(2.9)),
        state("b", ProcessState.ERROR, minutes_ago(3), minutes_ago(1)),
        state("c", ProcessState.COMPENSATED, minutes_ago(2), minutes_ago(0.1)),
        state("d", ProcessState.PROCESSING, minutes_ago(0.2)),
        state("old", ProcessState.PROCESSED, minutes_ago(200), minutes_ago(90)),
    )
    report = health(store).report(timedelta(minutes=10))
    assert report.bucket == timedelta(minutes=1)
    assert len(report.buckets) == 11  # ten whole minutes back, and the one under way
    assert report.buckets[0].start == datetime.fromisoformat("2026-11-26T12:20:00+00:00")
    assert report.buckets[-1].start == datetime.fromisoformat("2026-11-26T12:30:00+00:00")
    by_minute = {b.start.minute: b for b in report.buckets}
    assert by_minute[27].submitted == 2 and by_minute[27].finished == {ProcessState.PROCESSED: 1}
    assert by_minute[29].finished == {ProcessState.ERROR: 1}
    assert by_minute[30].submitted == 1 and by_minute[30].failed == 1
    assert sum(b.submitted for b in report.buckets) == 4  # "old" is outside the window
    assert (report.finished, report.failed) == (3, 2)
    assert report.failure_rate == pytest.approx(2 / 3)
    assert report.problems == []


def test_a_day_has_sixty_one_buckets_and_none_finished_has_no_rate():
    report = health(InMemoryStore()).report(timedelta(hours=24))
    assert report.bucket == timedelta(minutes=24)
    assert len(report.buckets) == 61
    assert report.failure_rate is None


@pytest.mark.parametrize("minutes", [1, 7, 59, 60, 61, 90, 1439, 1440, 1441, 10079, 10080])
def test_the_buckets_cover_the_whole_window_and_stay_on_one_grid(minutes):
    window = timedelta(minutes=minutes)
    report = health(InMemoryStore()).report(window)
    assert len(report.buckets) <= 61
    assert NOW - window - report.bucket < report.since <= NOW - window
    assert report.buckets[0].start == report.since
    assert report.buckets[-1].start <= NOW < report.buckets[-1].start + report.bucket
    later = Health(replace(health(InMemoryStore())._s, clock=FakeClock(NOW + timedelta(days=1))))
    # A day on, the grid has not moved (whole buckets since the epoch, not since midnight).
    assert (later.report(window).since - report.since) % report.bucket == timedelta(0)


def test_an_error_order_closed_now_is_not_a_failure_now():
    store = InMemoryStore()
    failed_long_ago = state("old", ProcessState.CLOSED, minutes_ago(5000), minutes_ago(2))
    put(store, failed_long_ago, state("new", ProcessState.PROCESSED, minutes_ago(3), NOW))
    report = health(store).report(timedelta(minutes=10))
    assert (report.finished, report.failed, report.failure_rate) == (1, 0, 0.0)
    assert sum(b.finished.get(ProcessState.CLOSED, 0) for b in report.buckets) == 1


def test_a_time_ahead_of_the_operators_clock_counts_in_the_last_bucket():
    store = InMemoryStore()
    ahead = NOW + timedelta(minutes=2)  # another instance's clock
    put(store, state("x", ProcessState.PROCESSED, ahead, ahead))
    report = health(store).report(timedelta(minutes=5))
    assert report.buckets[-1].submitted == 1
    assert report.buckets[-1].finished == {ProcessState.PROCESSED: 1}


@pytest.mark.parametrize("window", [timedelta(seconds=30), timedelta(days=8)])
def test_a_window_out_of_range_is_refused(window):
    with pytest.raises(InvalidMessage, match="window"):
        health(InMemoryStore()).report(window)


def test_each_endpoint_shows_its_breaker_and_its_fresh_load_against_capacity():
    primary = Endpoint("payment", "primary", "http://p", capacity=4)
    backup = Endpoint("payment", "backup", "http://b", capacity=2)
    shipping = Endpoint("shipping", "default", "http://s")
    opened = BreakerState(
        name=primary.target,
        updated_at=minutes_ago(0.1),
        status=BreakerStatus.OPEN,
        window=(
            Tally(NOW - timedelta(seconds=60), 9, 1),  # aged out of the window
            Tally(NOW - timedelta(seconds=10), 4, 3),
            Tally(NOW - timedelta(seconds=4), 6, 3),
        ),
        opened_until=NOW + timedelta(seconds=8),
    )
    loads = Loads(
        EndpointLoad(primary.target, "i1", 2, NOW - timedelta(seconds=1)),
        EndpointLoad(primary.target, "i2", 1, NOW - timedelta(seconds=2)),
        EndpointLoad(primary.target, "gone", 9, NOW - timedelta(seconds=30)),  # stale
        EndpointLoad(backup.target, "i1", 0, NOW),
    )
    report = health(
        InMemoryStore(),
        breakers=Breakers(opened),
        loads=loads,
        endpoints=(primary, backup, shipping),
    ).report(timedelta(minutes=5))
    found = {e.target: e for e in report.endpoints}
    assert found[primary.target].breaker is BreakerStatus.OPEN
    assert (found[primary.target].calls, found[primary.target].failures) == (10, 6)
    assert found[primary.target].opened_until == opened.opened_until
    assert (found[primary.target].in_flight, found[primary.target].processes) == (3, 2)
    assert found[primary.target].capacity == 4
    assert (found[backup.target].in_flight, found[backup.target].processes) == (0, 0)
    never = found[shipping.target]
    assert (never.breaker, never.changed_at, never.capacity) == (BreakerStatus.CLOSED, None, None)


def test_waiting_alerts_are_listed_oldest_first_with_their_orders_state_now():
    store = InMemoryStore()
    put(store, state("o1", ProcessState.CLOSED, minutes_ago(9), minutes_ago(1)))
    alerts = [
        OperatorAlert(alert_id="a2", order_id="o2", reason="refund refused", at=minutes_ago(2)),
        OperatorAlert(alert_id="a1", order_id="o1", reason="ship refused", at=minutes_ago(5)),
    ]
    odd = b'{"type":"OperatorAlert","alert_id":"a0","order_id":"o0","reason":"x",'
    odd += b'"at":"0001-01-01T00:30:00+01:00"}'  # well formed, but no UTC time exists for it
    paris = timezone(timedelta(hours=1))
    alerts[0] = alerts[0].model_copy(update={"at": alerts[0].at.astimezone(paris)})
    queues = Queues([encode(alert) for alert in alerts] + [b"not an alert", odd])
    report = health(store, queues=queues).report(timedelta(minutes=5), alerts=10)
    assert [(a.alert_id, a.order_state) for a in report.alerts] == [
        ("a1", ProcessState.CLOSED),
        ("a2", None),  # purged, or never stored
    ]
    assert all(a.at.utcoffset() == timedelta(0) for a in report.alerts)
    assert report.alerts_waiting == 4
    assert queues.peeked == [("sas-alerts", 10)]


def test_a_part_that_cannot_be_read_is_named_and_the_others_are_shown():
    store = InMemoryStore()
    put(store, state("a", ProcessState.PROCESSED, minutes_ago(1), minutes_ago(0.5)))
    queues = Queues([], error=PermissionError("no Listen right\nsecond line"))
    report = health(
        store, queues=queues, endpoints=(Endpoint("shipping", "default", "http://s"),)
    ).report(timedelta(minutes=5))
    assert report.finished == 1
    assert len(report.endpoints) == 1
    assert (report.alerts, report.alerts_waiting) == ([], None)
    assert report.problems == ["alerts: PermissionError: no Listen right"]


def test_retries_held_back_in_the_last_minute_say_the_app_is_saturated():
    budgets = InMemoryBudgets()
    budgets.publish(HeldRetries("supervisor-a", 7, NOW - timedelta(seconds=10)))
    budgets.publish(HeldRetries("supervisor-b", 3, NOW - timedelta(seconds=50)))
    budgets.publish(HeldRetries("supervisor-old", 40, NOW - timedelta(minutes=2)))  # stale
    report = health(InMemoryStore(), budgets=budgets).report(timedelta(minutes=5))
    assert (report.retries_held_back, report.saturated) == (10, True)
    assert views.health_document(report)["saturated"] is True
    console = Console(record=True, width=200)
    console.print(views.health(report, "sas-alerts"))
    assert "saturated: 10 expired step(s)" in console.export_text()

    budgets.publish(HeldRetries("supervisor-a", 0, NOW))  # cleared: none held back since
    budgets.publish(HeldRetries("supervisor-b", 0, NOW))
    calm = health(InMemoryStore(), budgets=budgets).report(timedelta(minutes=5))
    assert (calm.retries_held_back, calm.saturated) == (0, False)
    assert views.health_document(calm)["retries_held_back"] == 0

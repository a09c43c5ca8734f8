"""The circuit breaker's shared state on real Azurite: two instances, as two worker processes
would have them (each its own TableClient and cache), agree through ETag-conditional writes."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import TableClient

from sas.adapters.breaker_table import TableBreakerStore
from sas.domain.breaker import BreakerPolicy, BreakerState, BreakerStatus, Tally, closed_breaker
from sas.domain.errors import AlreadyExists, ConcurrencyConflict, NotFound, TransientRemoteError
from sas.domain.wire import BREAKER_PARTITION
from sas.services.breaker import CircuitBreaker
from sas.testing import FakeClock

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC)
POLICY = BreakerPolicy(
    failure_ratio=0.6,
    minimum_calls=3,
    open_for=timedelta(seconds=10),
    probe_lease=timedelta(seconds=4),
)


class CountingStore(TableBreakerStore):
    """The real adapter, counting the races it reports."""

    def __init__(self, table: TableClient) -> None:
        super().__init__(table)
        self.conflicts = 0

    def put(self, state: BreakerState, etag: str | None) -> str:
        try:
            return super().put(state, etag)
        except (ConcurrencyConflict, AlreadyExists):
            self.conflicts += 1
            raise


class Agent:
    """What an agent does around each remote call, counting the calls that went out."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker
        self.calls = 0

    def call(self, *, service_up: bool) -> str:
        try:
            self.breaker.before_call()
        except TransientRemoteError:
            return "refused"
        self.calls += 1
        if service_up:
            self.breaker.record_success()
            return "ok"
        self.breaker.record_failure()
        return "failed"


def second_client(azurite, table: TableClient) -> TableClient:
    return TableClient.from_connection_string(azurite.connection_string, table.table_name)


def test_breaker_opens_during_an_outage_and_closes_after(azurite, table):
    clock = FakeClock(T0)
    store_a, store_b = CountingStore(table), CountingStore(second_client(azurite, table))
    a = Agent(CircuitBreaker(store_a, clock, "payment", POLICY, cache_ttl=1.0, instance_id="a"))
    b = Agent(CircuitBreaker(store_b, clock, "payment", POLICY, cache_ttl=1.0, instance_id="b"))

    # Healthy: both call, nothing is written (each counts its success).
    assert (a.call(service_up=True), b.call(service_up=True)) == ("ok", "ok")
    assert store_a.get("payment") is None

    # The outage: each failure is written with its process's successes, into one window.
    assert a.call(service_up=False) == "failed"  # 1 of 2 failed
    assert b.call(service_up=False) == "failed"  # its create collides: re-read, 2 of 4
    assert a.call(service_up=False) == "failed"  # its ETag is stale: re-read, 3 of 5: open
    assert (store_a.conflicts, store_b.conflicts) == (1, 1)
    opened = store_b.get("payment")
    assert opened is not None
    assert opened.value.status is BreakerStatus.OPEN
    assert (opened.value.calls, opened.value.failures) == (5, 3)
    assert opened.value.opened_until == T0 + timedelta(seconds=10)

    # The open window: once b's cached view (closed) has aged out, neither calls.
    calls_before = (a.calls, b.calls)
    clock.advance(0.5)
    for _ in range(9):
        clock.advance(1)  # each cached view is 1 s old: both re-read the shared state
        assert (a.call(service_up=False), b.call(service_up=False)) == ("refused", "refused")
    assert (a.calls, b.calls) == calls_before
    # Now T0+9.5: both caches hold the same open state and ETag.

    # After the window both try at the same instant with that cached ETag: one probes.
    clock.advance(0.5)
    conflicts_before = store_a.conflicts + store_b.conflicts
    assert clock.now() == opened.value.opened_until
    barrier = threading.Barrier(2)
    outcomes: dict[str, BaseException | None] = {}

    def attempt(name: str, agent: Agent) -> None:
        barrier.wait()
        try:
            agent.breaker.before_call()
            outcomes[name] = None
        except TransientRemoteError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=attempt, args=(n, x)) for n, x in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["a", "b"]
    probers = [name for name, error in outcomes.items() if error is None]
    assert len(probers) == 1
    (loser,) = {"a", "b"} - set(probers)
    refused = outcomes[loser]
    assert isinstance(refused, TransientRemoteError)
    assert refused.retry_after == pytest.approx(4.0)
    assert store_a.conflicts + store_b.conflicts == conflicts_before + 1  # If-Match at Azurite
    probing = store_a.get("payment")
    assert probing is not None
    assert probing.value.status is BreakerStatus.HALF_OPEN
    assert probing.value.probe_owner is not None
    assert probing.value.probe_owner.startswith(f"{probers[0]}:")

    # The probe succeeds: closed for both (for the other once its cached view ages out).
    prober = a if probers[0] == "a" else b
    other = b if prober is a else a
    prober.breaker.record_success()
    closed = store_b.get("payment")
    assert closed is not None
    assert closed.value == closed_breaker("payment", clock.now())
    clock.advance(1)
    assert (prober.call(service_up=True), other.call(service_up=True)) == ("ok", "ok")


def test_a_failed_probe_on_azurite_reopens_it_for_both(azurite, table):
    clock = FakeClock(T0)
    a = CircuitBreaker(TableBreakerStore(table), clock, "payment", POLICY, instance_id="a")
    b = CircuitBreaker(
        TableBreakerStore(second_client(azurite, table)), clock, "payment", POLICY, instance_id="b"
    )
    for _ in range(3):
        a.record_failure()
    clock.advance(10)
    a.before_call()
    with pytest.raises(TransientRemoteError):
        b.before_call()
    a.record_failure()
    for breaker in (a, b):
        clock.advance(1)
        with pytest.raises(TransientRemoteError) as caught:
            breaker.before_call()
        assert caught.value.retry_after is not None and caught.value.retry_after > 7


def test_state_round_trips_and_a_stale_etag_write_is_rejected(table):
    store = TableBreakerStore(table)
    window = (Tally(T0, 7, 4), Tally(T0 + timedelta(seconds=5), 3, 1))
    probing = BreakerState(
        "payment",
        T0,
        BreakerStatus.HALF_OPEN,
        window,
        probe_until=T0 + timedelta(seconds=4),
        probe_owner="a:7",
    )
    first = store.put(closed_breaker("payment", T0), None)
    with pytest.raises(AlreadyExists):
        store.put(closed_breaker("payment", T0), None)
    second = store.put(probing, first)
    read = store.get("payment")
    assert read is not None
    assert read.value == probing
    assert read.value.probe_until is not None and read.value.probe_until.tzinfo is not None
    assert read.etag == second

    with pytest.raises(ConcurrencyConflict):
        store.put(replace(probing, probe_owner="b:1"), first)  # stale: someone wrote since
    kept = store.get("payment")
    assert kept is not None and kept.value.probe_owner == "a:7"

    # REPLACE clears the fields the new state no longer has.
    store.put(closed_breaker("payment", T0 + timedelta(seconds=5)), second)
    entity = table.get_entity(BREAKER_PARTITION, "payment")
    assert "ProbeUntil" not in entity and "ProbeOwner" not in entity and "Window" not in entity
    assert entity["Status"] == "closed"
    read = store.get("payment")
    assert read is not None and read.value.window == ()


def test_a_row_deleted_since_read_is_a_lost_race(table):
    store = TableBreakerStore(table)
    etag = store.put(closed_breaker("payment", T0), None)
    table.delete_entity(BREAKER_PARTITION, "payment")
    with pytest.raises(ConcurrencyConflict):
        store.put(closed_breaker("payment", T0), etag)


def test_a_missing_table_fails_open(azurite, table):
    missing = TableClient.from_connection_string(azurite.connection_string, "nosuchtable")
    store = TableBreakerStore(missing)
    with pytest.raises(NotFound):
        store.get("payment")
    with pytest.raises(NotFound):
        store.put(closed_breaker("payment", T0), None)
    breaker = CircuitBreaker(store, FakeClock(T0), "payment", POLICY)
    breaker.before_call()  # allowed: the breaker never fails the step
    breaker.record_failure()

"""The circuit breaker: pure transitions (the window's math), the shared-state service over a
store with ETag semantics (cache, successes written late, races, fail open), and the agent
honouring it inside the deadline."""

from __future__ import annotations

import itertools
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, cast

import pytest

from sas.domain.breaker import (
    BreakerPolicy,
    BreakerState,
    BreakerStatus,
    Tally,
    admit,
    bucket_of,
    closed_breaker,
    count,
    in_window,
    on_failure,
    on_success,
    tripped,
)
from sas.domain.errors import AlreadyExists, ConcurrencyConflict, TransientRemoteError
from sas.domain.messages import OrderSubmitted, StepReply, StepRequest
from sas.domain.model import ProcessState, Versioned
from sas.domain.transitions import DEFERRAL
from sas.services.agent import AgentOutcome
from sas.services.breaker import CircuitBreaker
from sas.services.context import Routes
from sas.services.scheduler import ReplyOutcome
from sas.testing import (
    FakeClock,
    InMemoryQueues,
    InMemoryRemote,
    InMemoryStore,
    Outcome,
    fault,
    instance,
    ok,
    refuse,
)
from tests.harness import World
from tests.workflows import REGISTRY, basket

pytestmark = [pytest.mark.unit, pytest.mark.fast]

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
POLICY = BreakerPolicy(
    failure_ratio=0.5,
    minimum_calls=3,
    window=timedelta(seconds=30),
    buckets=6,
    open_for=timedelta(seconds=10),
    probe_lease=timedelta(seconds=4),
)


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


# --- a store with Table Storage's ETag semantics ----------------------------------------------


class FakeBreakerStore:
    """Every write gets a new ETag; a stale ETag or a create over an existing row fails."""

    def __init__(self) -> None:
        self._etags = (f"W/{n}" for n in itertools.count(1))
        self.rows: dict[str, tuple[BreakerState, str]] = {}
        self.reads = 0
        self.writes = 0
        self.conflicts = 0
        self.fail: Exception | None = None
        self.always_conflict = False
        self.lose_next_reply = False
        """Apply the next write but report a conflict, as when the SDK retries a write that
        landed and its retry then fails the If-Match check."""

    def get(self, name: str) -> Versioned[BreakerState] | None:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        found = self.rows.get(name)
        return None if found is None else Versioned(*found)

    def put(self, state: BreakerState, etag: str | None) -> str:
        if self.fail is not None:
            raise self.fail
        found = self.rows.get(state.name)
        if self.always_conflict or (etag is None and found is not None):
            self.conflicts += 1
            raise AlreadyExists(state.name) if etag is None else ConcurrencyConflict(state.name)
        if etag is not None and (found is None or found[1] != etag):
            self.conflicts += 1
            raise ConcurrencyConflict(state.name)
        new = next(self._etags)
        self.rows[state.name] = (state, new)
        self.writes += 1
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise ConcurrencyConflict(state.name)
        return new

    def state(self, name: str = "payment") -> BreakerState:
        return self.rows[name][0]


def breaker(
    store: FakeBreakerStore,
    clock: FakeClock,
    *,
    instance: str = "a",
    policy: BreakerPolicy = POLICY,
    cache_ttl: float = 1.0,
) -> CircuitBreaker:
    return CircuitBreaker(store, clock, "payment", policy, cache_ttl, instance_id=instance)


def refusal(b: CircuitBreaker) -> TransientRemoteError:
    with pytest.raises(TransientRemoteError) as caught:
        b.before_call()
    return caught.value


def open_breaker(store: FakeBreakerStore, clock: FakeClock) -> CircuitBreaker:
    b = breaker(store, clock, instance="opener")
    for _ in range(POLICY.minimum_calls):
        b.record_failure()
    assert store.state().status is BreakerStatus.OPEN
    return b


# --- pure transitions -------------------------------------------------------------------------


def test_a_closed_breaker_allows_without_any_change():
    state = closed_breaker("payment", T0)
    admission = admit(state, POLICY, now=T0, caller="c1")
    assert admission.allowed and not admission.changed and admission.state is state


def test_buckets_are_aligned_and_the_window_keeps_the_current_one_and_those_before_it():
    assert POLICY.bucket == seconds(5)
    assert bucket_of(T0 + seconds(4.999), POLICY) == T0
    assert bucket_of(T0 + seconds(5), POLICY) == T0 + seconds(5)
    window = tuple(Tally(T0 + seconds(5 * n), 1) for n in range(8))  # 12:00:00 to 12:00:35
    kept = in_window(window, POLICY, now=T0 + seconds(39))  # the bucket of 12:00:35 and 5 more
    assert [t.start for t in kept] == [T0 + seconds(5 * n) for n in range(2, 8)]


def test_it_opens_only_with_the_minimum_of_calls_and_the_ratio_both_reached():
    state = closed_breaker("payment", T0)
    for _ in range(2):  # 2 of 2 failed, but 3 calls are the minimum
        state = on_failure(state, POLICY, now=T0)
    assert (state.status, state.calls, state.failures) == (BreakerStatus.CLOSED, 2, 2)
    opened = on_failure(state, POLICY, now=T0 + seconds(1))
    assert (opened.status, opened.calls, opened.failures) == (BreakerStatus.OPEN, 3, 3)
    assert opened.opened_until == T0 + seconds(11)

    ratio = BreakerPolicy(failure_ratio=0.6, minimum_calls=10)
    assert not tripped([Tally(T0, 10, 5)], ratio)
    assert tripped([Tally(T0, 6, 3), Tally(T0 + seconds(5), 4, 3)], ratio)  # 6 of 10
    assert not tripped([Tally(T0, 9, 9)], ratio)  # too few calls


def test_successes_in_the_window_keep_the_ratio_below_and_aged_ones_do_not():
    successes = (Tally(T0, 5),)
    state = count(closed_breaker("payment", T0), POLICY, now=T0, tallies=successes)
    for _ in range(4):
        state = on_failure(state, POLICY, now=T0 + seconds(1))
    assert (state.status, state.calls, state.failures) == (BreakerStatus.CLOSED, 9, 4)
    state = on_failure(state, POLICY, now=T0 + seconds(29))  # 5 of 10: the ratio
    assert state.status is BreakerStatus.OPEN

    aged = count(closed_breaker("payment", T0), POLICY, now=T0, tallies=(Tally(T0, 50),))
    aged = on_failure(aged, POLICY, now=T0 + seconds(30))  # T0's bucket is out of the window
    aged = on_failure(aged, POLICY, now=T0 + seconds(30))
    assert (aged.calls, aged.failures, aged.status) == (2, 2, BreakerStatus.CLOSED)
    assert on_failure(aged, POLICY, now=T0 + seconds(31)).status is BreakerStatus.OPEN


def test_late_counts_land_in_their_own_buckets_added_to_what_is_there():
    state = on_failure(closed_breaker("payment", T0), POLICY, now=T0 + seconds(6))
    also = (Tally(T0, 3), Tally(T0 + seconds(5), 2))
    state = on_failure(state, POLICY, now=T0 + seconds(7), also=also)
    assert state.window == (Tally(T0, 3, 0), Tally(T0 + seconds(5), 4, 2))
    assert state.status is BreakerStatus.CLOSED


def test_an_open_breaker_refuses_until_opened_until_then_grants_one_probe_lease():
    opened = BreakerState("payment", T0, BreakerStatus.OPEN, opened_until=T0 + seconds(10))
    refused = admit(opened, POLICY, now=T0 + seconds(9.999), caller="c1")
    assert not refused.allowed and not refused.changed
    assert refused.retry_at == T0 + seconds(10)

    probe = admit(opened, POLICY, now=T0 + seconds(10), caller="c1")
    assert probe.allowed and probe.changed and probe.probe
    assert probe.state.status is BreakerStatus.HALF_OPEN
    assert probe.state.probe_owner == "c1"
    assert probe.state.probe_until == T0 + seconds(14)


def test_a_live_probe_lease_excludes_everyone_but_its_holder():
    half = BreakerState(
        "payment", T0, BreakerStatus.HALF_OPEN, probe_until=T0 + seconds(4), probe_owner="c1"
    )
    other = admit(half, POLICY, now=T0 + seconds(1), caller="c2")
    assert not other.allowed and other.retry_at == T0 + seconds(4)
    holder = admit(half, POLICY, now=T0 + seconds(1), caller="c1")
    assert holder.allowed and not holder.changed


def test_a_lapsed_probe_lease_is_taken_over():
    half = BreakerState(
        "payment", T0, BreakerStatus.HALF_OPEN, probe_until=T0 + seconds(4), probe_owner="c1"
    )
    takeover = admit(half, POLICY, now=T0 + seconds(4), caller="c2")
    assert takeover.allowed and takeover.changed
    assert takeover.state.probe_owner == "c2"
    assert takeover.state.probe_until == T0 + seconds(8)


def test_a_failed_probe_opens_it_again_and_a_successful_one_closes_it():
    half = BreakerState(
        "payment", T0, BreakerStatus.HALF_OPEN, probe_until=T0 + seconds(4), probe_owner="c1"
    )
    reopened = on_failure(half, POLICY, now=T0 + seconds(2))  # whatever the window holds
    assert reopened.status is BreakerStatus.OPEN
    assert reopened.opened_until == T0 + seconds(12)
    assert reopened.probe_owner is None and reopened.probe_until is None

    counted = replace(half, window=(Tally(T0, 5, 5),))
    closed = on_success(counted, POLICY, now=T0 + seconds(2))
    assert closed == closed_breaker("payment", T0 + seconds(2))  # its window emptied


def test_calls_that_end_while_it_is_open_change_nothing():
    """A straggler started before it opened: its failure says nothing new, and its success
    (a 60 % failing service still answers 40 %) is no sign the service recovered."""
    opened = BreakerState("payment", T0, BreakerStatus.OPEN, opened_until=T0 + seconds(10))
    assert on_failure(opened, POLICY, now=T0 + seconds(1)) is opened
    assert on_success(opened, POLICY, now=T0 + seconds(1)) is opened
    assert count(opened, POLICY, now=T0, tallies=(Tally(T0, 9),)) is opened


def test_a_success_is_counted_and_nothing_counted_changes_nothing():
    healthy = closed_breaker("payment", T0)
    assert count(healthy, POLICY, now=T0, tallies=()) is healthy
    once = on_success(healthy, POLICY, now=T0 + seconds(1))
    assert (once.status, once.calls, once.failures) == (BreakerStatus.CLOSED, 1, 0)


def test_policy_and_state_reject_nonsense():
    for bad, field in (
        ({"failure_ratio": 0}, "failure_ratio"),
        ({"failure_ratio": 1.5}, "failure_ratio"),
        ({"minimum_calls": 0}, "minimum_calls"),
        ({"window": timedelta(0)}, "window"),
        ({"buckets": 0}, "buckets"),
        ({"buckets": 61}, "buckets"),
        ({"open_for": timedelta(0)}, "open_for"),
        ({"probe_lease": timedelta(seconds=-1)}, "probe_lease"),
    ):
        with pytest.raises(ValueError, match=field):
            BreakerPolicy(**bad)
    with pytest.raises(ValueError, match="timezone-aware"):
        BreakerState("payment", datetime(2026, 11, 22, 12, 0))
    with pytest.raises(ValueError, match="failures"):
        Tally(T0, 1, 2)
    with pytest.raises(ValueError, match="in order"):
        BreakerState("payment", T0, window=(Tally(T0, 1), Tally(T0, 1)))


# --- the shared-state service -----------------------------------------------------------------


def test_failures_recorded_by_one_instance_open_it_for_another():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    a = breaker(store, clock, instance="a")
    b = breaker(store, clock, instance="b")
    a.record_failure()
    b.record_failure()
    a.record_failure()  # a's cached ETag is stale by now: a lost race, re-read, re-applied
    assert store.conflicts == 1
    assert store.state().status is BreakerStatus.OPEN
    assert store.state().failures == 3
    clock.advance(1)  # past b's cache TTL
    error = refusal(b)
    assert error.reason == "payment circuit open"
    assert error.retry_after == pytest.approx(9.0)


def test_concurrent_failure_counts_are_not_lost():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    a = breaker(store, clock, instance="a", policy=BreakerPolicy(minimum_calls=10))
    b = breaker(store, clock, instance="b", policy=BreakerPolicy(minimum_calls=10))
    a.before_call()
    b.before_call()  # both cache "never written"
    a.record_failure()
    b.record_failure()  # create collides (AlreadyExists): re-read, count on top
    a.record_failure()
    b.record_failure()  # both stale ETags (ConcurrencyConflict): re-read, count on top
    assert store.conflicts == 3
    assert store.state().failures == 4


def test_reads_are_cached_for_the_ttl_and_a_closed_breaker_writes_nothing():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = breaker(store, clock, cache_ttl=1.0)
    for _ in range(50):
        b.before_call()
        b.record_success()
        clock.advance(0.01)
    assert (store.reads, store.writes) == (1, 0)
    clock.advance(0.5)  # 1.0 s since the read
    b.before_call()
    assert store.reads == 2


def test_successes_are_written_only_while_the_window_holds_failures_once_per_ttl():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = breaker(store, clock, policy=BreakerPolicy(minimum_calls=100), cache_ttl=1.0)
    b.before_call()
    for _ in range(20):  # a healthy target: counted here, nothing written
        clock.advance(0.1)
        b.record_success()
    assert store.writes == 0
    b.record_failure()  # written at once, with the successes counted so far
    assert (store.writes, store.state().calls, store.state().failures) == (1, 21, 1)
    for _ in range(30):  # 3 s of successes while the window holds that failure
        clock.advance(0.1)
        b.record_success()
    assert (store.writes, store.state().calls) == (4, 51)  # one write a second
    clock.advance(30)
    b.before_call()  # the failure has aged out of the window: successes stay here again
    for _ in range(30):
        clock.advance(0.1)
        b.record_success()
    assert store.writes == 4


def test_another_process_s_successes_reach_the_window_and_keep_the_ratio_down():
    """``a``'s calls all succeed, ``b``'s all fail: ``b``'s alone would open it (10 of 10
    failed), but ``a`` writes its successes once it reads that the window holds failures."""
    store, clock = FakeBreakerStore(), FakeClock(T0)
    policy = BreakerPolicy(minimum_calls=10)
    a = breaker(store, clock, instance="a", policy=policy)
    b = breaker(store, clock, instance="b", policy=policy)
    for tick in range(300):  # 30 s: a call of a's every 0.1 s, one of b's every 1 s
        clock.advance(0.1)
        a.before_call()
        a.record_success()
        if tick % 10 == 9:
            b.before_call()
            b.record_failure()
    state = store.state()
    assert state.status is BreakerStatus.CLOSED
    assert state.failures >= 10 and state.calls >= 10 * state.failures


@pytest.mark.parametrize(("failing", "opens"), [(0.6, True), (0.2, False)])
def test_an_endpoint_failing_60_percent_of_calls_opens_it_and_20_percent_does_not(
    failing: float, opens: bool
):
    """The deployed policy, two processes sharing the breaker, a call every 0.1 s for a
    minute, each failing at random (seeded) with the probability ``failing``."""
    rng = random.Random(44)
    store, clock = FakeBreakerStore(), FakeClock(T0)
    processes = [CircuitBreaker(store, clock, "payment", instance_id=n) for n in "ab"]
    refused = 0
    for _ in range(600):
        clock.advance(0.1)
        process = rng.choice(processes)
        try:
            process.before_call()
        except TransientRemoteError:
            refused += 1
            continue
        if rng.random() < failing:
            process.record_failure()
        else:
            process.record_success()
    assert (refused > 0) is opens
    if not opens:
        state = store.state()
        assert state.status is BreakerStatus.CLOSED and state.calls >= BreakerPolicy().minimum_calls


class SlowReadStore(FakeBreakerStore):
    """A read that waits until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.Event()
        self.finish = threading.Event()
        self.slow = False

    def get(self, name: str) -> Versioned[BreakerState] | None:
        if self.slow:
            self.reading.set()
            assert self.finish.wait(5)
        return super().get(name)


def expired_copy_being_read() -> tuple[SlowReadStore, FakeClock, CircuitBreaker, threading.Thread]:
    """A breaker whose copy just expired, and a thread whose read of it has not returned yet."""
    store, clock = SlowReadStore(), FakeClock(T0)
    b = breaker(store, clock, cache_ttl=1.0)
    b.before_call()
    clock.advance(1.0)
    store.slow = True
    reader = threading.Thread(target=b.before_call)
    reader.start()
    assert store.reading.wait(5)
    return store, clock, b, reader


def test_when_the_copy_expires_one_thread_reads_and_the_others_go_on_with_the_copy():
    store, _, b, reader = expired_copy_being_read()
    for _ in range(10):
        b.before_call()  # the expired copy, no read of their own
        assert b.healthy()
    store.finish.set()
    reader.join(5)
    assert store.reads == 2
    store.slow = False
    b.before_call()  # the copy the reader brought is fresh
    assert store.reads == 2


def test_a_copy_two_ttls_old_is_not_used_while_a_slow_read_is_under_way():
    store, clock, b, reader = expired_copy_being_read()
    clock.advance(1.0)  # the read is still under way two TTLs after the copy was taken
    store.finish.set()
    b.before_call()  # reads for itself
    reader.join(5)
    assert store.reads == 3


def test_a_cached_view_is_stale_for_at_most_the_ttl():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = breaker(store, clock, instance="b", cache_ttl=1.0)
    b.before_call()  # caches "closed"
    clock.advance(0.5)
    open_breaker(store, clock)
    b.before_call()  # still inside the TTL: allowed on the cached view
    clock.advance(0.5)
    assert refusal(b).retry_after == pytest.approx(9.5)


def test_an_open_breaker_refuses_from_cache_without_table_traffic():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    opener = open_breaker(store, clock)
    reads = store.reads
    for _ in range(20):
        refusal(opener)
    assert store.reads == reads and store.writes == POLICY.minimum_calls


def test_after_the_open_window_exactly_one_instance_probes():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    open_breaker(store, clock)
    a = breaker(store, clock, instance="a", cache_ttl=60)
    b = breaker(store, clock, instance="b", cache_ttl=60)
    refusal(a)
    refusal(b)  # both now cache the same open state and ETag
    clock.advance(10)
    a.before_call()  # takes the probe
    error = refusal(b)  # its write with the cached ETag loses; the re-read shows a's lease
    assert error.retry_after == pytest.approx(4.0)
    assert store.conflicts == 1
    state = store.state()
    assert state.status is BreakerStatus.HALF_OPEN
    assert state.probe_owner is not None and state.probe_owner.startswith("a:")


def test_a_successful_probe_closes_it_for_everyone():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    open_breaker(store, clock)
    a, b = breaker(store, clock, instance="a"), breaker(store, clock, instance="b")
    clock.advance(10)
    a.before_call()
    refusal(b)
    a.record_success()
    assert store.state() == closed_breaker("payment", clock.now())
    clock.advance(1)
    b.before_call()


def test_a_failed_probe_opens_it_again_for_a_full_window():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    open_breaker(store, clock)
    a, b = breaker(store, clock, instance="a"), breaker(store, clock, instance="b")
    clock.advance(10)
    a.before_call()
    clock.advance(1)
    a.record_failure()
    assert store.state().status is BreakerStatus.OPEN
    assert store.state().opened_until == clock.now() + seconds(10)
    assert refusal(a).retry_after == pytest.approx(10.0)
    assert refusal(b).retry_after == pytest.approx(10.0)


def test_a_probe_whose_holder_vanished_is_taken_over_after_the_lease():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    open_breaker(store, clock)
    a, b = breaker(store, clock, instance="a"), breaker(store, clock, instance="b")
    clock.advance(10)
    a.before_call()  # ...and a's process dies before recording anything
    clock.advance(1)
    refusal(b)
    clock.advance(3)  # the 4 s lease has lapsed
    b.before_call()
    owner = store.state().probe_owner
    assert owner is not None and owner.startswith("b:")


def test_a_probe_write_that_landed_but_reported_a_conflict_is_still_ours():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    open_breaker(store, clock)
    a = breaker(store, clock, instance="a")
    clock.advance(10)
    store.lose_next_reply = True
    a.before_call()  # the re-read shows a lease held by this very call: allowed
    owner = store.state().probe_owner
    assert owner is not None and owner.startswith("a:")


def test_races_are_retried_a_bounded_number_of_times_then_the_call_is_allowed(caplog):
    store, clock = FakeBreakerStore(), FakeClock(T0)
    open_breaker(store, clock)
    clock.advance(10)
    store.always_conflict = True
    b = CircuitBreaker(store, clock, "payment", POLICY, instance_id="b", max_races=3)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sas.services.breaker"):
        b.before_call()  # taking the probe loses every race
        b.before_call()  # and so does the next call's
    assert store.conflicts == 6
    assert [r.msg for r in caplog.records] == ["sas.breaker_contended"] * 2


def test_a_failing_store_fails_open_and_is_left_alone_for_the_ttl(caplog):
    store, clock = FakeBreakerStore(), FakeClock(T0)
    open_breaker(store, clock)
    b = breaker(store, clock, instance="b", cache_ttl=1.0)
    store.fail = OSError("table unreachable")
    reads = store.reads
    with caplog.at_level(logging.WARNING, logger="sas.services.breaker"):
        b.before_call()  # open in the store, but the store cannot say so: allowed
        b.record_failure()
        b.record_success()
        b.before_call()
    assert store.reads == reads + 1  # paused after the first failure
    failed = [r for r in caplog.records if r.msg == "sas.breaker_store_failed"]
    assert len(failed) == 1
    assert failed[0].breaker == "payment" and failed[0].error == "OSError"
    clock.advance(1)
    store.fail = None
    refusal(b)  # the store is back and still says open


def test_a_failing_store_on_record_never_raises():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = breaker(store, clock)
    store.fail = RuntimeError("boom")
    b.record_failure()
    clock.advance(2)
    b.record_success()
    assert store.rows == {}


def test_state_changes_are_logged_with_stable_event_names(caplog):
    store, clock = FakeBreakerStore(), FakeClock(T0)
    with caplog.at_level(logging.INFO, logger="sas.services.breaker"):
        a = open_breaker(store, clock)
        clock.advance(10)
        a.before_call()
        a.record_failure()
        clock.advance(10)
        a.before_call()
        a.record_success()
    events = [r.msg for r in caplog.records]
    assert events == [
        "sas.breaker_opened",
        "sas.breaker_probe_taken",
        "sas.breaker_reopened",
        "sas.breaker_probe_taken",
        "sas.breaker_closed",
    ]
    assert caplog.records[0].opened_until == T0 + seconds(10)


# --- the agent with a breaker -----------------------------------------------------------------

ROUTES = Routes("orders", "scheduler", "replies", "alerts", {"payment": "agent-payment"})


def request(clock: FakeClock, budget_seconds: float) -> StepRequest:
    return StepRequest(
        order_id="o1",
        step="charge",
        step_index=1,
        attempt=4,
        action="charge",
        complete_by=clock.now() + timedelta(seconds=budget_seconds),
        idempotency_key="o1:charge",
        payload={"order_id": "o1"},
    )


def scripted(clock: FakeClock, *outcomes: Outcome) -> InMemoryRemote:
    """The remote, its payment service's charge answering ``outcomes`` in order."""
    remote = InMemoryRemote(clock)
    remote.script("payment", "charge", *outcomes)
    return remote


def times_of_calls(remote: InMemoryRemote, clock: FakeClock) -> list[datetime]:
    """When each call of ``remote`` is made from now on (a spy wrapped around its calls)."""
    at: list[datetime] = []
    perform = remote.perform

    def timed(agent: str, action: str, **call: Any) -> dict[str, Any]:
        at.append(clock.now())
        return perform(agent, action, **call)

    remote.perform = timed  # type: ignore[method-assign]
    return at


def agent(
    remote: InMemoryRemote, transport: InMemoryQueues, clock: FakeClock, b: CircuitBreaker
) -> Callable[[StepRequest], AgentOutcome]:
    """The payment agent, as its queue function calls it, of an instance that runs nothing else
    (agents keep no state in the store): ``b`` is the breaker of every target."""
    app = instance(InMemoryStore(), transport, ROUTES, clock, REGISTRY, "agent-payment")
    with_remote = app.with_remote(remote, breaker=lambda target: b, sleep=clock.sleep)
    return partial(with_remote.run_step, "payment")


def test_an_open_breaker_before_any_call_defers_the_step_at_once():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = open_breaker(store, clock)  # open for 10 s: other orders' failures
    reopens = store.state().opened_until
    assert reopens is not None
    remote, transport = InMemoryRemote(clock), InMemoryQueues(clock)
    for budget in (5, 30):  # whether or not the circuit closes within the budget
        started = clock.now()
        assert agent(remote, transport, clock, b)(request(clock, budget)) is AgentOutcome.DEFERRED
        assert clock.now() == started  # no thread sleeps through the open window
    assert remote.calls == []
    replies = [cast(StepReply, sent.message) for sent in transport.sent]
    assert [r.outcome for r in replies] == ["deferred", "deferred"]
    wait = (reopens - clock.now()).total_seconds()
    assert all(r.retry_after == pytest.approx(wait, abs=0.01) for r in replies)


def test_an_open_breaker_after_a_failed_call_is_waited_for_then_probed():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = breaker(store, clock, policy=BreakerPolicy(minimum_calls=1))
    remote = scripted(clock, fault("503"), ok({"effect_id": "e"}))
    transport = InMemoryQueues(clock)
    at = times_of_calls(remote, clock)
    assert agent(remote, transport, clock, b)(request(clock, 30)) is AgentOutcome.REPLIED
    assert len(at) == 2 and at[1] - at[0] >= POLICY.open_for  # its own failure opened it
    assert [cast(StepReply, sent.message).outcome for sent in transport.sent] == ["ok"]
    assert store.state().status is BreakerStatus.CLOSED


def test_remote_outage_opens_the_breaker_and_calls_then_only_probe_once_per_window():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = breaker(store, clock)
    remote = scripted(clock, *[fault("503")] * 1000)
    at = times_of_calls(remote, clock)
    transport = InMemoryQueues(clock)
    assert agent(remote, transport, clock, b)(request(clock, 45)) is AgentOutcome.GAVE_UP
    assert transport.sent == []
    # three failures open it; after that one probe per 10 s window, each failing again
    probes = at[POLICY.minimum_calls :]
    assert 1 <= len(probes) <= 4
    gaps = [later - earlier for earlier, later in itertools.pairwise(at[2:])]
    assert all(gap >= seconds(10) for gap in gaps)
    assert store.state().status is BreakerStatus.OPEN


def test_a_permanent_refusal_counts_as_the_service_answering():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = breaker(store, clock, policy=BreakerPolicy(minimum_calls=10))
    b.record_failure()
    b.record_failure()
    remote = scripted(clock, refuse("HTTP 402 card declined"))
    transport = InMemoryQueues(clock)
    assert agent(remote, transport, clock, b)(request(clock, 30)) is AgentOutcome.REFUSED
    clock.advance(1)
    b.record_failure()  # written with the refusal, counted as a call that did not fail
    assert (store.state().calls, store.state().failures) == (4, 3)


def test_the_agent_writes_each_transient_failure_and_counts_its_success():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = breaker(store, clock, policy=BreakerPolicy(minimum_calls=10))
    remote = scripted(clock, fault("503"), fault("503"), ok({"effect_id": "e"}))
    transport = InMemoryQueues(clock)
    seen: list[tuple[int, int]] = []
    original = store.put

    def spy(state: BreakerState, etag: str | None) -> str:
        seen.append((state.calls, state.failures))
        return original(state, etag)

    store.put = spy  # type: ignore[method-assign]  # a spy wrapped around the fake's writes
    assert agent(remote, transport, clock, b)(request(clock, 30)) is AgentOutcome.REPLIED
    assert seen == [(1, 1), (2, 2)]  # the success came within cache_ttl of the last write
    clock.advance(1)
    b.record_success()  # a later one, while the window holds failures: both written
    assert seen[2:] == [(4, 2)]


def test_a_broken_breaker_store_never_fails_the_step():
    store, clock = FakeBreakerStore(), FakeClock(T0)
    b = breaker(store, clock)
    store.fail = OSError("table unreachable")
    remote, transport = scripted(clock, ok({"effect_id": "e"})), InMemoryQueues(clock)
    assert agent(remote, transport, clock, b)(request(clock, 30)) is AgentOutcome.REPLIED
    assert len(remote.calls) == 1 and len(transport.sent) == 1


def test_for_routing_an_open_breaker_is_unhealthy_until_its_probe_is_due():
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    store = FakeBreakerStore()
    policy = BreakerPolicy(minimum_calls=2, open_for=timedelta(seconds=10))
    breaker = CircuitBreaker(store, clock, "payment@west", policy, cache_ttl=0)
    assert breaker.healthy()
    breaker.record_failure()
    breaker.record_failure()  # open now
    assert not breaker.healthy()
    clock.advance(11)  # the probe is due: routing may send the call that takes it
    assert breaker.healthy()
    breaker.before_call()  # that call takes the probe: the others stay away meanwhile
    other = CircuitBreaker(store, clock, "payment@west", policy, cache_ttl=0)
    assert not other.healthy()


# --- an open circuit, order by order --------------------------------------------------------


def world_with_breaker(remote: Any = None) -> tuple[World, FakeBreakerStore]:
    """The shop, its payment calls behind one breaker (opened by other orders' failures)."""
    world = World(remote=remote)
    store = FakeBreakerStore()
    b = breaker(store, world.clock, cache_ttl=0)
    world.app = world.app.with_remote(
        world.remote,
        breaker=lambda target: b if target == "payment" else None,
        sleep=world.clock.sleep,
    )
    for _ in range(POLICY.minimum_calls):
        b.record_failure()
    return world, store


def test_an_order_deferred_by_an_open_circuit_waits_for_it_uncounted_then_finishes():
    world, store = world_with_breaker()
    reopens = store.state().opened_until
    assert reopens is not None
    world.submit(OrderSubmitted(order_id="d1", details=basket(sku="s1")))
    world.run()  # reserve done; charge deferred; its schedule request not due yet
    state = world.state("d1")
    assert (state.process_state, state.step_index) == (ProcessState.PENDING, 1)
    assert (state.failure_count, state.deferrals) == (0, 1)
    assert state.not_before is not None
    assert abs(state.not_before - reopens) < timedelta(seconds=0.1)  # when it may close
    assert [c for c in world.remote.calls if c[0] == "payment"] == []
    world.clock.advance((state.not_before - world.clock.now()).total_seconds())
    world.run()  # the probe goes through and closes the circuit
    state = world.state("d1")
    assert (state.process_state, state.failure_count) == (ProcessState.PROCESSED, 0)
    assert store.state().status is BreakerStatus.CLOSED
    assert "deferred" in world.history("d1")


def test_an_order_alone_with_a_service_down_fails_by_its_own_calls():
    """Deferred once (the circuit others opened), then it takes the probe itself: its own
    calls fail, and those failures count, so it is compensated as before."""
    world, _ = world_with_breaker(remote=lambda clock: scripted(clock, *[fault("503")] * 99))
    world.submit(OrderSubmitted(order_id="d2", details=basket(sku="s1")))
    for _ in range(100):
        world.run()
        if world.state("d2").is_terminal:
            break
        world.tick(5)
    history = world.history("d2")
    assert world.state("d2").process_state is ProcessState.COMPENSATED
    assert history.count("deferred") == 1
    assert [k for k in history if k.startswith("expired_")] == [
        "expired_retry",
        "expired_retry",
        "expired_compensate",
    ]  # each counted: the default threshold of 3


def test_a_step_its_circuit_deferred_too_often_is_left_to_expire_and_that_expiry_counts():
    """Other orders keep the circuit open: the step is deferred ``DEFERRAL.most`` times, then
    the next deferred reply leaves its attempt to its deadline, and the Supervisor counts it."""
    world, store = world_with_breaker()

    def hold_open() -> None:  # other instances' failures, just now
        state, etag = store.rows["payment"]
        until = world.clock.now() + POLICY.open_for
        store.put(replace(state, status=BreakerStatus.OPEN, opened_until=until), etag)

    world.submit(OrderSubmitted(order_id="d3", details=basket(sku="s1")))
    world.run()  # the first deferral
    for _ in range(DEFERRAL.most):
        state = world.state("d3")
        assert state.not_before is not None
        world.clock.advance((state.not_before - world.clock.now()).total_seconds() + 0.1)
        world.deliver("scheduler")
        hold_open()
        world.deliver("agent-payment")
        outcomes = world.deliver("replies")
    assert outcomes == [ReplyOutcome.LEFT_TO_EXPIRE]
    state = world.state("d3")
    assert (state.process_state, state.step_index) == (ProcessState.PROCESSING, 1)
    assert (state.deferrals, state.failure_count) == (DEFERRAL.most, 0)
    (last,) = world.store.get_history("d3")[-1:]
    assert (last.kind, last.detail) == (
        "reply_dropped",
        f"deferred: {DEFERRAL.most} times for this step already, left to expire",
    )
    assert state.complete_by is not None
    world.clock.advance((state.complete_by - world.clock.now()).total_seconds() + 5)
    world.make_due("d3")
    world.tick()
    state = world.state("d3")
    assert (state.process_state, state.failure_count) == (ProcessState.PENDING, 1)
    assert [c for c in world.remote.calls if c[0] == "payment"] == []

"""A circuit breaker per remote target, as pure state and transitions (no I/O, no clock).

The state is shared by every agent instance through the state store, so one process's view of
an outage protects the remote service from all the others. Each transition returns the next
state; the caller persists it with a write conditional on the ETag it read, so two instances
changing the breaker at once make one of them lose, re-read and re-apply.

It opens on a failure *ratio* over a sliding window with a minimum number of calls, as Polly's
advanced circuit breaker and resilience4j's time-based window do: the window is the current
time bucket and the ``buckets - 1`` before it (``window / buckets`` each, aligned on the
epoch), each bucket counting the calls that ended in it and how many of them failed. A call
counts when it ends: a transient failure of the remote as a failure; a result, a refusal or
a fault the order owns (``TransientRemoteError.order_scoped``) as a call that did not fail.

closed --(in the window: >= minimum_calls calls, failures / calls >= failure_ratio)--> open
    until now + open_for
open --(a call after opened_until: one caller takes the probe lease)--> half_open
half_open --(success)--> closed, window emptied;  half_open --(failure)--> open again
half_open with an expired lease (the prober died or hung): the next caller takes it over.
Calls that end while it is open are not counted: they started before it opened.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_BUCKETS = 60
"""Buckets of one window: the state stays a small property of one table entity."""


class BreakerStatus(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerPolicy:
    failure_ratio: float = 0.5
    """The share of the window's calls that must have failed for the breaker to open."""
    minimum_calls: int = 10
    """Calls the window must hold (across all instances) before their ratio may open it."""
    window: timedelta = timedelta(seconds=30)
    """How far back calls count (to within one bucket)."""
    buckets: int = 6
    """Time buckets the window is counted in: 5 s each by default."""
    open_for: timedelta = timedelta(seconds=10)
    """How long an open breaker refuses every call before a probe may be taken."""
    probe_lease: timedelta = timedelta(seconds=12)
    """How long a taken probe excludes other probers; after it, the probe may be taken over.
    Longer than one remote call may take (the agent's 10 s cap), so probes never overlap."""

    def __post_init__(self) -> None:
        if not 0 < self.failure_ratio <= 1:
            raise ValueError("failure_ratio must be above 0 and at most 1")
        if self.minimum_calls < 1:
            raise ValueError("minimum_calls must be at least 1")
        if self.window <= timedelta(0):
            raise ValueError("window must be positive")
        if not 1 <= self.buckets <= MAX_BUCKETS:
            raise ValueError(f"buckets must be from 1 to {MAX_BUCKETS}")
        if self.open_for <= timedelta(0):
            raise ValueError("open_for must be positive")
        if self.probe_lease <= timedelta(0):
            raise ValueError("probe_lease must be positive")

    @property
    def bucket(self) -> timedelta:
        return self.window / self.buckets


@dataclass(frozen=True)
class Tally:
    """The calls that ended in one time bucket, and how many of them failed."""

    start: datetime
    calls: int
    failures: int = 0

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.start.utcoffset() is None:
            raise ValueError("a tally's start must be timezone-aware")
        if not 0 <= self.failures <= self.calls:
            raise ValueError("a tally counts 0 <= failures <= calls")


@dataclass(frozen=True)
class BreakerState:
    name: str
    updated_at: datetime
    status: BreakerStatus = BreakerStatus.CLOSED
    window: tuple[Tally, ...] = ()
    """The calls counted, by bucket, oldest first, as of ``updated_at`` (``in_window`` drops
    the buckets that have aged out since)."""
    opened_until: datetime | None = None
    """While open: when a probe may be taken."""
    probe_until: datetime | None = None
    """While half open: when the probe lease runs out."""
    probe_owner: str | None = None
    """While half open: the token of the call that holds the probe lease."""

    def __post_init__(self) -> None:
        for field_name in ("updated_at", "opened_until", "probe_until"):
            value = getattr(self, field_name)
            if value is not None and (value.tzinfo is None or value.utcoffset() is None):
                raise ValueError(f"{field_name} must be timezone-aware")
        starts = [tally.start for tally in self.window]
        if starts != sorted(set(starts)):
            raise ValueError("the window's buckets must be in order, each once")
        if len(starts) > MAX_BUCKETS:
            raise ValueError(f"a window holds at most {MAX_BUCKETS} buckets")

    @property
    def calls(self) -> int:
        return sum(tally.calls for tally in self.window)

    @property
    def failures(self) -> int:
        return sum(tally.failures for tally in self.window)


@dataclass(frozen=True)
class Admission:
    """Whether a call may go ahead now.

    ``state`` is the state to persist first when ``changed`` (a probe being taken: the write
    must succeed, conditionally, before the call is allowed); otherwise the state as given.
    A refusal carries ``retry_at``: when the breaker may let a call through again.
    """

    allowed: bool
    state: BreakerState
    changed: bool = False
    probe: bool = False
    retry_at: datetime | None = None


def closed_breaker(name: str, now: datetime) -> BreakerState:
    """The state of a breaker never written yet."""
    return BreakerState(name=name, updated_at=now)


def bucket_of(now: datetime, policy: BreakerPolicy) -> datetime:
    """The start of the bucket ``now`` falls in."""
    width = policy.bucket
    return _EPOCH + width * ((now - _EPOCH) // width)


def in_window(window: Iterable[Tally], policy: BreakerPolicy, now: datetime) -> tuple[Tally, ...]:
    """The buckets of ``window`` that still count at ``now``: the current one and the
    ``buckets - 1`` before it (a bucket from the future, written by a clock ahead, counts)."""
    oldest = bucket_of(now, policy) - policy.bucket * (policy.buckets - 1)
    return tuple(tally for tally in window if tally.start >= oldest)


def tripped(window: Iterable[Tally], policy: BreakerPolicy) -> bool:
    """Whether these calls open the breaker: enough of them, and a large enough share failed."""
    tallies = tuple(window)
    calls = sum(tally.calls for tally in tallies)
    failures = sum(tally.failures for tally in tallies)
    return calls >= policy.minimum_calls and failures / calls >= policy.failure_ratio


def admit(state: BreakerState, policy: BreakerPolicy, *, now: datetime, caller: str) -> Admission:
    """Decide whether ``caller`` (a token unique to one call) may call the remote now."""
    if state.status is BreakerStatus.CLOSED:
        return Admission(allowed=True, state=state)
    if state.status is BreakerStatus.OPEN:
        if state.opened_until is not None and now < state.opened_until:
            return Admission(allowed=False, state=state, retry_at=state.opened_until)
        return _take_probe(state, policy, now=now, caller=caller)
    # half open
    if state.probe_until is not None and now < state.probe_until:
        if state.probe_owner == caller:
            return Admission(allowed=True, state=state, probe=True)
        return Admission(allowed=False, state=state, retry_at=state.probe_until)
    return _take_probe(state, policy, now=now, caller=caller)  # the lease lapsed: take it over


def on_success(state: BreakerState, policy: BreakerPolicy, *, now: datetime) -> BreakerState:
    """A call ended well, to be written now: half open, that closes it (the probe went
    through); closed, it is counted."""
    if state.status is BreakerStatus.HALF_OPEN:
        return closed_breaker(state.name, now)
    return count(state, policy, now=now, tallies=(Tally(bucket_of(now, policy), 1),))


def on_failure(
    state: BreakerState, policy: BreakerPolicy, *, now: datetime, also: Iterable[Tally] = ()
) -> BreakerState:
    """A transient failure, counted with ``also`` (calls that ended earlier, not yet
    written); a failed probe opens it again."""
    if state.status is BreakerStatus.HALF_OPEN:
        return _opened(state, policy, now=now, window=state.window)
    failure = Tally(bucket_of(now, policy), 1, 1)
    return count(state, policy, now=now, tallies=(*also, failure))


def count(
    state: BreakerState, policy: BreakerPolicy, *, now: datetime, tallies: Iterable[Tally]
) -> BreakerState:
    """Calls that ended (``tallies``) added to a closed breaker's window, the buckets aged out
    dropped; open if that trips it. Open or half open, nothing is counted (the calls started
    before it opened, or a straggler's)."""
    added = tuple(tallies)
    if state.status is not BreakerStatus.CLOSED or not added:
        return state
    merged: dict[datetime, Tally] = {tally.start: tally for tally in state.window}
    for tally in added:
        had = merged.get(tally.start)
        if had is not None:
            tally = Tally(tally.start, had.calls + tally.calls, had.failures + tally.failures)
        merged[tally.start] = tally
    window = in_window(sorted(merged.values(), key=lambda t: t.start), policy, now)[-MAX_BUCKETS:]
    if tripped(window, policy):
        return _opened(state, policy, now=now, window=window)
    return replace(state, window=window, updated_at=now)


def _opened(
    state: BreakerState, policy: BreakerPolicy, *, now: datetime, window: tuple[Tally, ...]
) -> BreakerState:
    return BreakerState(
        name=state.name,
        updated_at=now,
        status=BreakerStatus.OPEN,
        window=window,
        opened_until=now + policy.open_for,
    )


def _take_probe(
    state: BreakerState, policy: BreakerPolicy, *, now: datetime, caller: str
) -> Admission:
    probing = BreakerState(
        name=state.name,
        updated_at=now,
        status=BreakerStatus.HALF_OPEN,
        window=state.window,
        probe_until=now + policy.probe_lease,
        probe_owner=caller,
    )
    return Admission(allowed=True, state=probing, changed=True, probe=True)

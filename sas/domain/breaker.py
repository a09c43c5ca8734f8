"""A circuit breaker per remote service, as pure state and transitions (no I/O, no clock).

The state is shared by every agent instance through the state store, so one process's view of
an outage protects the remote service from all the others. Each transition returns the next
state; the caller persists it with a write conditional on the ETag it read, so two instances
changing the breaker at once make one of them lose, re-read and re-apply.

closed --(failure_threshold consecutive transient failures)--> open until now + open_for
open --(a call after opened_until: one caller takes the probe lease)--> half_open
half_open --(success)--> closed;  half_open --(failure)--> open again
half_open with an expired lease (the prober died or hung): the next caller takes it over.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum


class BreakerStatus(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerPolicy:
    failure_threshold: int = 5
    """Consecutive transient failures (across all instances) that open the breaker."""
    open_for: timedelta = timedelta(seconds=10)
    """How long an open breaker refuses every call before a probe may be taken."""
    probe_lease: timedelta = timedelta(seconds=12)
    """How long a taken probe excludes other probers; after it, the probe may be taken over.
    Longer than one remote call may take (the agent's 10 s cap), so probes never overlap."""

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if self.open_for <= timedelta(0):
            raise ValueError("open_for must be positive")
        if self.probe_lease <= timedelta(0):
            raise ValueError("probe_lease must be positive")


@dataclass(frozen=True)
class BreakerState:
    name: str
    updated_at: datetime
    status: BreakerStatus = BreakerStatus.CLOSED
    consecutive_failures: int = 0
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
        if self.consecutive_failures < 0:
            raise ValueError("consecutive_failures must not be negative")


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


def on_success(state: BreakerState, *, now: datetime) -> BreakerState:
    """The remote answered (a result or a permanent refusal): close, forget failures."""
    if state.status is BreakerStatus.CLOSED and state.consecutive_failures == 0:
        return state
    return closed_breaker(state.name, now)


def on_failure(state: BreakerState, policy: BreakerPolicy, *, now: datetime) -> BreakerState:
    """A transient failure: count it; at the threshold, or if the probe failed, open."""
    if state.status is BreakerStatus.OPEN:
        return state  # a straggler that started before it opened: nothing new to learn
    failures = state.consecutive_failures + 1
    if state.status is BreakerStatus.HALF_OPEN or failures >= policy.failure_threshold:
        return BreakerState(
            name=state.name,
            updated_at=now,
            status=BreakerStatus.OPEN,
            consecutive_failures=failures,
            opened_until=now + policy.open_for,
        )
    return replace(state, consecutive_failures=failures, updated_at=now)


def _take_probe(
    state: BreakerState, policy: BreakerPolicy, *, now: datetime, caller: str
) -> Admission:
    probing = BreakerState(
        name=state.name,
        updated_at=now,
        status=BreakerStatus.HALF_OPEN,
        consecutive_failures=state.consecutive_failures,
        probe_until=now + policy.probe_lease,
        probe_owner=caller,
    )
    return Admission(allowed=True, state=probing, changed=True, probe=True)

"""Endpoints of a remote service and the choice among them (pure; docs/architecture.md,
"Routing").

A remote service may have several endpoints (say, regional endpoints of one provider that
share its idempotency records), each with a capacity: how many calls it takes at once. A step
goes to an endpoint that is healthy (its circuit breaker lets calls through) and has capacity
(its calls in flight are below its capacity), the one with the most room left; a try moves
off the endpoint the previous try failed on while another has room. With no endpoint with
room, the step is deferred.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sas.domain.wire import DEFAULT_ENDPOINT, ENDPOINT_NAME, remote_target


@dataclass(frozen=True)
class Endpoint:
    agent: str
    name: str
    url: str
    capacity: int | None = None
    """Calls it takes at once, across every instance; None: no limit declared."""

    def __post_init__(self) -> None:
        ENDPOINT_NAME.check(self.name)
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"endpoint {self.name}: capacity must be at least 1")

    @property
    def target(self) -> str:
        """What names it to its breaker, its load rows and the HTTP client."""
        return remote_target(self.agent, self.name)

    def has_room(self, in_flight: int) -> bool:
        return self.capacity is None or in_flight < self.capacity


@dataclass(frozen=True)
class EndpointLoad:
    """One process's calls in flight to one endpoint, as it last published them."""

    target: str
    instance_id: str
    in_flight: int
    at: datetime


@dataclass(frozen=True)
class HeldRetries:
    """One Supervisor process's retries its retry budget held back within the last minute, as
    it last published them (sas/services/retry_budget.py): more than none, it is saturated."""

    instance_id: str
    held_back: int
    at: datetime


def single_endpoint(agent: str, url: str, capacity: int | None = None) -> Endpoint:
    return Endpoint(agent, DEFAULT_ENDPOINT, url, capacity)


def choose_endpoint(
    endpoints: Sequence[Endpoint],
    *,
    healthy: Callable[[Endpoint], bool],
    in_flight: Callable[[Endpoint], int],
    avoid: str | None = None,
) -> Endpoint | None:
    """The endpoint for the next call, among those with room (calls in flight below capacity):
    the healthy ones if any is (an unhealthy one is used only when it is all there is: its
    breaker then decides, as for a single endpoint); of those, the one with the most room left
    (the least loaded share of its capacity; declaration order breaks ties). None when no
    endpoint has room: defer. ``avoid`` (the endpoint a try just failed on) is left out while
    another has room."""
    loads = {e.name: in_flight(e) for e in endpoints}
    room = [e for e in endpoints if e.has_room(loads[e.name])]
    room = [e for e in room if e.name != avoid] or room
    if len(room) > 1:
        room = [e for e in room if healthy(e)] or room

    def share(endpoint: Endpoint) -> float:
        return 0.0 if endpoint.capacity is None else loads[endpoint.name] / endpoint.capacity

    return min(room, key=share, default=None)


@dataclass(frozen=True)
class DeferralPolicy:
    """How long a step waits when no endpoint can take it or its circuit is open: doubling,
    capped, and never before the circuit may close. A deferral is not a failure (nothing was
    called), so it never counts toward compensation; but an open circuit defers a step that
    has been deferred ``most`` times no more (the scheduler drops that reply): its attempt runs
    to its deadline, whose expiry counts, so a remote that stays down still fails the order."""

    base: timedelta = timedelta(seconds=1)
    cap: timedelta = timedelta(seconds=10)
    most: int = 20

    def delay(self, deferrals: int, *, at_least: float | None = None) -> timedelta:
        """Wait before asking again, after ``deferrals`` deferrals in a row (1 for the first);
        ``at_least``: the seconds until the circuit may let a call through."""
        doubled: timedelta = self.base * (2 ** min(max(deferrals - 1, 0), 16))
        return max(min(doubled, self.cap), timedelta(seconds=at_least or 0))

    def allows(self, deferrals: int) -> bool:
        """Whether a step deferred ``deferrals`` times may be deferred again by its circuit."""
        return deferrals < self.most

"""When a low-priority order is let in: the admission rule (pure; docs/architecture.md,
"Priorities").

Lanes keep each priority's messages apart at every hop, so high-priority work never waits
behind a backlog of normal or low work in a queue. Low priority also yields: while a high or
normal lane of any queue the app consumes is backlogged, a low order's submission is put back
for later instead of being admitted. Once admitted, its steps run in
their own lanes like any other: a step whose deadline is running is never held back, so
priority never makes a step expire.

Starvation is bounded: a submission yields for at most ``max_deferral`` in all (from its
first deferral), then is admitted whatever the backlog. A wait for room in flight
(``InFlightPolicy``) is apart from that bound and applies to normal orders too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sas.domain.wire import Priority


@dataclass(frozen=True)
class Waiting:
    """What a peek at the front of a queue saw."""

    PEEK = 32
    """Messages one peek returns at most (Storage Queues' limit)."""

    oldest: datetime | None = None
    count: int = 0
    """Visible messages seen, at most PEEK."""

    def __add__(self, other: Waiting) -> Waiting:
        times = [t for t in (self.oldest, other.oldest) if t is not None]
        return Waiting(min(times, default=None), self.count + other.count)


@dataclass(frozen=True)
class AdmissionPolicy:
    backlog: timedelta = timedelta(seconds=5)
    """Higher lanes are backlogged when their oldest waiting message has waited longer than
    this, or when more than a peek's worth of messages wait in them (a burst that has not
    waited long yet, but will)."""
    max_deferral: timedelta = timedelta(seconds=60)
    """The longest a low-priority submission is held back, in all: the starvation bound."""
    recheck: timedelta = timedelta(seconds=5)
    """How long a deferred submission waits before it asks again."""

    def __post_init__(self) -> None:
        for name in ("backlog", "max_deferral", "recheck"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name} must be positive")

    def deferral(
        self,
        priority: Priority,
        *,
        deferred_since: datetime | None,
        now: datetime,
        higher: Waiting,
    ) -> timedelta | None:
        """How long to put the submission back for, or None to admit it now.

        ``higher``: what waits in the higher lanes. ``deferred_since`` in the future (a forged
        or skewed value) counts as now, so it never stretches the bound."""
        if priority != "low" or higher.oldest is None:
            return None
        if now - higher.oldest <= self.backlog and higher.count < Waiting.PEEK:
            return None
        since = now if deferred_since is None else min(deferred_since, now)
        left = since + self.max_deferral - now
        if left <= timedelta(0):
            return None
        return min(self.recheck, left)


@dataclass(frozen=True)
class InFlightPolicy:
    """How long a submission waits in the orders queue while its workflow has
    ``Workflow.max_in_flight`` orders in flight (docs/architecture.md, "Bounded work in
    flight"). High priority is never held back; low priority waits from ``low_share`` of the
    limit, so a normal order gets the room that frees first. A put-back costs a send and a
    receive, so a submission first waits its turn: as long as the messages waiting in the
    orders lanes take to go through at the pace orders do (or, with no pace known, ``turnover``
    per order in flight); found full at its turn, it looks again after as long as it has been
    past it, so about twice as long each time (where the queue's depth is not known, as on
    Service Bus, that is all there is). Each wait between ``base`` and ``cap``. Unlike a low
    order's yield to a backlog it has no bound: it lasts while the workflow is full."""

    base: timedelta = timedelta(seconds=2)
    cap: timedelta = timedelta(minutes=10)
    turnover: timedelta = timedelta(seconds=30)
    """How long an order is taken to hold its place when no pace is known yet."""
    low_share: float = 0.9

    def __post_init__(self) -> None:
        if not timedelta(0) < self.base <= self.cap or self.turnover <= timedelta(0):
            raise ValueError("an in-flight policy needs 0 < base <= cap and a turnover > 0")
        if not 0 < self.low_share <= 1:
            raise ValueError("an in-flight policy needs 0 < low_share <= 1")

    def deferral(
        self,
        priority: Priority,
        *,
        in_flight: int,
        limit: int,
        waiting: int = 0,
        pace: float = 0.0,
        past_turn: timedelta | None = None,
    ) -> timedelta | None:
        """How long to put the submission back for, or None to admit it now. ``waiting``:
        messages in the orders lanes it would join; ``pace``: orders going through per second
        (0: unknown); ``past_turn``: how long since its turn came (None: it has none yet)."""
        if priority == "high":
            return None
        room = limit if priority == "normal" else max(1, int(limit * self.low_share))
        if in_flight < room:
            return None
        if past_turn is not None:
            wait = past_turn
        elif pace > 0:
            wait = timedelta(seconds=waiting / pace)
        else:
            wait = self.turnover * waiting / limit
        return min(self.cap, max(self.base, wait))

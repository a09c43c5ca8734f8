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
    """How many of a workflow's ``Workflow.max_in_flight`` places each priority may fill
    (docs/architecture.md, "Bounded work in flight"): normal all of them, low ``low_share`` of
    them, so a normal order gets the room that frees first; high is never held back."""

    low_share: float = 0.9

    def __post_init__(self) -> None:
        if not 0 < self.low_share <= 1:
            raise ValueError("an in-flight policy needs 0 < low_share <= 1")

    def room(self, priority: Priority, limit: int) -> int | None:
        """The places ``priority`` may fill; None: it never waits."""
        if priority == "high":
            return None
        return limit if priority == "normal" else max(1, int(limit * self.low_share))

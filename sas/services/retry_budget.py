"""The Supervisor's retry budget: how many expired steps it may send again (docs/architecture.md,
"Recovery").

A token bucket, as the AWS SDKs bound their retries: each retry of a forward step an expiry
asks for takes a token; each order that finishes well (Processed or Compensated) gives back a
share of one, and a slow trickle keeps recovery going when nothing finishes. While the bucket
is empty, an expired step waits for a later sweep, neither written nor counted against its
``max_failures``, for ``max_hold`` at most: under a surge, retries cannot outgrow the work that
gets done, which is what kept an overload going after its cause had passed. Compensation (an
undo's retry included) and Error are never held back.

One bucket per Supervisor process (the timer runs on one instance at a time in Azure); a new
process starts with a full one.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class RetryBudgetPolicy:
    capacity: float = 50.0
    """Retries a Supervisor may send at once after a quiet spell."""
    per_finished: float = 0.2
    """Tokens an order that finishes well gives back: retries at most a fifth of them."""
    trickle: timedelta = timedelta(seconds=5)
    """One token comes back every so often whatever finishes: recovery never stops."""
    max_hold: timedelta = timedelta(minutes=5)
    """Longest an order's retry is held past its deadline: then it goes, token or not, so a
    lasting overload slows every order (one retry each per hold) and strands none."""
    saturated_for: timedelta = timedelta(minutes=1)
    """How long a held-back retry counts: the Supervisor is saturated while any does."""

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.per_finished < 0 or self.trickle <= timedelta(0):
            raise ValueError("a retry budget needs capacity >= 1, a share >= 0, a trickle > 0")


class RetryBudget:
    def __init__(self, policy: RetryBudgetPolicy | None = None) -> None:
        self.policy = policy or RetryBudgetPolicy()
        self._tokens = self.policy.capacity
        self._since: datetime | None = None
        """When the trickle last counted."""
        self._held: deque[tuple[datetime, int]] = deque()
        """Retries held back within ``saturated_for``, as (second, count): bounded memory."""
        self.held_back = 0
        """Retries held back so far (by this process)."""
        self.published: int | None = None
        """The figure this process last published (``supervisor.publish_budget``)."""
        self._lock = threading.Lock()

    def take(self, now: datetime, *, expired_at: datetime) -> bool:
        """One retry of a step expired at ``expired_at``, if the budget allows it now or the
        step has waited ``max_hold``; otherwise it is held back."""
        with self._lock:
            self._drip(now)
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            if now - expired_at >= self.policy.max_hold:
                return True  # its turn, whatever the bucket holds
            second = now.replace(microsecond=0)
            if self._held and self._held[-1][0] == second:
                self._held[-1] = (second, self._held[-1][1] + 1)
            else:
                self._held.append((second, 1))
            self.held_back += 1
            return False

    def give_back(self) -> None:
        """A token taken for a retry that was not sent (another Supervisor got there first)."""
        self._add(1.0)

    def finished(self, orders: int = 1) -> None:
        """Orders that finished well give back their share."""
        self._add(orders * self.policy.per_finished)

    def _add(self, tokens: float) -> None:
        with self._lock:
            self._tokens = min(self.policy.capacity, self._tokens + tokens)

    def saturated(self, now: datetime) -> bool:
        """Whether a retry was held back within the last ``saturated_for``."""
        return self.held_recently(now) > 0

    def held_recently(self, now: datetime) -> int:
        """Retries held back within the last ``saturated_for``."""
        with self._lock:
            while self._held and now - self._held[0][0] >= self.policy.saturated_for:
                self._held.popleft()
            return sum(count for _, count in self._held)

    def tokens(self, now: datetime) -> float:
        with self._lock:
            self._drip(now)
            return self._tokens

    def _drip(self, now: datetime) -> None:
        if self._since is None or now < self._since:  # first look, or a clock set back
            self._since = now
            return
        drops = (now - self._since) // self.policy.trickle
        if drops:
            self._tokens = min(self.policy.capacity, self._tokens + drops)
            self._since += drops * self.policy.trickle

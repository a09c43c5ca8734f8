"""What waits in queues, as a peek sees it, cached per process (sas/services/ports.py,
``Transport.waiting``): for holding work back or giving it more time, never for deciding."""

from __future__ import annotations

import logging
import threading
from collections import deque
from datetime import datetime, timedelta
from typing import Protocol

from sas.domain.clock import Clock
from sas.domain.priority import Waiting

log = logging.getLogger(__name__)


class Peeks(Protocol):
    """What the Backlog needs of a transport (``Transport.waiting``)."""

    def waiting(self, queue: str) -> Waiting: ...


PACE_WINDOW = timedelta(seconds=10)
"""How far back the drain pace of a queue is measured."""
MIN_PACE_SPAN = timedelta(seconds=5)
"""The shortest span a pace is measured over: head times come to the second (below)."""
HEAD_RESOLUTION = timedelta(seconds=1)
"""Storage reports a message's insertion time to the second: a head seen to move on by d may
have moved by up to d + 1 s, and the pace is taken at that upper end (never stretched by
rounding alone)."""
MIN_PACE = 0.25
"""The slowest pace believed: a head that hardly moves stretches the wait at most fourfold."""


class Backlog:
    """What waits in a set of queues, peeked at most once per ``ttl`` per process (asked for
    every low-priority submission and, for the queue allowance, every claim)."""

    def __init__(self, transport: Peeks, clock: Clock, ttl: timedelta = timedelta(seconds=1)):
        self._transport = transport
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, ...], tuple[datetime, Waiting]] = {}
        self._heads: dict[tuple[str, ...], deque[tuple[datetime, datetime]]] = {}

    def waiting(self, queues: tuple[str, ...]) -> Waiting:
        return self._look(queues)[0]

    def _look(self, queues: tuple[str, ...]) -> tuple[Waiting, float | None]:
        """What waits (cached for ``ttl``) and the queues' drain pace (``_pace``)."""
        now = self._clock.now()
        with self._lock:
            cached = self._seen.get(queues)
            if cached is None or not timedelta(0) <= now - cached[0] < self._ttl:
                total, complete = Waiting(), True
                for queue in dict.fromkeys(queues):
                    try:
                        total += self._transport.waiting(queue)
                    except Exception:  # no backlog known: admit rather than hold orders back
                        complete = False
                        log.warning(
                            "sas.backlog_peek_failed", extra={"queue": queue}, exc_info=True
                        )
                self._seen[queues] = cached = (now, total)
                if complete:  # a failed peek says nothing of the head
                    self._remember_head(queues, now, total.oldest)
            return cached[1], self._pace(queues)

    def expected_wait(self, queues: tuple[str, ...], now: datetime | None = None) -> timedelta:
        """How long a message sent to ``queues`` now can expect to wait before it is taken.

        The age of the oldest message waiting, stretched by how fast the consumers get through
        the queue: if over the last PACE_WINDOW its head moved on by only half as much enqueue
        time as went by, what joins it now can expect twice the head's age (the head's age
        alone trails a lane that fills faster than it drains, early in a burst). The pace is
        the head's, so the stretch lasts as long as the head works through messages that came
        in faster than they leave, including while a burst's backlog drains after its arrivals
        stopped. Never less than the head's age, at most 1/MIN_PACE times it; nothing without a
        backlog."""
        waiting, pace = self._look(queues)
        now = now or self._clock.now()
        if waiting.oldest is None or waiting.oldest >= now:
            return timedelta(0)
        age = now - waiting.oldest
        return age if pace is None or pace >= 1 else age / max(pace, MIN_PACE)

    def _remember_head(
        self, queues: tuple[str, ...], now: datetime, oldest: datetime | None
    ) -> None:
        heads = self._heads.setdefault(queues, deque())
        if oldest is None:  # empty: a later head says nothing of how fast this one drained
            heads.clear()
            return
        heads.append((now, oldest))
        while now - heads[0][0] > PACE_WINDOW:
            heads.popleft()

    def _pace(self, queues: tuple[str, ...]) -> float | None:
        """Enqueue time the head moved on by per second over the looks of the last PACE_WINDOW
        (at the upper end the head times' resolution allows). None until two looks at least
        MIN_PACE_SPAN apart, or when the head went back (a request made visible again after a
        failed attempt keeps its insertion time): no stretch then. Called under the lock."""
        heads = self._heads.get(queues)
        if not heads:
            return None
        (first_at, first_head), (last_at, last_head) = heads[0], heads[-1]
        span = last_at - first_at
        moved = last_head - first_head
        if span < MIN_PACE_SPAN or moved < timedelta(0):
            return None
        return (moved + HEAD_RESOLUTION) / span

"""How many places of each workflow are held, as this process last counted them: orders in
flight in the in-flight index, and submissions waiting in the room, which come first (a place
freed goes to them at the next sweep, not to whoever arrives before it). What holds submissions
back past a workflow's ``max_in_flight``
(docs/architecture.md, "Bounded work in flight"). Counted at most once per ``ttl`` per
workflow (ten times less often while under half the limit); a submission reserves its place in
the count as it reads it (and gives it back if it does not go in), so concurrent submissions of
one process never overshoot the limit together: only what other processes let in since their
count can."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Protocol

from sas.domain.clock import Clock

log = logging.getLogger(__name__)

FAR_TTLS = 10


class Counts(Protocol):
    """What the gate needs of the store (``StateStore.count_held``)."""

    def count_held(self, workflow: str, up_to: int) -> int: ...


class InFlight:
    def __init__(self, store: Counts, clock: Clock, ttl: timedelta = timedelta(seconds=1)):
        self._store = store
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._counted: dict[str, tuple[datetime, int | None]] = {}

    def reserve(self, workflow: str, up_to: int) -> int | None:
        """Orders of ``workflow`` in flight before this one (counted up to ``up_to``), this one
        added; None when the store cannot say (nothing is held back then, and the failure is
        remembered for ``ttl``: a store under strain is not asked again by every submission)."""
        now = self._clock.now()
        with self._lock:
            seen = self._counted.get(workflow)
            fresh = seen is not None and timedelta(0) <= now - seen[0] < self._ttl_for(seen, up_to)
        if not fresh:
            counted: int | None
            try:
                counted = self._store.count_held(workflow, up_to)
            except Exception:
                log.warning(
                    "sas.in_flight_count_failed", extra={"workflow": workflow}, exc_info=True
                )
                counted = None
            with self._lock:
                self._counted[workflow] = (now, counted)
        with self._lock:
            at, count = self._counted[workflow]
            if count is not None:
                self._counted[workflow] = (at, count + 1)
            return count

    def _ttl_for(self, seen: tuple[datetime, int | None], up_to: int) -> timedelta:
        """A count far below the limit (under half) is good for ``FAR_TTLS`` times longer: a
        lone order does not pay a query, and what this process lets in meanwhile is added on."""
        count = seen[1]
        far = count is not None and count < up_to // 2
        return self._ttl * FAR_TTLS if far else self._ttl

    def release(self, workflow: str) -> None:
        """A place reserved by a submission that did not go in."""
        with self._lock:
            seen = self._counted.get(workflow)
            if seen is not None and seen[1] is not None:
                self._counted[workflow] = (seen[0], max(0, seen[1] - 1))

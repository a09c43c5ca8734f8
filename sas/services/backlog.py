"""What waits in queues, as a peek sees it, cached per process (sas/services/ports.py,
``Transport.waiting``): for holding work back or giving it more time, never for deciding."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from sas.domain.clock import Clock
from sas.domain.priority import Waiting
from sas.services.ports import Transport

log = logging.getLogger(__name__)


class Backlog:
    """What waits in a set of queues, peeked at most once per ``ttl`` per process (asked for
    every low-priority submission and, for the queue allowance, every claim)."""

    def __init__(self, transport: Transport, clock: Clock, ttl: timedelta = timedelta(seconds=1)):
        self._transport = transport
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, ...], tuple[datetime, Waiting]] = {}

    def waiting(self, queues: tuple[str, ...]) -> Waiting:
        now = self._clock.now()
        with self._lock:
            cached = self._seen.get(queues)
            if cached is not None and now - cached[0] < self._ttl:
                return cached[1]
            total = Waiting()
            for queue in dict.fromkeys(queues):
                try:
                    total += self._transport.waiting(queue)
                except Exception:  # no backlog known: admit rather than hold orders back
                    log.warning("sas.backlog_peek_failed", extra={"queue": queue}, exc_info=True)
            self._seen[queues] = (now, total)
            return total

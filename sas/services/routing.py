"""Routing steps to remote endpoints by health and capacity (docs/architecture.md, "Routing").

Health is each endpoint's circuit breaker (its state in the table, read at most once a second
per process). Load is the calls in flight per endpoint: each process counts its own exactly
and publishes the counts (one small transaction when they change, at most once a second, and
again every second while calls are in flight or a change is unpublished: ``heartbeat``, run by
a daemon thread); the others' counts are read at most once a second and ignored when older
than ``stale_after`` (a process that died stops counting then). So a process sees the others'
calls up to about two seconds late: across processes, an endpoint can briefly take more calls
than its capacity, by at most what the other processes started in that window. Within one
process the count is exact.

The agent asks ``acquire`` before each try (an endpoint with room, the healthy ones first; None
when none has room, and the step is deferred) and ``release`` when the call is over. Agents
whose endpoints declare no capacity cost nothing here: no counts are kept, published or read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from sas.domain.clock import Clock
from sas.domain.endpoints import Endpoint, choose_endpoint
from sas.services.ports import LoadStore

log = logging.getLogger(__name__)


class Router:
    def __init__(
        self,
        endpoints: Mapping[str, Sequence[Endpoint]],
        clock: Clock,
        instance_id: str,
        *,
        healthy: Callable[[Endpoint], bool],
        loads: LoadStore | None = None,
        refresh: timedelta = timedelta(seconds=1),
        stale_after: timedelta = timedelta(seconds=5),
        background: bool = False,
    ) -> None:
        """``background``: run ``heartbeat`` on a daemon thread every ``refresh`` (started on the
        first counted call); without it, the caller runs ``heartbeat`` (tests do)."""
        self._endpoints = {agent: tuple(found) for agent, found in endpoints.items()}
        self._clock = clock
        self._instance_id = instance_id
        self._healthy = healthy
        self._loads = loads
        self._refresh = refresh
        self._stale_after = stale_after
        self._lock = threading.Lock()
        self._local: Counter[str] = Counter()
        self._others: dict[str, int] = {}
        self._read_at: datetime | None = None
        self._published_at: datetime | None = None
        self._unpublished = False
        self._background = background
        self._beating: threading.Thread | None = None

    def endpoints(self, agent: str) -> tuple[Endpoint, ...]:
        return self._endpoints[agent]

    def choose(self, agent: str, avoid: str | None = None) -> Endpoint | None:
        """Where a step of ``agent`` should go now (None: nowhere has room, defer it)."""
        endpoints = self._endpoints[agent]
        if len(endpoints) == 1 and endpoints[0].capacity is None:
            return endpoints[0]
        others = self._others_now() if _counted(endpoints) else {}
        with self._lock:
            local = dict(self._local)
        return choose_endpoint(
            endpoints,
            healthy=self._healthy,
            in_flight=lambda e: others.get(e.target, 0) + local.get(e.target, 0),
            avoid=avoid,
        )

    def acquire(self, agent: str, avoid: str | None = None) -> Endpoint | None:
        """``choose``, and count the call against the endpoint until ``release``; ``avoid``:
        the endpoint the previous try failed on, left out while another has room."""
        endpoints = self._endpoints[agent]
        if not _counted(endpoints):
            return self.choose(agent, avoid)
        others = self._others_now()
        with self._lock:
            chosen = choose_endpoint(
                endpoints,
                healthy=self._healthy,
                in_flight=lambda e: others.get(e.target, 0) + self._local[e.target],
                avoid=avoid,
            )
            if chosen is not None:
                self._local[chosen.target] += 1
                self._unpublished = True
        self._start_heartbeat()
        self._publish_if_due()
        return chosen

    def release(self, endpoint: Endpoint) -> None:
        if endpoint.capacity is None and not _counted(self._endpoints[endpoint.agent]):
            return
        with self._lock:
            self._local[endpoint.target] = max(self._local[endpoint.target] - 1, 0)
            self._unpublished = True
        self._publish_if_due()

    def in_flight(self, endpoint: Endpoint) -> int:
        """The calls in flight to ``endpoint`` as this process sees them (operators, tests)."""
        others = self._others_now()
        with self._lock:
            return others.get(endpoint.target, 0) + self._local[endpoint.target]

    # --- load exchange ---------------------------------------------------------------------

    def _others_now(self) -> dict[str, int]:
        if self._loads is None:
            return {}
        now = self._clock.now()
        with self._lock:
            if self._read_at is not None and now - self._read_at < self._refresh:
                return self._others
            self._read_at = now  # one reader per refresh; the others use the last view
        try:
            rows = self._loads.read()
        except Exception:  # no view of the others: count only this process's calls
            log.warning("sas.endpoint_load_read_failed", exc_info=True)
            rows = []
        others: Counter[str] = Counter()
        for row in rows:
            if row.instance_id != self._instance_id and now - row.at <= self._stale_after:
                others[row.target] += max(row.in_flight, 0)
        with self._lock:
            self._others = dict(others)
            return self._others

    def heartbeat(self) -> None:
        """Publish this process's counts if a change is unpublished or calls are in flight (so
        the others never take a long call's row for stale), at most once per ``refresh``."""
        with self._lock:
            if any(self._local.values()):
                self._unpublished = True
        self._publish_if_due()

    def _start_heartbeat(self) -> None:
        if not self._background or self._loads is None or self._beating is not None:
            return
        with self._lock:
            if self._beating is not None:
                return
            self._beating = threading.Thread(
                target=self._beat, name="sas-endpoint-load", daemon=True
            )
        self._beating.start()

    def _beat(self) -> None:
        wait = self._refresh.total_seconds()
        while True:
            time.sleep(wait)
            try:
                self.heartbeat()
            except Exception:  # never let the thread die: the next beat tries again
                log.warning("sas.endpoint_load_heartbeat_failed", exc_info=True)

    def _publish_if_due(self) -> None:
        if self._loads is None:
            return
        now = self._clock.now()
        with self._lock:
            due = self._unpublished and (
                self._published_at is None or now - self._published_at >= self._refresh
            )
            if not due:
                return
            self._published_at, self._unpublished = now, False
            counts = dict(self._local)
        try:
            self._loads.publish(self._instance_id, counts, now)
        except Exception:  # the others see this process's calls late, not never
            log.warning("sas.endpoint_load_publish_failed", exc_info=True)
            with self._lock:
                self._unpublished = True


def _counted(endpoints: Sequence[Endpoint]) -> bool:
    """Whether calls to these endpoints are counted: some endpoint declares a capacity."""
    return any(e.capacity is not None for e in endpoints)

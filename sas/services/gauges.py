"""The gauges that cost reads (queue depth, parked messages of both kinds), sampled by the
Supervisor's timer process at most once per interval and only while metrics are exported:
the hot path never pays for them (docs/architecture.md, "Tracing and metrics")."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

from sas.domain.clock import Clock
from sas.services import metrics
from sas.services.ports import PoisonStore, QueueDepth, StateStore

log = logging.getLogger(__name__)

SAMPLE_EVERY = timedelta(seconds=60)
COUNT_LIMIT = 1000
"""Parked messages are counted up to this many of each kind: one listing of the app's and one of
the host's (poison / dead-letter queues) per sample."""


class QueueGauges:
    def __init__(
        self,
        depth: QueueDepth,
        queues: Sequence[str],
        store: StateStore,
        poison: PoisonStore | None,
        clock: Clock,
        *,
        every: timedelta = SAMPLE_EVERY,
    ) -> None:
        self._depth = depth
        self._queues = tuple(queues)
        self._store = store
        self._poison = poison
        self._clock = clock
        self._every = every
        self._sampled_at: datetime | None = None

    def maybe_sample(self) -> bool:
        """Sample if metrics are exported and the last sample is old enough; True if it did.
        Never raises: a gauge must not stop a sweep."""
        if not metrics.metrics_enabled():
            return False
        now = self._clock.now()
        if self._sampled_at is not None and now - self._sampled_at < self._every:
            return False
        self._sampled_at = now
        try:
            self.sample()
        except Exception:
            log.warning("sas.gauges_sample_failed", exc_info=True)
        return True

    def sample(self) -> None:
        metrics.queue_depth.set(self._depths())
        metrics.parked.set(self._parked())

    def _parked(self) -> dict[str, int]:
        """Parked messages by queue, the app's and the host's; none if either listing fails:
        no figure, rather than the last one reported as if it were current."""
        try:
            parked = Counter(m.queue for m in self._store.list_parked(COUNT_LIMIT))
            if self._poison is not None:
                parked.update(m.queue for m in self._poison.list(COUNT_LIMIT))
        except Exception as exc:
            log.warning("sas.gauge_parked_failed error=%s", type(exc).__name__)
            return {}
        return {**dict.fromkeys(self._queues, 0), **parked}

    def _depths(self) -> dict[str, int]:
        """Each queue's depth; one that cannot be read is left out, never the others."""
        found: dict[str, int] = {}
        for queue in self._queues:
            try:
                found[queue] = self._depth.depth(queue)
            except Exception as exc:
                log.warning(
                    "sas.gauge_queue_failed queue=%s error=%s",
                    queue,
                    type(exc).__name__,
                    extra={"queue": queue},
                )
        return found

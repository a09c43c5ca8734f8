"""The one time every role shares: the store's clock, as this process estimates it.

Each host reads its own clock, and hosts' clocks differ. A deadline set by one host and judged
by another would then mean less (or more) than its budget. So every role reads the store's
time instead: its host clock plus the offset measured from the ``Date`` header of the store's
responses (``ClockOffset``; ``hooks`` reports every Table and Queue response). A host whose
clock is further from the store's than the allowance is reported, with how far it is off
(``offset``: the host's clock minus the store's; negative when it is behind).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from sas.domain.clock import Clock

log = logging.getLogger(__name__)

_SENT = "sas.sent_at"

CALIBRATE_EVERY = 10.0
"""Seconds between calibrating requests while no response has been seen (or after a failure)."""

REPORT_EVERY = 600.0
"""Seconds between two reports of the same host's offset beyond the allowance."""


class StoreClock:
    def __init__(
        self,
        host: Clock,
        *,
        host_name: str,
        allowance: timedelta,
        calibrate: Callable[[], object] | None = None,
    ) -> None:
        """``host``: this machine's clock. ``calibrate``: one cheap store request (through a
        client that reports its responses here), made when no response has been seen yet."""
        self._host = host
        self._host_name = host_name
        self._allowance = allowance.total_seconds()
        self._calibrate = calibrate
        self._offset = ClockOffset()
        self._lock = threading.Lock()
        self._calibrating = threading.Lock()
        self._calibrated_at: float | None = None
        self._reported: tuple[float, float] | None = None  # (monotonic time, offset)

    def now(self) -> datetime:
        offset = self._offset.current
        if offset is None:
            self._calibrate_once()
            offset = self._offset.current
        if offset is None:
            return self._host.now()
        return self._host.now() + timedelta(seconds=offset.seconds)

    def host_now(self) -> datetime:
        """This machine's own clock: what a response's sending and answer are timed by."""
        return self._host.now()

    def hooks(self) -> dict[str, Callable[[Any], None]]:
        """The client options that report each response's ``Date`` here, with when its
        request was sent and answered by this host's clock: azure-core's ``raw_request_hook``
        and ``raw_response_hook``, called on every try (public options of every client)."""
        return {"raw_request_hook": self._sent, "raw_response_hook": self._answered}

    def _sent(self, request: Any) -> None:
        request.context[_SENT] = self._host.now()

    def _answered(self, response: Any) -> None:
        try:
            sent_at = response.context.get(_SENT)
            date = response.http_response.headers.get("Date")
            if sent_at is None or not date:
                return
            store_date = parsedate_to_datetime(date)
            if store_date.tzinfo is None:  # RFC 9110: an HTTP-date is always GMT
                store_date = store_date.replace(tzinfo=UTC)
            self.observe(sent_at, self._host.now(), store_date)
        except Exception:  # noqa: S110  # timing is advice: never fail the call it rode on
            pass

    def observe(self, sent: datetime, received: datetime, store_date: datetime) -> None:
        offset = self._offset.observe(sent, received, store_date)
        off_by = -offset.seconds
        # Reported only when off beyond doubt: one slow answer leaves a wide estimate.
        if abs(off_by) - offset.error > self._allowance and self._should_report(off_by):
            log.warning(
                "sas.clock_offset host=%s offset=%+.1fs allowance=%gs",
                self._host_name,
                off_by,
                self._allowance,
                extra={"host": self._host_name, "offset_seconds": round(off_by, 3)},
            )

    @property
    def offset_seconds(self) -> float | None:
        """The store's clock - this host's, as estimated (None before any response)."""
        current = self._offset.current
        return None if current is None else current.seconds

    def _should_report(self, offset: float) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._reported
            if last is not None and now - last[0] < REPORT_EVERY and abs(offset - last[1]) < 1:
                return False
            self._reported = (now, offset)
            return True

    def _calibrate_once(self) -> None:
        """One request at a time: the threads that ask meanwhile wait for its answer (a thread
        that read its host's clock instead could take a request for expired)."""
        if self._calibrate is None:
            return
        with self._calibrating:
            if self._offset.current is not None:
                return
            now = time.monotonic()
            last = self._calibrated_at
            if last is not None and now - last < CALIBRATE_EVERY:
                return
            self._calibrated_at = now
            try:
                self._calibrate()
            except Exception as error:  # the host's own clock meanwhile; a response corrects it
                log.warning(
                    "sas.clock_calibration_failed error=%s",
                    type(error).__name__,
                    extra={"host": self._host_name, "error": type(error).__name__},
                )


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


DATE_RESOLUTION = 1.0
"""Seconds: an HTTP ``Date`` header is the server's time cut to the second."""


@dataclass(frozen=True)
class Offset:
    """Bounds of (the store's clock - this host's clock), in seconds."""

    low: float
    high: float

    @property
    def seconds(self) -> float:
        return (self.low + self.high) / 2

    @property
    def error(self) -> float:
        """How far the true offset may be from ``seconds``."""
        return (self.high - self.low) / 2


class ClockOffset:
    """This host's clock against the store's, narrowed from the ``Date`` of each response.

    The store stamped a response between the request's sending and its answer, to the second,
    so each response bounds the offset to an interval about a second and a round trip wide;
    the intersection of recent intervals narrows it to about a round trip. An empty
    intersection means a clock moved (stepped or drifted): the estimate starts again from
    the newest response."""

    KEEP = 64
    """Responses whose bounds are intersected: recent enough to follow a drifting clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bounds: deque[Offset] = deque(maxlen=self.KEEP)
        self._current: Offset | None = None

    @property
    def current(self) -> Offset | None:
        return self._current

    def observe(self, sent: datetime, received: datetime, store_date: datetime) -> Offset:
        """One response: sent and received by this host's clock, dated by the store's."""
        bounds = Offset(
            (store_date - received).total_seconds(),
            (store_date - sent).total_seconds() + DATE_RESOLUTION,
        )
        with self._lock:
            self._bounds.append(bounds)
            narrowed = Offset(max(b.low for b in self._bounds), min(b.high for b in self._bounds))
            if narrowed.low > narrowed.high:
                self._bounds.clear()
                self._bounds.append(bounds)
                narrowed = bounds
            self._current = narrowed
        return narrowed

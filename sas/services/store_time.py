"""The one time every role shares: the store's clock, as this process estimates it.

Each host reads its own clock, and hosts' clocks differ. A deadline set by one host and judged
by another would then mean less (or more) than its budget. So every role reads the store's
time instead: its host clock plus the offset measured from the ``Date`` header of the store's
responses (``ClockOffset``; the adapters feed every Table and Queue response in). A host whose
clock is further from the store's than the allowance is reported, with how far it is off
(``offset``: the host's clock minus the store's; negative when it is behind).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sas.domain.clock import Clock, ClockOffset

log = logging.getLogger(__name__)

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
            except Exception:  # the host's own clock meanwhile; the next response corrects it
                log.warning("sas.clock_calibration_failed", exc_info=True)

"""A dev-host preload (``SAS_DEVHOST_PRELOAD=sas_local.host_clock``): this process's host
clock reads ``SAS_LOCAL_CLOCK_OFFSET`` seconds off the true time, as a machine whose clock has
drifted would. The app reads the store's time (sas/services/store_time.py): these are the tests
that it does, whatever the host's clock says."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

OFFSET_ENV = "SAS_LOCAL_CLOCK_OFFSET"


class SkewedClock:
    def __init__(self, offset: float) -> None:
        self.offset = timedelta(seconds=offset)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


def skew(offset: float) -> None:
    """From now on, this process's host clock is ``offset`` seconds off."""
    from sas import bootstrap

    clock = SkewedClock(offset)
    setattr(bootstrap, "host_clock", lambda: clock)  # noqa: B010 - replaces a module function


_offset = os.environ.get(OFFSET_ENV)
if _offset:
    skew(float(_offset))

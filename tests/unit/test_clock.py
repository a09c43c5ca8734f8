"""Instants in text a person reads: UTC to the millisecond, saying so; never naive."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from sas.domain.clock import readable


def test_an_instant_reads_in_utc_to_the_millisecond():
    paris = timezone(timedelta(hours=1))
    at = datetime(2026, 11, 26, 22, 42, 2, 752586, tzinfo=paris)
    assert readable(at) == "2026-11-26 21:42:02.752 UTC"


def test_a_naive_instant_is_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        readable(datetime(2026, 11, 26, 21, 42))

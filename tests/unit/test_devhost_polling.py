"""The dev host's queue back-off: the Functions host's first wait, randomised as the host's is."""

from __future__ import annotations

import pytest

from sas_local.devhost.config import MIN_POLLING_INTERVAL, POLLING_JITTER, QueueOptions
from sas_local.devhost.queues import jittered

pytestmark = pytest.mark.unit


def test_the_first_wait_is_the_hosts_minimum() -> None:
    assert MIN_POLLING_INTERVAL == 0.1
    assert QueueOptions(max_polling_interval=2).min_polling_interval == 0.1
    assert QueueOptions(max_polling_interval=0.05).min_polling_interval == 0.05


def test_waits_spread_around_the_back_off_and_never_pass_the_ceiling() -> None:
    waits = [jittered(1.0, 2.0) for _ in range(2000)]
    assert min(waits) >= 1 - POLLING_JITTER and max(waits) <= 1 + POLLING_JITTER
    assert max(waits) - min(waits) > POLLING_JITTER  # spread, not one value
    assert all(jittered(2.0, 2.0) <= 2.0 for _ in range(200))

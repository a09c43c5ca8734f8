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


def test_waits_between_the_first_and_the_ceiling_spread_around_the_back_off() -> None:
    waits = [jittered(1.1, 0.1, 2.0) for _ in range(2000)]
    assert min(waits) >= 0.1 + 1 - POLLING_JITTER and max(waits) <= 0.1 + 1 + POLLING_JITTER
    assert max(waits) - min(waits) > POLLING_JITTER  # spread, not one value
    assert all(jittered(1.9, 0.1, 2.0) <= 2.0 for _ in range(200))


def test_the_first_wait_and_the_ceiling_are_exact() -> None:
    assert {jittered(0.1, 0.1, 2.0) for _ in range(50)} == {0.1}
    assert {jittered(4.0, 0.1, 2.0) for _ in range(50)} == {2.0}

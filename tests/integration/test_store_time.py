"""Every role reads the store's time: a host clock far off is corrected from the Date of the
store's responses (Azurite's clock is this machine's), and reported beyond the allowance."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from sas import bootstrap
from sas.adapters import clients
from sas.services.store_time import StoreClock
from sas.settings import Connection

pytestmark = pytest.mark.integration


class SkewedClock:
    def __init__(self, seconds: float) -> None:
        self.offset = timedelta(seconds=seconds)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


@pytest.mark.parametrize("skew", [-30.0, -9.0, 9.0, 30.0])
def test_a_skewed_host_reads_the_stores_time_after_a_few_requests(azurite, table, skew) -> None:
    clock = StoreClock(SkewedClock(skew), host_name="h", allowance=timedelta(seconds=10))
    connection = Connection("SasStorage", connection_string=azurite.connection_string)
    client = clients.table_client(connection, table.table_name, clock.hooks())
    for _ in range(12):
        clients.ping(client)
    assert clock.offset_seconds == pytest.approx(-skew, abs=1.0)
    assert abs((clock.now() - datetime.now(UTC)).total_seconds()) < 1.0


def test_queue_responses_are_dated_too(azurite, queue_service) -> None:
    clock = StoreClock(SkewedClock(-20), host_name="h", allowance=timedelta(seconds=10))
    connection = Connection("SasStorage", connection_string=azurite.connection_string)
    list(clients.queue_service_client(connection, clock.hooks()).list_queues())
    assert clock.offset_seconds == pytest.approx(20, abs=1.5)


def test_the_apps_clock_calibrates_itself_and_names_a_host_beyond_the_allowance(
    app_env, monkeypatch, caplog
) -> None:
    """A process whose first question is the time (an agent) asks the store once; a host 30 s
    off is reported with its instance id and the offset measured."""
    monkeypatch.setenv("SAS_INSTANCE_ID", "agent-host-3")
    monkeypatch.setenv("SAS_CLOCK_SKEW_SECONDS", "10")
    bootstrap.reset()
    monkeypatch.setattr(bootstrap, "host_clock", lambda: SkewedClock(30.0))
    with caplog.at_level(logging.WARNING, logger="sas.services.store_time"):
        now = bootstrap.clock().now()
    assert abs((now - datetime.now(UTC)).total_seconds()) < 1.5
    (warning,) = [r for r in caplog.records if r.msg.startswith("sas.clock_offset")]
    assert "host=agent-host-3" in warning.getMessage()
    assert warning.offset_seconds == pytest.approx(30, abs=1.5)

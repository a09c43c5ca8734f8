"""The store's time as a process estimates it: bounds from each response's Date, narrowed."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from sas.services.store_time import ClockOffset, StoreClock
from sas.testing import FakeClock

pytestmark = [pytest.mark.unit, pytest.mark.fast]

T = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)


def ms(n: float) -> timedelta:
    return timedelta(milliseconds=n)


def test_one_response_bounds_the_offset_by_its_round_trip_and_the_dates_second() -> None:
    offset = ClockOffset()
    # Sent at T, answered 20 ms later; the store dated it T - 30 s (to the second).
    bounds = offset.observe(T, T + ms(20), T - timedelta(seconds=30))
    assert (bounds.low, bounds.high) == pytest.approx((-30.02, -29.0))


def test_responses_at_different_fractions_of_a_second_narrow_it_to_hundredths() -> None:
    true_offset = -9.3734  # the store's clock minus this host's
    offset = ClockOffset()
    host = T
    for step in range(40):
        host += ms(137 + step)  # requests at every fraction of the store's seconds
        store = host + timedelta(seconds=true_offset) + ms(5)  # stamped 5 ms after sending
        date = store.replace(microsecond=0)
        offset.observe(host, host + ms(10), date)
    current = offset.current
    assert current is not None
    assert current.low <= true_offset <= current.high
    assert current.error < 0.05  # from half a second after one response


def test_a_clock_that_moved_starts_the_estimate_again() -> None:
    offset = ClockOffset()
    offset.observe(T, T + ms(10), T)
    stepped = offset.observe(T + ms(50), T + ms(60), T + timedelta(seconds=30))
    assert stepped.low == pytest.approx(30 - 0.06, abs=1e-6)
    assert offset.current == stepped


def test_the_store_clock_reads_the_host_clock_corrected_by_the_offset() -> None:
    host = FakeClock(T)
    clock = StoreClock(host, host_name="h1", allowance=timedelta(seconds=10))
    assert clock.now() == T  # nothing measured: the host's own
    clock.observe(T, T, (T + timedelta(seconds=9)).replace(microsecond=0))
    assert clock.offset_seconds == pytest.approx(9.5)
    assert clock.now() == T + timedelta(seconds=9.5)
    assert clock.host_now() == T


def test_with_no_response_yet_it_calibrates_at_most_every_few_seconds() -> None:
    host = FakeClock(T)
    calls: list[int] = []

    def calibrate() -> None:
        calls.append(1)

    clock = StoreClock(host, host_name="h1", allowance=timedelta(seconds=2), calibrate=calibrate)
    clock.now()
    clock.now()
    assert calls == [1]  # the next try waits (real seconds, not the host clock's)


def test_threads_that_ask_while_it_calibrates_wait_for_the_answer() -> None:
    host = FakeClock(T)
    answered = threading.Event()
    clock: StoreClock

    def calibrate() -> None:
        time.sleep(0.2)  # the request is on its way while other threads ask
        clock.observe(T, T, T + timedelta(seconds=30))
        answered.set()

    clock = StoreClock(host, host_name="h1", allowance=timedelta(seconds=2), calibrate=calibrate)
    with ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(lambda _: clock.now(), range(8)))
    assert answered.is_set()
    assert all(now == T + timedelta(seconds=30.5) for now in seen)


def test_a_failing_calibration_leaves_the_host_clock(caplog: pytest.LogCaptureFixture) -> None:
    def calibrate() -> None:
        raise ConnectionError("store down")

    clock = StoreClock(FakeClock(T), host_name="h1", allowance=timedelta(2), calibrate=calibrate)
    with caplog.at_level(logging.WARNING):
        assert clock.now() == T
    assert "sas.clock_calibration_failed" in caplog.text


def test_one_slow_first_answer_does_not_report_a_host_whose_clock_is_right(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = StoreClock(FakeClock(T), host_name="good", allowance=timedelta(seconds=2))
    with caplog.at_level(logging.WARNING):  # answered 6 s later, stamped 0.1 s after sending
        clock.observe(T, T + timedelta(seconds=6), (T + ms(100)).replace(microsecond=0))
    assert clock.offset_seconds == pytest.approx(-2.5)  # the midpoint of a 6 s wide estimate
    assert "sas.clock_offset" not in caplog.text


@pytest.mark.parametrize(("off", "reported"), [(9.0, False), (-9.0, False), (30.0, True)])
def test_a_host_beyond_the_allowance_is_reported_with_its_name_and_offset(
    caplog: pytest.LogCaptureFixture, off: float, reported: bool
) -> None:
    clock = StoreClock(FakeClock(T), host_name="worker-7", allowance=timedelta(seconds=10))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # reported once, not on every response
            clock.observe(T, T + ms(4), T + timedelta(seconds=off))
    found = [r for r in caplog.records if r.msg.startswith("sas.clock_offset")]
    assert len(found) == (1 if reported else 0)
    if reported:
        assert "host=worker-7" in found[0].getMessage()
        assert "offset=-30.5s" in found[0].getMessage()  # the host is behind the store
        assert found[0].offset_seconds == pytest.approx(-30.5, abs=0.01)  # type: ignore[attr-defined]

"""The surge benchmark's figures from finish times (sas_local/bench/surge.py): goodput per
minute, the minute after the surge, and when probes were back to normal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sas_local.bench.surge import _Backlog, _normal_again, _outcome, _per_minute

pytestmark = [pytest.mark.unit, pytest.mark.fast]

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_goodput_is_counted_per_whole_minute_from_the_start_up_to_the_last():
    assert _per_minute([at(-5), at(1), at(59.9), at(60), at(185)], T0) == [2, 1, 0, 1]
    assert _per_minute([], T0) == []


def test_probes_are_normal_again_once_the_median_of_five_in_a_row_stays_normal():
    calm = 1.0  # limit: 2 s (a second more than the median beats 1.5x)
    quick = [(at(2 * n), 0.5) for n in range(20)]
    assert _normal_again(quick, calm, drained=at(0)) == 0.0
    # One probe at 2.5 s (polling) after the drain is no slowness; three in a row are.
    outlier = [(t, 2.5 if t == at(20) else took) for t, took in quick]
    assert _normal_again(outlier, calm, drained=at(10)) == 0.0
    slow = [(t, 9.0 if at(20) <= t <= at(24) else took) for t, took in quick]
    assert _normal_again(slow, calm, drained=at(10)) == 18.0  # the last slow window ends at 28
    assert _normal_again(slow, calm, drained=at(30)) == 0.0  # slow ones came before
    lost = [(t, None if at(30) <= t <= at(34) else took) for t, took in quick]
    assert _normal_again(lost, calm, drained=at(10)) == 28.0  # never finished: slow
    assert _normal_again(quick, None, drained=at(0)) is None
    assert _normal_again(quick[:2] + [(at(4), 9.0)] * 2, calm, drained=at(0)) == 4.0  # few


def test_a_run_reports_how_orders_ended_and_the_minute_after_only_while_work_was_queued():
    def state(finished: float | None, ended: str = "Processed") -> dict[str, object]:
        return {"ProcessState": ended, "FinishedAt": None if finished is None else at(finished)}

    surge = [f"s-{n}" for n in range(4)]
    states = {
        "s-0": state(30),
        "s-1": state(70),
        "s-2": state(150, "Compensated"),
        "s-3": state(None, "Pending"),
        "p-0": state(-9),
    }
    sent = {i: at(0) for i in surge} | {"p-0": at(-10)}
    figures = _outcome(surge, ["p-0"], states, sent, surge_start=T0, window_s=60)
    assert figures["ended"] == {"Processed": 2, "Compensated": 1, "Pending": 1}
    assert figures["goodput_per_minute"] == [1, 1]  # Processed only, the probe before the start
    assert figures["minute_after"] == 1  # s-1, from the window's end (60 s) a minute on
    assert figures["drained_after_s"] is None and figures["unfinished"] == 1  # s-3 never did
    states["s-3"] = state(150, "Error")
    figures = _outcome(surge, ["p-0"], states, sent, surge_start=T0, window_s=60)
    assert figures["drained_after_s"] == 150 and figures["unfinished"] == 0
    assert figures["calm_probe_p50_s"] == 1.0
    states["s-2"], states["s-3"] = state(100), state(100, "Error")
    assert (
        _outcome(surge, ["p-0"], states, sent, surge_start=T0, window_s=60)["minute_after"] is None
    )  # drained within the minute after: nothing was left to do


def test_a_surge_is_taken_in_once_the_orders_queue_is_short_again_after_its_longest():
    backlog = _Backlog(queue=None)  # type: ignore[arg-type]  # samples set by hand, no thread
    backlog.lengths = [(at(-4), 0), (at(2), 1), (at(10), 400), (at(30), 900), (at(40), 3)]
    assert backlog.taken_in_after(T0) is None  # still queued at the last sample
    backlog.lengths += [(at(50), 2), (at(60), 0)]
    assert backlog.taken_in_after(T0) == 50  # the probes' one or two are no backlog
    assert _Backlog(queue=None).taken_in_after(T0) is None  # type: ignore[arg-type]

"""The wait a request can expect in its lane: the head's age, stretched while the head moves
on more slowly than time goes by. Head times come to the second, as Storage reports them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sas.domain.priority import Waiting
from sas.services.backlog import MIN_PACE, Backlog

pytestmark = [pytest.mark.unit, pytest.mark.fast]

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
LANE = ("lane",)


class Clock:
    def __init__(self) -> None:
        self.at = T0

    def now(self) -> datetime:
        return self.at


class Lane:
    """What a peek at the lane's front sees: the head's enqueue time (None: empty)."""

    def __init__(self) -> None:
        self.head: datetime | None = None
        self.peeks = 0
        self.broken = False

    def waiting(self, queue: str) -> Waiting:
        if self.broken:
            raise ConnectionError("storage unreachable")
        self.peeks += 1
        return Waiting(self.head, 0 if self.head is None else 32)


def setup() -> tuple[Backlog, Clock, Lane]:
    clock, lane = Clock(), Lane()
    return Backlog(lane, clock), clock, lane


def looks(backlog: Backlog, clock: Clock, lane: Lane, heads: list[tuple[float, int]]) -> None:
    """Peek at each (seconds after T0, the head's enqueue time in whole seconds after T0)."""
    for at, head in heads:
        clock.at, lane.head = T0 + timedelta(seconds=at), T0 + timedelta(seconds=head)
        backlog.waiting(LANE)


def test_a_lane_that_drains_as_fast_as_it_fills_expects_the_heads_age() -> None:
    backlog, clock, lane = setup()
    looks(backlog, clock, lane, [(0, -10), (3, -7), (6, -4)])
    assert backlog.expected_wait(LANE) == timedelta(seconds=10)


def test_second_rounding_of_a_steady_lanes_head_stretches_nothing() -> None:
    """Every request waits 10 s, but the head times come to the second (-9.0 and -3.01, seen
    as -9 and -4): seen moving by 5 s in 6 s, it may have moved 6 s; the pace is taken at that
    upper end."""
    backlog, clock, lane = setup()
    looks(backlog, clock, lane, [(1, -9), (7, -4)])
    assert backlog.expected_wait(LANE) == timedelta(seconds=11)


def test_a_growing_lane_stretches_the_wait_by_how_slowly_its_head_moves() -> None:
    """Early in a burst the head has waited 13 s, but it moved on by at most 3 s of enqueue
    time in the last 6 s: a request joining now can expect about 13 / (3 / 6) = 26 s."""
    backlog, clock, lane = setup()
    looks(backlog, clock, lane, [(0, -9), (3, -8), (6, -7)])
    assert lane.peeks == 3
    assert backlog.expected_wait(LANE) == timedelta(seconds=26)
    assert lane.peeks == 3  # a look within the cache's second peeks nothing


def test_a_head_that_does_not_move_stretches_the_wait_at_most_fourfold() -> None:
    backlog, clock, lane = setup()
    looks(backlog, clock, lane, [(0, -5), (3, -5), (9, -5)])
    assert backlog.expected_wait(LANE) == timedelta(seconds=14) / MIN_PACE


def test_no_pace_from_looks_too_close_together_or_across_an_empty_lane() -> None:
    backlog, clock, lane = setup()
    looks(backlog, clock, lane, [(0, -6), (4, -6)])  # 4 s apart: too short to judge
    assert backlog.expected_wait(LANE) == timedelta(seconds=10)
    clock.at, lane.head = T0 + timedelta(seconds=5), None  # drained
    assert backlog.expected_wait(LANE) == timedelta(0)
    looks(backlog, clock, lane, [(6, 5), (12, 5)])  # refilled: measured from the new head only
    assert backlog.expected_wait(LANE) == timedelta(seconds=7) / MIN_PACE


def test_a_head_that_went_back_stretches_nothing() -> None:
    """A request made visible again after a failed attempt keeps its old insertion time."""
    backlog, clock, lane = setup()
    looks(backlog, clock, lane, [(0, -3), (6, -20)])
    assert backlog.expected_wait(LANE) == timedelta(seconds=26)


def test_a_failed_peek_keeps_what_was_learnt_of_the_pace() -> None:
    backlog, clock, lane = setup()
    looks(backlog, clock, lane, [(0, -9)])
    lane.broken = True
    clock.at = T0 + timedelta(seconds=3)
    assert backlog.expected_wait(LANE) == timedelta(0)  # nothing known now: no allowance
    lane.broken = False
    looks(backlog, clock, lane, [(6, -7)])
    assert backlog.expected_wait(LANE) == timedelta(seconds=13) * 2


def test_the_pace_is_measured_over_the_last_ten_seconds_only() -> None:
    """A lane that filled fast early and drains at full speed now is judged by now; a look
    older than the window is forgotten, however sparse the looks."""
    backlog, clock, lane = setup()
    looks(backlog, clock, lane, [(0, -1), (5, -1), (10, 0)])  # slow
    looks(backlog, clock, lane, [(15, 4), (20, 9), (25, 14)])  # at full speed since
    assert backlog.expected_wait(LANE) == timedelta(seconds=11)
    looks(backlog, clock, lane, [(300, 290)])  # alone in its window
    assert backlog.expected_wait(LANE) == timedelta(seconds=10)


def test_a_clock_that_stepped_back_looks_again() -> None:
    backlog, clock, lane = setup()
    looks(backlog, clock, lane, [(60, 50)])
    clock.at, lane.head = T0, T0 - timedelta(seconds=3)
    assert backlog.expected_wait(LANE) == timedelta(seconds=3)
    assert lane.peeks == 2

"""The wait a request can expect in its lane: the head's age, stretched while the lane grows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sas.domain.priority import Waiting
from sas.services.backlog import MIN_PACE, Backlog

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


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

    def waiting(self, queue: str) -> Waiting:
        self.peeks += 1
        return Waiting(self.head, 0 if self.head is None else 32)


def looks(backlog: Backlog, clock: Clock, lane: Lane, heads: list[tuple[float, float]]) -> None:
    """Peek at each (seconds after T0, head's enqueue time in seconds after T0)."""
    for at, head in heads:
        clock.at, lane.head = T0 + timedelta(seconds=at), T0 + timedelta(seconds=head)
        backlog.waiting(("lane",))


def test_a_lane_that_drains_as_fast_as_it_fills_expects_the_heads_age() -> None:
    clock, lane = Clock(), Lane()
    backlog = Backlog(lane, clock)
    looks(backlog, clock, lane, [(0, -10), (1.5, -8.5), (3, -7)])
    assert backlog.expected_wait(("lane",)) == timedelta(seconds=10)


def test_a_growing_lane_stretches_the_wait_by_how_slowly_its_head_moves() -> None:
    """Early in a burst the head has waited 11 s, but it moved on by 1 s of enqueue time in
    the last 2.2 s: a request joining now waits about 11 / (1 / 2.2) = 24 s, not 11."""
    clock, lane = Clock(), Lane()
    backlog = Backlog(lane, clock)
    looks(backlog, clock, lane, [(0, -10), (1.1, -9.5), (2.2, -9)])
    assert lane.peeks == 3
    wait = backlog.expected_wait(("lane",))
    assert wait == timedelta(seconds=11.2) * 2.2
    assert lane.peeks == 3  # a look within the cache's second peeks nothing


def test_a_head_that_hardly_moves_stretches_the_wait_at_most_fourfold() -> None:
    clock, lane = Clock(), Lane()
    backlog = Backlog(lane, clock)
    looks(backlog, clock, lane, [(0, -5), (1.5, -5), (3, -5)])
    assert backlog.expected_wait(("lane",)) == timedelta(seconds=8) / MIN_PACE


def test_no_pace_is_guessed_from_one_look_or_across_an_empty_lane() -> None:
    clock, lane = Clock(), Lane()
    backlog = Backlog(lane, clock)
    looks(backlog, clock, lane, [(0, -6)])
    assert backlog.expected_wait(("lane",)) == timedelta(seconds=6)
    clock.at, lane.head = T0 + timedelta(seconds=1.5), None  # drained
    assert backlog.expected_wait(("lane",)) == timedelta(0)
    looks(backlog, clock, lane, [(3, 2.5)])  # refilled: its head says nothing of the old one
    assert backlog.expected_wait(("lane",)) == timedelta(seconds=0.5)


def test_the_pace_is_measured_over_the_last_ten_seconds_only() -> None:
    """A lane that grew early and drains at full speed now is judged by now."""
    clock, lane = Clock(), Lane()
    backlog = Backlog(lane, clock)
    looks(backlog, clock, lane, [(0, -1), (5, -0.5), (10, 0)])  # slow: 1 s in 10 s
    looks(backlog, clock, lane, [(15, 5), (20, 10), (25, 15)])  # full speed since
    assert backlog.expected_wait(("lane",)) == timedelta(seconds=10)

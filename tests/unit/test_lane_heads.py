"""What the Supervisor remembers of the replies lane: when a reply sent by a deadline, seen
waiting after it, was first seen gone (docs/architecture.md, "Recovery")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sas.services.supervisor import _LaneHeads

pytestmark = pytest.mark.unit

DEADLINE = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
LANE = "replies"


def at(seconds: float) -> datetime:
    return DEADLINE + timedelta(seconds=seconds)


def heads(*sightings: tuple[float, float | None]) -> _LaneHeads:
    """Sightings as (seconds past the deadline, the head's age then in seconds or None)."""
    lane = _LaneHeads(keep=timedelta(minutes=5))
    for when, head in sightings:
        lane.add(LANE, at(when), None if head is None else at(when - head))
    return lane


def test_a_lane_never_seen_holding_a_reply_from_before_the_deadline_has_nothing_taken():
    assert heads((1, 0.5), (6, None), (11, 2)).taken_at(LANE, DEADLINE) is None


def test_sightings_before_the_deadline_say_nothing_about_its_replies():
    assert heads((-10, 30), (-5, None), (3, None)).taken_at(LANE, DEADLINE) is None


def test_the_first_sighting_without_one_after_one_with_it():
    lane = heads((1, 20), (6, 20), (11, 4), (16, None))
    assert lane.taken_at(LANE, DEADLINE) == at(11)


def test_still_waiting_is_not_taken():
    assert heads((1, 20), (6, 25)).taken_at(LANE, DEADLINE) is None


def test_a_reply_that_came_back_to_the_lane_counts_from_when_it_was_gone_again():
    """A host that took a reply and let it go (it crashed) puts it back in the lane."""
    lane = heads((1, 20), (6, None), (11, 30), (16, None), (21, None))
    assert lane.taken_at(LANE, DEADLINE) == at(16)


def test_sightings_are_read_in_time_order_whatever_order_they_were_added_in():
    lane = heads((11, None), (1, 20), (6, None))
    assert lane.taken_at(LANE, DEADLINE) == at(6)

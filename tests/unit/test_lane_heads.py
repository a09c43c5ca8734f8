"""What the Supervisor remembers of the replies lane: when a reply sent by a deadline, seen
waiting after it by a host behind, was first seen gone (docs/architecture.md, "Recovery")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sas.services.supervisor import _LaneHeads

pytestmark = pytest.mark.unit

DEADLINE = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
LANE = "replies"
BEHIND = timedelta(seconds=5)


def at(seconds: float) -> datetime:
    return DEADLINE + timedelta(seconds=seconds)


def heads(*sightings: tuple[float, float | None]) -> _LaneHeads:
    """Sightings, in the order made, as (seconds past the deadline by the Supervisor's clock,
    the head's age then in seconds, or None for an empty lane)."""
    lane = _LaneHeads(keep=timedelta(minutes=5))
    for when, head in sightings:
        lane.add(LANE, at(when), None if head is None else at(when - head))
    return lane


def test_a_lane_never_seen_holding_a_reply_from_before_the_deadline_has_nothing_taken():
    assert heads((1, 0.5), (6, None), (11, 2)).taken_at(LANE, DEADLINE, behind=BEHIND) is None


def test_sightings_before_the_deadline_say_nothing_about_its_replies():
    assert heads((-10, 30), (-5, None), (3, None)).taken_at(LANE, DEADLINE, behind=BEHIND) is None


def test_the_first_sighting_without_one_after_one_with_it():
    lane = heads((1, 20), (6, 20), (11, 4), (16, None))
    assert lane.taken_at(LANE, DEADLINE, behind=BEHIND) == at(11)


def test_still_waiting_is_not_taken():
    assert heads((1, 20), (6, 25)).taken_at(LANE, DEADLINE, behind=BEHIND) is None


def test_a_reply_that_came_back_to_the_lane_counts_from_when_it_was_gone_again():
    """A host that took a reply and let it go (it crashed) puts it back in the lane."""
    lane = heads((1, 20), (6, None), (11, 30), (16, None), (21, None))
    assert lane.taken_at(LANE, DEADLINE, behind=BEHIND) == at(16)


def test_a_reply_only_passing_through_is_no_sign_of_a_host_behind():
    """Waiting less than ``behind`` when seen: taken and applied as usual."""
    assert heads((0.1, 0.2), (5.1, None)).taken_at(LANE, DEADLINE, behind=BEHIND) is None
    assert heads((0.1, 5.0), (5.1, None)).taken_at(LANE, DEADLINE, behind=BEHIND) == at(5.1)


def test_sightings_are_read_in_the_order_they_were_made_whatever_the_clock_said():
    """A clock that stepped back: the sighting made while it ran ahead came first."""
    lane = heads((30, 40), (6, None), (11, None))
    assert lane.taken_at(LANE, DEADLINE, behind=BEHIND) == at(6)


def test_a_host_seen_behind_once_counts_until_the_replies_are_seen_gone():
    """Old enough at one look, younger at the next (the oldest was taken): still behind."""
    lane = heads((1, 20), (3, 3.5), (8, None))
    assert lane.taken_at(LANE, DEADLINE, behind=BEHIND) == at(8)


def test_a_watch_begins_at_the_first_sighting_and_again_after_a_gap_longer_than_kept():
    lane = heads((1, 20), (6, 20), (11, None))
    assert lane.watched_since(LANE) == at(1)
    lane.add(LANE, at(11 + 301), None)  # nothing seen for longer than the 5 minutes kept
    assert lane.watched_since(LANE) == at(312)
    assert _LaneHeads(keep=timedelta(minutes=5)).watched_since(LANE) is None


def test_a_first_look_that_finds_them_gone_behind_a_lagging_front_counts_from_itself():
    """Nobody looked while the reply waited; the front, newer than the deadline, has waited
    ``behind`` already: a host that far behind may have taken it just before."""
    assert heads((12, 7), (17, None)).taken_at(LANE, DEADLINE, behind=BEHIND) == at(12)


def test_a_first_look_that_finds_the_lane_keeping_up_settles_it():
    assert heads((1, None), (12, 7)).taken_at(LANE, DEADLINE, behind=BEHIND) is None
    assert heads((6, 2), (12, 7)).taken_at(LANE, DEADLINE, behind=BEHIND) is None

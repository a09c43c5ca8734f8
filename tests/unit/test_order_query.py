"""Which submission times an operator's query keeps: ages and instants together."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sas.services.operator import OrderQuery

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def test_an_age_of_zero_still_filters():
    """``newer_than`` 0 keeps only what was submitted at this very instant or later."""
    query = OrderQuery(newer_than=timedelta(0), older_than=timedelta(0))
    assert query.submitted_between(NOW) == (NOW, NOW)


def test_the_narrower_of_an_age_and_an_instant_holds():
    five_ago, ten = NOW - timedelta(minutes=5), timedelta(minutes=10)
    assert OrderQuery(submitted_from=five_ago, newer_than=ten).submitted_between(NOW) == (
        five_ago,
        None,
    )
    assert OrderQuery(submitted_until=NOW, older_than=ten).submitted_between(NOW) == (
        None,
        NOW - ten,
    )
    assert OrderQuery().submitted_between(NOW) == (None, None)


@pytest.mark.parametrize(
    "at", [datetime(1899, 12, 31, tzinfo=UTC), datetime(9000, 1, 2, tzinfo=UTC)]
)
def test_an_instant_out_of_range_is_refused(at):
    with pytest.raises(ValueError, match="from 1900 to 9000"):
        OrderQuery(submitted_from=at)


def test_a_naive_instant_is_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        OrderQuery(submitted_until=datetime(2026, 11, 26))

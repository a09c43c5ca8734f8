"""The deploys of tests/unit/test_versions.py with the orders kept in Table Storage (Azurite):
each order finishes on the definition it began with, none books an effect twice or leaves one
unrecorded, and one whose version is gone waits, visibly, until it is back."""

from __future__ import annotations

import pytest

from sas.domain.workflow import Workflow
from sas.testing import Harness
from tests.harness import store_on
from tests.unit.test_versions import (
    APPENDED,
    BOOKED,
    RENAMED,
    SHORTER,
    SWAPPED,
    V1,
    assert_ran_on,
    deployed,
    in_flight,
)

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _fresh_hotel() -> None:
    BOOKED.clear()


@pytest.mark.parametrize(
    ("change", "stopped_at"),
    [(RENAMED, "flight"), (SWAPPED, "hotel"), (APPENDED, "pay"), (SHORTER, "hotel")],
    ids=["rename", "swap", "append", "remove-a-step"],
)
def test_orders_in_flight_finish_on_their_version(table, change: Workflow, stopped_at: str) -> None:
    harness = Harness(deployed(V1), store=store_on(table))
    started = in_flight(harness, stopped_at=stopped_at)
    harness.deploy(deployed(V1, change))
    later = harness.submit("trip", {"traveller": "late"}, order_id="t-new")
    harness.run()
    for order_id in started:
        assert_ran_on(harness, order_id, V1)
    assert_ran_on(harness, later, change)
    assert harness.store.list_parked() == []


def test_orders_of_a_removed_version_wait_then_finish(table) -> None:
    store = store_on(table)
    harness = Harness(deployed(V1), store=store)
    started = in_flight(harness, stopped_at="hotel")
    harness.deploy(deployed(SWAPPED))
    harness.run(for_seconds=90)
    assert all(harness.state(o).waiting == "trip v1 is not deployed" for o in started)
    key = f"trip.1.{V1.fingerprint}"
    assert store.get_missing(key) is not None and len(harness.alerts) == 1
    harness.deploy(deployed(V1, SWAPPED))
    harness.run()
    for order_id in started:
        assert_ran_on(harness, order_id, V1)
    assert store.get_missing(key) is None

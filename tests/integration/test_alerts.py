"""The alert claim through the real table: what the Scheduler writes when it claims the send
(its instance id and lease) is what a Supervisor reads back and respects, and a sender that died
is replaced only once the lease has run out, with the same alert id. The races between senders,
decided by the domain, run in memory (tests/unit/test_alerts.py)."""

from __future__ import annotations

import pytest

from sas.services.context import ALERT_LEASE
from tests.harness import ROUTES
from tests.unit.test_alerts import alerts_for, refused_for_good
from tests.unit.test_failure_modes import order

pytestmark = pytest.mark.integration


def test_a_sender_that_died_is_replaced_after_the_lease_with_the_same_alert_id(world, strict):
    oid = order(world, refused_for_good(world), workflow=strict)
    world.bus.fail_next_send_to.add("alerts")
    with pytest.raises(ConnectionError):
        world.run()  # Error and the claim written, then the process died before the send
    state = world.state(oid)
    assert state.alert_pending and state.alert_claimed_by == "scheduler-1"
    world.make_due(oid)
    assert world.tick(1)["alert_claimed_elsewhere"] == 1  # the claim holds: nobody else sends
    assert alerts_for(world, oid) == []
    assert [m.order_id for m in world.store.list_live()] == [oid]  # still watched
    world.tick(ALERT_LEASE.total_seconds())
    (alert,) = alerts_for(world, oid)
    assert world.state(oid).alert_pending is False
    assert "alert_claimed" in world.history(oid)
    (sent,) = [s for s in world.bus.sent if s.queue == ROUTES.alerts]
    assert sent.message_id == alert.alert_id  # the id a consumer de-duplicates on
    world.tick(ALERT_LEASE.total_seconds() + 1)
    assert len(alerts_for(world, oid)) == 1

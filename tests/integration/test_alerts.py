"""The alert claim through the real table: what the Scheduler writes when it claims the send
(its instance id and lease) is what a Supervisor reads back and respects, and a sender that died
is replaced only once the lease has run out, with the same alert id. The races between senders,
decided by the domain, run in memory (tests/unit/test_alerts.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sas.domain.errors import ConcurrencyConflict
from sas.domain.model import ProcessState
from sas.services import alert_book
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


def test_an_alert_kept_on_azurite_is_acknowledged_once_and_cleared_when_its_order_moves(
    world, strict
):
    """The records through the real table: kept once however often sent, listed while open
    (the ``Open`` column the query filters on), and written only on the ETag they were read
    with."""
    oid = order(world, refused_for_good(world), workflow=strict)
    world.run()
    (kept,) = world.store.list_alerts()
    world.store.record_alert(replace(kept.value, reason="sent again"))  # the same id: left
    assert [v.value.reason for v in world.store.list_alerts()] == [kept.value.reason]
    now = world.clock.now()
    acked = replace(kept.value, acknowledged_by="dana", acknowledged_at=now)
    world.store.update_alert(acked, kept.etag)
    with pytest.raises(ConcurrencyConflict):
        world.store.update_alert(replace(kept.value, cleared_at=now), kept.etag)  # stale
    assert world.store.list_alerts() == []
    found = world.store.get_alert(kept.value.alert_id)
    assert found is not None and found.value.acknowledged_by == "dana"
    assert alert_book.acknowledge(world.store, now, [kept.value.alert_id], actor="eve") == {
        kept.value.alert_id: "acknowledged already"
    }
    assert world.state(oid).process_state is ProcessState.ERROR

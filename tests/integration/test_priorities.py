"""Priority lanes on real Storage Queues (Azurite): what a peek says about a delayed message.
The lanes themselves and the admission of low-priority submissions, decided by the domain, run
in memory (tests/unit/test_priority_lanes.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sas.domain.priority import AdmissionPolicy
from sas.services.context import Routes
from sas.services.submission import SubmissionOutcome
from sas.testing import instance
from tests.harness import World
from tests.unit.test_priority_lanes import order
from tests.workflows import REGISTRY

pytestmark = pytest.mark.integration


def test_a_delayed_schedule_request_is_no_backlog_for_admission(azurite):
    """On Storage Queues a peek dates a message from when it was sent, not when it became due:
    a retry's delayed re-ask would look long-waiting. The scheduler lanes (the only ones that
    hold delayed messages) are left out of the admission's view. (The store plays no part:
    the order is kept in memory.)"""
    import time

    from sas.adapters.clients import queue_service_client
    from sas.adapters.storage_queues import StorageQueueTransport
    from sas.domain.messages import ScheduleRequest
    from sas.domain.wire import PRIORITIES, lane_queue_name
    from sas.settings import Connection
    from tests.conftest import unique_queue

    service = queue_service_client(
        Connection(setting="SasStorage", connection_string=azurite.connection_string)
    )
    bases = {role: unique_queue(role) for role in ("orders", "sched", "replies", "agent")}
    lanes = {q: {p: lane_queue_name(q, p) for p in PRIORITIES} for q in bases.values()}
    for by_priority in lanes.values():
        for name in by_priority.values():
            service.create_queue(name)
    routes = Routes(
        bases["orders"],
        bases["sched"],
        bases["replies"],
        "alerts",
        dict.fromkeys(("inventory", "payment", "shipping"), bases["agent"]),
        lanes=lanes,
    )
    transport = StorageQueueTransport(service)
    transport.send(
        bases["sched"],
        ScheduleRequest(order_id="x1"),
        message_id="m",
        correlation_id="x1",
        delay_seconds=2,
    )
    time.sleep(2.5)  # visible now, dated 2.5 s back
    world = World(routes=routes)
    policy = AdmissionPolicy(backlog=timedelta(seconds=1))
    submission = instance(world.store, transport, routes, world.clock, REGISTRY, admission=policy)
    world.clock.current = datetime.now(UTC)
    try:
        assert submission.submit(order("low-3", "low")) is SubmissionOutcome.ACCEPTED
    finally:
        for by_priority in lanes.values():
            for name in by_priority.values():
                service.delete_queue(name)

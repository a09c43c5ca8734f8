"""I2 in memory: two Schedulers that both read an order before either writes claim it once. The
in-memory store keeps Table Storage's ETag rule, so the loser's write fails as it would there
(tests/integration/test_scheduler_on_azurite.py races the same on Azurite)."""

from __future__ import annotations

import pytest

from sas.domain.messages import ScheduleRequest, StepRequest
from sas.domain.model import ProcessState
from sas.services.scheduler import ScheduleOutcome
from sas.testing import too_slow
from tests.harness import ReadThenYield, World
from tests.unit.test_failure_modes import order

pytestmark = [pytest.mark.unit, pytest.mark.fast]


def test_two_schedulers_reading_the_same_pending_order_claim_it_once() -> None:
    world = World()
    world.remote.script("inventory", "reserve", too_slow(60))
    oid = order(world)
    world.run()
    world.tick(20)  # the reserve expired: Pending again, after a backoff
    world.clock.advance(5)
    assert world.state(oid).process_state is ProcessState.PENDING
    world.bus.take("scheduler")
    request = ScheduleRequest(order_id=oid)
    other = world.app.named("scheduler-2")
    racing = ReadThenYield(world.store, lambda: other.schedule(request))
    first = world.app.named("scheduler-1", store=racing)

    assert first.schedule(request) is ScheduleOutcome.LOST_RACE
    assert racing.meanwhile is ScheduleOutcome.CLAIMED
    state = world.state(oid)
    assert (state.locked_by, state.attempt) == ("scheduler-2", 2)  # one claim, one attempt more
    sent = [m for m in world.bus.to("agent-inventory") if isinstance(m, StepRequest)]
    assert [m.attempt for m in sent] == [1, 2]  # the loser sent nothing

"""The failure modes whose outcome the store decides, on Azurite with an injected clock, and one
run through the real store for each invariant that names a test here (docs/architecture.md):
no loss (I1), effects at most once (I4), safe supervision (I6), crash anywhere (I7). The rest of
the failure modes, decided by the domain, run in memory (tests/unit/test_failure_modes.py)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sas.adapters.table_store import TableStateStore
from sas.domain.messages import StepRequest
from sas.domain.model import ProcessState
from tests.harness import CLAIMED, live_table_of
from tests.unit.test_failure_modes import ALL_STEPS, assert_effects_once
from tests.unit.test_failure_modes import order as order  # re-exported for test_operator.py

pytestmark = pytest.mark.integration


def test_happy_path_every_step_once(world):
    oid = order(world)
    world.run()
    assert world.state(oid).process_state is ProcessState.PROCESSED
    assert_effects_once(world, oid, *ALL_STEPS)
    # Each step's claim is on record (with its endpoint), the next one in its predecessor's
    # reply transaction: the table lists a transaction's rows in this order (time, attempt).
    assert world.history(oid) == [
        "submitted",
        "claimed",
        "completed",
        "claimed",
        "completed",
        "claimed",
        "completed",
    ]


def test_agent_crash_is_recovered_by_the_supervisor(world):
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")
    lost = world.drop("agent-inventory")  # the agent died holding the request
    assert len(lost) == 1 and isinstance(lost[0], StepRequest)
    world.tick(CLAIMED)
    world.clock.advance(2)
    world.run()
    state = world.state(oid)
    assert state.process_state is ProcessState.PROCESSED
    assert state.attempt == 4  # reserve ran twice (attempts 1 and 2), then charge, ship
    assert_effects_once(world, oid, *ALL_STEPS)


class RacingStore(TableStateStore):
    """Every racer reads the state before any of them writes it."""

    def __init__(self, table, racers: int) -> None:
        super().__init__(table, live_table_of(table))
        self._barrier = threading.Barrier(racers, timeout=10)
        self._local = threading.local()

    def get_state(self, order_id):
        found = super().get_state(order_id)
        if not getattr(self._local, "done", False):
            self._local.done = True
            self._barrier.wait()
        return found


def test_two_supervisors_racing_recover_a_step_once(world, table):
    oid = order(world)
    world.deliver("orders"), world.deliver("scheduler")
    world.drop("agent-inventory")
    world.clock.advance(CLAIMED + 1)
    store = RacingStore(table, racers=2)
    supervisors = [world.new_supervisor(f"supervisor-{n}", store) for n in (1, 2)]
    before = len(world.bus.to("scheduler"))
    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda s: s.sweep(), supervisors))
    assert sorted(r["retry"] + 2 * r["lost_race"] for r in reports) == [1, 2]
    assert world.state(oid).failure_count == 1
    assert len(world.bus.to("scheduler")) == before + 1
    assert world.history(oid).count("expired_retry") == 1


def test_duplicate_delivery_of_every_message_type(world):
    oid = order(world)
    world.run(twice=True)  # every OrderSubmitted, ScheduleRequest, StepRequest, StepReply twice
    state = world.state(oid)
    assert state.process_state is ProcessState.PROCESSED
    assert state.attempt == 3
    assert_effects_once(world, oid, *ALL_STEPS)
    # each StepRequest ran twice (the remote replayed the second call), giving two replies,
    # each delivered twice: one applies, three are fenced off, for each of the 3 steps
    assert world.history(oid).count("reply_dropped") == 9
    assert len(world.remote.calls) == 6


def test_no_order_is_lost_every_live_one_is_indexed_with_a_deadline(world):
    ids = [order(world, f"o{n}") for n in range(5)]
    world.deliver("orders"), world.deliver("scheduler")
    indexed = {m.order_id for m in world.store.list_live()}
    for oid in ids:
        state = world.state(oid)
        assert oid in indexed
        assert state.complete_by is not None and not state.is_terminal
    world.run()
    # Finished: each marker stays until it comes due, and the sweep then drops it.
    assert {m.order_id for m in world.store.list_live()} == set(ids)
    world.tick(CLAIMED)
    assert world.store.list_live() == []

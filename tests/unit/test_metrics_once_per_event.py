"""Metrics counted once per real event (issue 11's hostile review), in memory: under duplicate
deliveries, two Supervisors on one expiry, repeated sweeps of an Error order and a late reply,
each outcome, recovery, retry and alert is counted once. The handlers decide what they count;
the store's part (an ETag that loses the race) is the in-memory store's, as Table Storage's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from sas.domain.messages import StepReply
from sas.domain.model import ProcessState
from sas.services import metrics
from sas.testing import refuse
from tests.harness import ReadThenYield, World
from tests.unit.test_services import submitted
from tests.workflows import STRICT

pytestmark = [pytest.mark.unit, pytest.mark.fast]


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryMetricReader]:
    found = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[found])
    monkeypatch.setattr(metrics, "instruments", metrics.instruments_on(provider.get_meter("t")))
    yield found
    provider.shutdown()


def counted(reader: InMemoryMetricReader, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
    data = reader.get_metrics_data()
    found: dict[tuple[tuple[str, Any], ...], Any] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        key = tuple(sorted((point.attributes or {}).items()))
                        found[key] = getattr(point, "value", None)
    return found


def test_every_message_delivered_twice_counts_each_outcome_once(
    reader: InMemoryMetricReader,
) -> None:
    world = World()
    world.submit(submitted("fine"))
    world.run(twice=True)
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    world.submit(submitted("declined"))
    world.run(twice=True)
    assert world.state("fine").process_state is ProcessState.PROCESSED
    assert world.state("declined").process_state is ProcessState.COMPENSATED
    assert counted(reader, "sas.orders.finished") == {
        (("sas.outcome", "Processed"),): 1,
        (("sas.outcome", "Compensated"),): 1,
    }
    assert counted(reader, "sas.compensations") == {(("sas.reason", "refused"),): 1}


def test_two_supervisors_racing_on_one_expiry_count_one_recovery(
    reader: InMemoryMetricReader,
) -> None:
    world = World()
    world.submit(submitted("slow"))
    for lane in world.routes.all_lanes(world.routes.scheduler):
        world.deliver(lane)
    for lane in world.routes.all_lanes(world.routes.agents["inventory"]):
        assert world.drop(lane) or True  # the agent crashed: no reply will come
    assert world.state("slow").process_state is ProcessState.PROCESSING
    other = world.new_supervisor("supervisor-2")
    world.clock.advance(120)
    world.make_due("slow")
    racing = ReadThenYield(world.store, other.sweep)  # the other sweeps between read and write
    world.new_supervisor("supervisor-1", store=racing).sweep()
    assert racing.meanwhile is not None  # it did race
    assert world.history("slow").count("expired_retry") == 1
    assert sum(counted(reader, "sas.supervisor.recoveries").values()) == 1
    assert sum(counted(reader, "sas.retries").values()) == 1


def test_an_error_order_delivered_twice_and_swept_counts_one_alert(
    reader: InMemoryMetricReader,
) -> None:
    world = World()
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    world.submit(submitted("err").model_copy(update={"workflow": STRICT.name}))
    world.run(twice=True)
    for _ in range(3):
        world.make_due("err")
        world.tick(600)
    assert world.state("err").process_state is ProcessState.ERROR
    assert len(world.alerts()) == 1
    assert sum(counted(reader, "sas.alerts").values()) == 1
    assert counted(reader, "sas.orders.finished") == {(("sas.outcome", "Error"),): 1}


def test_a_late_reply_after_a_recovery_and_the_finish_counts_nothing(
    reader: InMemoryMetricReader,
) -> None:
    world = World()
    world.submit(submitted("late"))
    for lane in world.routes.all_lanes(world.routes.scheduler):
        world.deliver(lane)
    for lane in world.routes.all_lanes(world.routes.agents["inventory"]):
        world.deliver(lane)
    held = [
        m for lane in world.routes.all_lanes(world.routes.replies) for m in world.bus.take(lane)
    ]
    assert len(held) == 1 and isinstance(held[0], StepReply)
    world.clock.advance(120)
    world.make_due("late")
    world.supervisor.sweep()
    world.settle_with_supervision()
    assert world.state("late").process_state is ProcessState.PROCESSED
    before = {
        name: counted(reader, name)
        for name in ("sas.orders.finished", "sas.retries", "sas.supervisor.recoveries")
    }
    for _ in range(2):
        world.app.on_reply(held[0])
    after = {name: counted(reader, name) for name in before}
    assert after == before
    assert before["sas.orders.finished"] == {(("sas.outcome", "Processed"),): 1}

"""Hostile review of the operator features (issue 11) on Azurite: metrics counted once per real
event under duplicate deliveries and lost races, purge races, concurrent resubmits."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableClient
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from sas import bootstrap
from sas import settings as app_settings
from sas.domain.errors import ConcurrencyConflict
from sas.domain.model import HistoryEntry, ProcessState
from sas.services import metrics
from sas.services.operator import OrderQuery
from sas_cli import appsettings
from tests.harness import World, permanent, store_on
from tests.integration.test_bad_input import body, deliver
from tests.integration.test_trace_propagation import agent_requests
from tests.unit.test_services import submitted

pytestmark = pytest.mark.integration


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


def _long_history(world: World, order_id: str, rows: int) -> None:
    state = world.state(order_id)
    for n in range(rows):
        world.store.add_history(
            HistoryEntry(
                order_id=order_id,
                at=state.updated_at + timedelta(microseconds=n + 1),
                kind="note",
                attempt=state.attempt,
                step=None,
                mode="do",
                actor="test",
                detail=str(n),
            )
        )


def _rows(world: World, order_id: str) -> list[str]:
    table = world.store._table
    return [
        e["RowKey"]
        for e in table.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
    ]


# --- metrics: once per real event -------------------------------------------------------


def test_every_message_delivered_twice_counts_each_outcome_once(
    world: World, reader: InMemoryMetricReader
) -> None:
    world.submit(submitted("fine"))
    world.run(twice=True)
    world.remote.script[("payment", "charge")] = [permanent("HTTP 402 card declined")]
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
    world: World, reader: InMemoryMetricReader
) -> None:
    world.submit(submitted("slow"))
    for lane in world.routes.all_lanes(world.routes.scheduler):
        world.deliver(lane)
    for lane in world.routes.all_lanes(world.routes.agents["inventory"]):
        assert world.drop(lane) or True  # the agent crashed: no reply will come
    assert world.state("slow").process_state is ProcessState.PROCESSING
    other = world.new_supervisor("supervisor-2", store=store_on(world.store._table))
    world.clock.advance(120)
    world.make_due("slow")
    world.supervisor.sweep()
    other.sweep()
    assert "expired_retry" in world.history("slow")
    assert sum(counted(reader, "sas.supervisor.recoveries").values()) == 1
    assert sum(counted(reader, "sas.retries").values()) == 1


# --- purge races ------------------------------------------------------------------------


def test_a_purge_that_loses_its_race_on_a_long_order_keeps_the_orders_history(
    world: World,
) -> None:
    world.submit(submitted("long"))
    world.run()
    _long_history(world, "long", 150)
    (stale,) = list(world.store.query_states(process_state=ProcessState.PROCESSED))
    fresh = world.store.get_state("long")
    assert fresh is not None
    world.store.update_state(fresh.value, fresh.etag)  # someone wrote in between
    before = len(world.store.get_history("long"))
    assert world.store.purge_order(stale) is False
    assert world.store.get_state("long") is not None  # kept, as it should be ...
    assert len(world.store.get_history("long")) == before  # ... with its timeline


def test_two_operators_purging_the_same_long_order_at_once_both_finish(world: World) -> None:
    world.submit(submitted("long"))
    world.run()
    _long_history(world, "long", 150)
    world.clock.advance(1)
    (listed,) = list(world.store.query_states(process_state=ProcessState.PROCESSED))
    table = world.store._table
    other = store_on(
        TableClient(endpoint=table.url, table_name=table.table_name, credential=table.credential)
    )
    real_submit = table.submit_transaction
    raced: list[bool] = []

    def submit_after_the_other_purge(operations: Any, **kwargs: Any) -> Any:
        if not raced:  # the other operator's purge runs to the end between our list and delete
            raced.append(other.purge_order(listed))
        return real_submit(operations, **kwargs)

    table.submit_transaction = submit_after_the_other_purge  # type: ignore[method-assign]
    try:
        outcome = world.store.purge_order(listed)
    finally:
        table.submit_transaction = real_submit  # type: ignore[method-assign]
    assert raced == [True]
    assert outcome is False  # the other one purged it: refused like any lost race, no crash
    assert _rows(world, "long") == []


def test_a_stale_reply_landing_during_a_purge_leaves_no_orphan_rows(world: World) -> None:
    world.submit(submitted("done"))
    world.run()
    world.clock.advance(1)
    (listed,) = list(world.store.query_states(process_state=ProcessState.PROCESSED))
    table = world.store._table
    real_submit = table.submit_transaction
    late: list[bool] = []

    def a_late_row_first(operations: Any, **kwargs: Any) -> Any:
        if not late:  # a stale reply's history row lands between the listing and the delete
            late.append(True)
            world.store.add_history(
                HistoryEntry(
                    order_id="done",
                    at=world.clock.now(),
                    kind="stale_reply",
                    attempt=1,
                    step="reserve",
                    mode="do",
                    actor="scheduler-2",
                    detail="late",
                )
            )
        return real_submit(operations, **kwargs)

    table.submit_transaction = a_late_row_first  # type: ignore[method-assign]
    try:
        purged = world.store.purge_order(listed)
    finally:
        table.submit_transaction = real_submit  # type: ignore[method-assign]
    # Either the purge notices and keeps the order, or it leaves nothing behind: never a
    # partition of rows without the order they belong to.
    assert (purged, world.store.get_state("done") is None) in ((False, False), (True, True))
    if purged:
        assert _rows(world, "done") == []


def test_an_interrupted_long_purge_is_finished_by_the_next_one(world: World) -> None:
    world.submit(submitted("long"))
    world.run()
    _long_history(world, "long", 250)
    world.clock.advance(1)
    table = world.store._table
    real_submit = table.submit_transaction
    calls: list[int] = []

    def crash_on_the_second(operations: Any, **kwargs: Any) -> Any:
        calls.append(len(operations))
        if len(calls) == 2:
            raise ConnectionError("the operator's laptop went to sleep")
        return real_submit(operations, **kwargs)

    table.submit_transaction = crash_on_the_second  # type: ignore[method-assign]
    try:
        with pytest.raises(ConnectionError):
            world.operator.purge(timedelta(0), dry_run=False)
    finally:
        table.submit_transaction = real_submit  # type: ignore[method-assign]
    assert world.store.get_state("long") is not None
    report = world.operator.purge(timedelta(0), dry_run=False)
    assert report.purged == 1 and _rows(world, "long") == []


# --- resubmit -----------------------------------------------------------------------------


def test_two_operators_resubmitting_at_once_resubmit_once(world: World, strict: str) -> None:
    world.remote.script[("payment", "charge")] = [permanent("HTTP 402 card declined")]
    world.submit(submitted("err").model_copy(update={"workflow": strict}))
    world.run()
    assert world.state("err").process_state is ProcessState.ERROR
    both_read = threading.Barrier(2)
    real_get_state = world.store.get_state

    def read_then_wait(order_id: str) -> Any:
        found = real_get_state(order_id)
        both_read.wait(timeout=30)
        return found

    world.store.get_state = read_then_wait  # type: ignore[method-assign]
    outcomes: list[str] = []

    def press(actor: str) -> None:
        try:
            world.operator.resubmit("err", actor=actor)
            outcomes.append("resubmitted")
        except ConcurrencyConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=press, args=(name,)) for name in ("ann", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    world.store.get_state = real_get_state  # type: ignore[method-assign]
    assert sorted(outcomes) == ["conflict", "resubmitted"]
    assert world.history("err").count("resubmitted") == 1
    requests = [
        m for lane in world.routes.all_lanes(world.routes.scheduler) for m in world.bus.take(lane)
    ]
    assert len(requests) == 1


# --- find: the boundaries the API documents ---------------------------------------------


def test_find_boundaries_are_exact_to_the_microsecond(world: World) -> None:
    world.submit(submitted("edge"))
    at = world.state("edge").submitted_at
    world.clock.current = at + timedelta(seconds=600, microseconds=1)
    older = world.operator.find(OrderQuery(older_than=timedelta(seconds=600)))
    newer = world.operator.find(OrderQuery(newer_than=timedelta(seconds=600)))
    assert ([s.order_id for s in older], newer) == (["edge"], [])
    world.clock.current = at + timedelta(seconds=600, microseconds=-1)
    older = world.operator.find(OrderQuery(older_than=timedelta(seconds=600)))
    newer = world.operator.find(OrderQuery(newer_than=timedelta(seconds=600)))
    assert (older, [s.order_id for s in newer]) == ([], ["edge"])


def test_an_order_exactly_that_old_is_newer_not_older(world: World) -> None:
    """GET /api/orders documents older_than_seconds as "submitted more than this many seconds
    ago" and newer_than_seconds as "at most" (docs/openapi.json): the boundary is one side's."""
    world.submit(submitted("edge"))
    world.clock.current = world.state("edge").submitted_at + timedelta(seconds=600)
    older = world.operator.find(OrderQuery(older_than=timedelta(seconds=600)))
    newer = world.operator.find(OrderQuery(newer_than=timedelta(seconds=600)))
    assert (older, [s.order_id for s in newer]) == ([], ["edge"])
    described = json.loads((Path(__file__).parents[2] / "docs" / "openapi.json").read_text())
    parameters = {
        p["name"]: p["description"] for p in described["paths"]["/api/orders"]["get"]["parameters"]
    }
    assert "more than" in parameters["older_than_seconds"]
    assert "at most" in parameters["newer_than_seconds"]


# --- CLI settings precedence --------------------------------------------------------------


def test_a_settings_file_wins_over_a_storage_connection_left_in_the_environment(
    tmp_path: Path,
) -> None:
    """README: "In order: --settings FILE ... else the environment". A deployed app's settings
    (az functionapp config appsettings list) name its storage by endpoint and identity; an
    operator whose shell still holds a SasStorage connection string (a local run's) must reach
    the app of the file, not the one of the environment."""
    from_azure = tmp_path / "appsettings.json"
    from_azure.write_text(
        json.dumps(
            [
                {"name": "SAS_TRANSPORT", "value": "storage"},
                {
                    "name": "SasStorage__tableServiceUri",
                    "value": "https://prodapp.table.core.windows.net",
                },
                {
                    "name": "SasStorage__queueServiceUri",
                    "value": "https://prodapp.queue.core.windows.net",
                },
                {"name": "SasStorage__credential", "value": "managedidentity"},
            ]
        )
    )
    env = {app_settings.STORAGE_CONNECTION: appsettings.AZURITE_DEVELOPMENT}
    source = appsettings.choose(from_azure, env, tmp_path)
    appsettings.apply(source, env)
    storage = app_settings.load(env).storage
    assert (storage.connection_string, storage.table_uri) == (
        None,
        "https://prodapp.table.core.windows.net",
    )


# --- hostile trace fields through the real function bodies ------------------------------

VALID_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "trace",
    [
        {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
        {"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        {"traceparent": VALID_TRACEPARENT, "tracestate": "a=1\r\nb=2"},
        {"traceparent": VALID_TRACEPARENT, "tracestate": ",".join(f"k{n}=v" for n in range(40))},
        {"traceparent": VALID_TRACEPARENT, "tracestate": "x" * 512},
    ],
)
def test_a_well_formed_but_unusable_trace_never_stops_the_order(
    app_env: None, azurite: Any, trace: dict[str, str]
) -> None:
    deliver("submit", body(trace=trace))
    assert bootstrap.store().list_parked() == []
    state = bootstrap.store().get_state("o1")
    assert state is not None and state.value.process_state is ProcessState.PROCESSING
    [request] = agent_requests(azurite)
    if request.trace is not None:
        assert "\n" not in (request.trace.tracestate or "")


def test_a_submitters_tracestate_cannot_raise_an_operator_alert(
    app_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    """infra/modules/alerts.bicep alerts on `traces | where message has "sas.operator_alert"`
    (host.json ships the worker's Information and up). An order whose envelope carries this
    tracestate is accepted, and OpenTelemetry's parser logs the bad member verbatim at WARNING:
    any submitter could page the operators, or forge whole log lines with CR/LF."""
    tracestate = "a=1\r\n2026-11-23 08:00:00 ERROR sas.operator_alert order=forged"
    with caplog.at_level(logging.DEBUG):
        deliver("submit", body(trace={"traceparent": VALID_TRACEPARENT, "tracestate": tracestate}))
    forged = [r for r in caplog.records if "sas.operator_alert" in r.getMessage()]
    assert [(r.name, r.getMessage()) for r in forged] == []


def test_an_error_order_delivered_twice_and_swept_counts_one_alert(
    world: World, reader: InMemoryMetricReader, strict: str
) -> None:
    world.remote.script[("payment", "charge")] = [permanent("HTTP 402 card declined")]
    world.submit(submitted("err").model_copy(update={"workflow": strict}))
    world.run(twice=True)
    for _ in range(3):
        world.make_due("err")
        world.tick(600)
    assert world.state("err").process_state is ProcessState.ERROR
    assert len(world.alerts()) == 1
    assert sum(counted(reader, "sas.alerts").values()) == 1
    assert counted(reader, "sas.orders.finished") == {(("sas.outcome", "Error"),): 1}


def test_a_late_reply_after_a_recovery_and_the_finish_counts_nothing(
    world: World, reader: InMemoryMetricReader
) -> None:
    world.submit(submitted("late"))
    for lane in world.routes.all_lanes(world.routes.scheduler):
        world.deliver(lane)
    for lane in world.routes.all_lanes(world.routes.agents["inventory"]):
        world.deliver(lane)
    held = [
        m for lane in world.routes.all_lanes(world.routes.replies) for m in world.bus.take(lane)
    ]
    assert len(held) == 1
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
        world.scheduler.on_reply(held[0])  # type: ignore[arg-type]
    after = {name: counted(reader, name) for name in before}
    assert after == before
    assert before["sas.orders.finished"] == {(("sas.outcome", "Processed"),): 1}

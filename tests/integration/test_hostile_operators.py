"""Hostile review of the operator features (issue 11) on Azurite: what the real store decides
(purge races on long orders, its transactions interrupted; find's boundaries to the microsecond
in its query) and hostile trace fields through the real function bodies. Metrics counted once
per real event, concurrent resubmits and the CLI's settings precedence, which the app decides
alone, are proved in memory: tests/unit/test_metrics_once_per_event.py,
tests/unit/test_operator_decisions.py and tests/unit/test_cli_settings_source.py."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableClient

from sas import bootstrap
from sas.adapters.table_store import TableStateStore
from sas.domain.model import HistoryEntry, ProcessState
from sas.services.operator import OrderQuery
from tests.harness import World, store_on
from tests.integration.test_bad_input import body, deliver
from tests.integration.test_trace_propagation import agent_requests
from tests.unit.test_services import submitted

pytestmark = pytest.mark.integration


def _table(world: World) -> TableClient:
    assert isinstance(world.store, TableStateStore)
    return world.store._table


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
    return [
        e["RowKey"]
        for e in _table(world).query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
    ]


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
    table = _table(world)
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
    table = _table(world)
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
    table = _table(world)
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

"""What `sas` shows: the trace id only when an order has one; ids whole at any width; parked
messages of both kinds in one table."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from rich.console import Console

from sas.domain.model import OrderState, ProcessState
from sas.domain.parked import ParkedMessage, poison_id, rejected_row_key
from sas.entrypoints.parked_api import ParkedView
from sas_cli import views

pytestmark = pytest.mark.unit

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def shown(state: OrderState) -> str:
    console = Console(width=200, record=True, file=None)
    with console.capture() as captured:
        console.print(views.status(state))
    return captured.get()


def test_the_trace_id_is_shown_when_the_order_has_one():
    at = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    state = OrderState("o1", "order", ProcessState.ERROR, at, at, last_error="HTTP 402")
    untraced = shown(state)
    assert "o1 Error at reserve, attempt" in untraced and "last error: HTTP 402" in untraced
    assert "submitted 2026-11-22 12:00:00 UTC" in untraced  # one time format, zone said
    undoing = shown(replace(state, process_state=ProcessState.PENDING, mode="undo"))
    assert "o1 Pending (undo) at reserve, attempt" in undoing  # as the dashboard says
    assert "trace id" not in untraced
    traced = OrderState(
        "o1", "order", ProcessState.ERROR, at, at, traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-01"
    )
    assert f"trace id {TRACE_ID}" in shown(traced)


def test_an_order_id_is_never_cut_short_however_narrow_the_terminal():
    narrow = Console(width=40, record=True, file=io.StringIO())
    rows = [("demo-092322-00010", "Compensated", "charge (do): HTTP 402 card declined " * 3)]
    narrow.print(views.table("orders", ("order", "state", "last error"), rows))
    shown = narrow.export_text()
    assert "demo-092322-00010" in shown
    assert "…" not in shown  # folded, never elided


def test_parked_messages_of_both_kinds_show_in_one_table_as_the_api_shows_them():
    at = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    app = ParkedMessage(
        id=rejected_row_key(at, "0123456789ab"),
        parked_by="app",
        queue="sas-orders",
        function="submit",
        reason="invalid OrderSubmitted",
        body=b"\xff\x00",
        body_truncated=False,
        parked_at=at,
    )
    host = ParkedMessage(
        id=poison_id("sas-replies", "7"),
        parked_by="host",
        queue="sas-replies",
        function="on_reply",
        reason="MaxDeliveryCountExceeded",
        body=b'{"a": 1}',
        body_truncated=False,
        parked_at=None,
        delivery_count=10,
        transport="servicebus",
    )
    documents = [views.parked_document(app, 7200.0), views.parked_document(host, None)]
    assert documents == [
        ParkedView.of(app, 7200.0).model_dump(mode="json"),  # --json: the API's very view
        ParkedView.of(host, None).model_dump(mode="json"),
    ]
    assert [(d["parked_by"], d["body_text"], d["age_seconds"]) for d in documents] == [
        ("app", None, 7200.0),
        ("host", '{"a": 1}', None),
    ]
    wide = Console(width=200, record=True, file=io.StringIO())
    wide.print(views.parked_table("parked messages", documents))
    lines = wide.export_text().splitlines()
    (app_row,) = [line for line in lines if "sas-orders" in line]
    (host_row,) = [line for line in lines if "sas-replies" in line]
    for shown in ("app", "2026-11-22 12:00:00", "2h", "invalid OrderSubmitted", "<binary>"):
        assert shown in app_row
    for shown in ("host", "?", "10", "MaxDeliveryCountExceeded", '{"a": 1}'):
        assert shown in host_row


def test_stored_text_is_shown_as_it_is_never_as_markup():
    at = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    state = OrderState(
        "o1", "order", ProcessState.ERROR, at, at, last_error="[bold red]card [/] declined"
    )
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(views.failures_table([state]))
    assert "[bold red]card [/] declined" in console.export_text()


def test_a_time_with_no_utc_equivalent_is_shown_as_it_came():
    from datetime import timedelta, timezone

    odd = datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1)))
    assert views.at(odd) == "0001-01-01T00:30:00+01:00"
    assert views.at(datetime(2026, 11, 26, 9, 0, tzinfo=UTC)) == "2026-11-26 09:00:00 UTC"

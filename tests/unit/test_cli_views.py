"""What `sas` shows: the trace id only when an order has one; ids whole at any width."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from rich.console import Console

from sas.domain.model import OrderState, ProcessState
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
    assert "o1 Error at reserve (do)" in untraced and "last error: HTTP 402" in untraced
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

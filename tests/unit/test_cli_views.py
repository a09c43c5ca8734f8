"""What `sas status` shows of an order: the trace id only when the order has one."""

from __future__ import annotations

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

"""Hostile review of trace context handling (sas/services/telemetry.py): what a sender controls
in a Service Bus message's properties or a Storage message's envelope must not reach the logs
as forged lines."""

from __future__ import annotations

import logging

import pytest

from sas.domain.messages import ScheduleRequest, TraceContext
from sas.services import telemetry

pytestmark = pytest.mark.unit

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FORGED = "a=1\n2026-11-23 08:00:00 ERROR [scheduler] sas.operator_alert order=forged"


def _forged_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "order=forged" in r.getMessage()]


def test_a_tracestate_in_service_bus_properties_cannot_forge_a_log_line(caplog):
    message = ScheduleRequest(order_id="o1")
    properties: dict[str | bytes, object] = {"traceparent": TRACEPARENT, "tracestate": FORGED}
    with (
        caplog.at_level(logging.DEBUG),
        telemetry.continued(telemetry.carrier_from(message, properties)),
    ):
        pass
    assert _forged_lines(caplog) == []


def test_a_tracestate_in_the_envelope_cannot_forge_a_log_line(caplog):
    message = ScheduleRequest(order_id="o1").model_copy(
        update={"trace": TraceContext(traceparent=TRACEPARENT, tracestate=FORGED)}
    )
    with caplog.at_level(logging.DEBUG), telemetry.continued(telemetry.carrier_from(message)):
        pass
    assert _forged_lines(caplog) == []


@pytest.mark.parametrize(
    "properties",
    [
        {"traceparent": TRACEPARENT, "tracestate": "sas.operator_alert"},
        {"traceparent": "sas.operator_alert", "tracestate": "a=1"},
        {"traceparent": f"{TRACEPARENT} sas.operator_alert"},
    ],
)
def test_a_senders_trace_properties_never_log_the_alert_event_name(caplog, properties):
    """infra/modules/alerts.bicep fires on `traces | where message has "sas.operator_alert"`:
    a sender's trace context must not be able to raise an operator alert."""
    message = ScheduleRequest(order_id="o1")
    with (
        caplog.at_level(logging.DEBUG),
        telemetry.continued(telemetry.carrier_from(message, properties)),
    ):
        pass
    assert [r.getMessage() for r in caplog.records if "sas.operator_alert" in r.getMessage()] == []

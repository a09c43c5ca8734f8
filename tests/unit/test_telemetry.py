"""Spans, metrics and log fields of sas/services/telemetry.py, with the SDK's in-memory exporter
and reader (a provider of the test's own: the process's global one stays a no-op)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from sas.adapters.telemetry_setup import aad_client_id
from sas.domain.messages import ScheduleRequest, StepReply, StepRequest, decode, encode
from sas.domain.model import OrderState, ProcessState
from sas.domain.recovery import RetryPolicy
from sas.services import alerts, metrics, telemetry
from sas.services.gauges import QueueGauges
from sas.testing import FakeClock, InMemoryQueues, InMemoryRemote, InMemoryStore, instance, refuse
from tests.unit.test_services import ROUTES, submitted
from tests.workflows import REGISTRY

pytestmark = [pytest.mark.unit, pytest.mark.fast]

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def spans(monkeypatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "_tracer", provider.get_tracer("sas"))
    return exporter


@pytest.fixture
def reader(monkeypatch) -> Iterator[InMemoryMetricReader]:
    found = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[found])
    monkeypatch.setattr(metrics, "instruments", metrics.instruments_on(provider.get_meter("t")))
    yield found
    provider.shutdown()


def state_of(store: InMemoryStore, order_id: str = "o1") -> OrderState:
    found = store.get_state(order_id)
    assert found is not None
    return found.value


def points(reader: InMemoryMetricReader, name: str) -> list[tuple[dict[str, Any], Any]]:
    data = reader.get_metrics_data()
    found = []
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        value = point.count if isinstance(point, HistogramDataPoint) else None
                        if value is None:
                            value = getattr(point, "value", None)
                        found.append((dict(point.attributes or {}), value))
    return found


def test_without_an_sdk_nothing_is_traced_and_messages_are_unchanged():
    message = ScheduleRequest(order_id="o1")
    with telemetry.order_span(telemetry.SCHEDULE, "o1") as span:
        assert not span.is_recording()
        assert telemetry.stamped(message) is message
        assert telemetry.current_traceparent() is None


def test_an_incoming_context_passes_through_even_without_an_sdk():
    with (
        telemetry.continued({"traceparent": TRACEPARENT}),
        telemetry.order_span(telemetry.SCHEDULE, "o1"),
    ):
        stamped = telemetry.stamped(ScheduleRequest(order_id="o1"))
    assert stamped.trace is not None and stamped.trace.traceparent == TRACEPARENT


def test_the_envelope_carries_the_context_and_old_messages_still_decode():
    with trace.use_span(NonRecordingSpan(_context())):
        body = encode(telemetry.stamped(ScheduleRequest(order_id="o1")))
    assert b'"trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-' in body
    decoded = decode(ScheduleRequest, body)
    assert telemetry.carrier_from(decoded) == {"traceparent": TRACEPARENT}
    old = decode(ScheduleRequest, b'{"v":1,"type":"ScheduleRequest","order_id":"o1"}')
    assert old.trace is None and telemetry.carrier_from(old) == {}


def test_service_bus_properties_are_read_when_the_envelope_has_none():
    message = ScheduleRequest(order_id="o1")
    properties: dict[str | bytes, object] = {b"traceparent": TRACEPARENT.encode(), "x": 1}
    assert telemetry.carrier_from(message, properties) == {"traceparent": TRACEPARENT}


def test_a_submission_starts_the_orders_trace_and_stores_it(spans):
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    [submit] = [s for s in spans.get_finished_spans() if s.name == telemetry.SUBMIT]
    assert submit.parent is None
    assert submit.attributes == {
        "sas.order_id": "o1",
        "sas.priority": "normal",
        "sas.outcome": "accepted",
    }
    stored = state_of(store).traceparent
    assert telemetry.trace_id_of(stored) == f"{submit.context.trace_id:032x}"


def test_a_submission_continues_the_submitters_trace(spans):
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    with telemetry.continued({"traceparent": TRACEPARENT}):
        instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    [submit] = [s for s in spans.get_finished_spans() if s.name == telemetry.SUBMIT]
    assert f"{submit.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert submit.parent is not None and submit.parent.span_id == 0x00F067AA0BA902B7


def test_a_schedule_request_without_context_joins_the_stored_trace(spans):
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    state = state_of(store)
    instance(store, transport, ROUTES, clock, REGISTRY, "s1").schedule(
        ScheduleRequest(order_id="o1")
    )
    [schedule] = [s for s in spans.get_finished_spans() if s.name == telemetry.SCHEDULE]
    assert f"{schedule.context.trace_id:032x}" == telemetry.trace_id_of(state.traceparent)
    assert schedule.attributes is not None
    assert schedule.attributes["sas.outcome"] == "not_pending"


def test_supervisor_recovery_joins_the_trace_and_counts(spans, reader):
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    trace_id = telemetry.trace_id_of(state_of(store).traceparent)
    transport.take(ROUTES.agent("inventory"))  # its agent died: the request is gone
    clock.advance(120)  # the first step's deadline has passed
    policy = RetryPolicy(max_failures=3)
    instance(store, transport, ROUTES, clock, REGISTRY, "sup", policy=policy).sweep()
    [recover] = [s for s in spans.get_finished_spans() if s.name == telemetry.RECOVER]
    assert f"{recover.context.trace_id:032x}" == trace_id
    assert recover.attributes is not None
    assert recover.attributes["sas.step"] == "reserve" and recover.attributes["sas.attempt"] == 1
    assert recover.attributes["sas.outcome"] == "retry"
    assert points(reader, "sas.supervisor.recoveries") == [
        ({"sas.action": "retry", "sas.step": "reserve"}, 1)
    ]
    assert points(reader, "sas.retries") == [({"sas.kind": "step", "sas.step": "reserve"}, 1)]
    # The retry's ScheduleRequest was sent inside the recovery span: it carries its context.
    [sent] = [s for s in transport.sent if isinstance(s.message, ScheduleRequest)]
    assert sent.message == ScheduleRequest(order_id="o1")  # the fake sends unstamped


def test_a_refused_step_is_a_failed_agent_span_and_the_order_is_compensated(spans, reader):
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    [request] = [m for m in transport.to("agent-inventory") if isinstance(m, StepRequest)]
    remote = InMemoryRemote(clock)
    remote.script("inventory", "reserve", refuse("out of stock"))
    agent = instance(InMemoryStore(), transport, ROUTES, clock, REGISTRY, "agent-inventory")
    agent.with_remote(remote, sleep=clock.sleep).run_step("inventory", request)
    [agent_span] = [s for s in spans.get_finished_spans() if s.name == telemetry.AGENT]
    assert agent_span.status.status_code.name == "ERROR"
    [call] = [s for s in spans.get_finished_spans() if s.name == telemetry.REMOTE_CALL]
    assert call.parent is not None and call.parent.span_id == agent_span.context.span_id
    assert call.events and call.events[0].name == "exception"
    [reply] = [m for m in transport.to("replies") if isinstance(m, StepReply)]
    instance(store, transport, ROUTES, clock, REGISTRY, "s1").on_reply(reply)
    assert state_of(store).process_state is ProcessState.COMPENSATED
    names = [s.name for s in spans.get_finished_spans()]
    assert names.count(telemetry.REPLY) == 1
    [duration] = points(reader, "sas.step.duration")
    assert duration == ({"sas.step": "reserve", "sas.mode": "do", "sas.outcome": "refused"}, 1)
    # Nothing to undo (the first step failed): finished at once, no compensation started.
    assert points(reader, "sas.orders.finished") == [({"sas.outcome": "Compensated"}, 1)]
    assert points(reader, "sas.compensations") == []


def test_compensation_and_alerts_are_counted(reader):
    store, clock = InMemoryStore(), FakeClock()
    transport = InMemoryQueues(clock)
    instance(store, transport, ROUTES, clock, REGISTRY).submit(submitted())
    scheduler = instance(store, transport, ROUTES, clock, REGISTRY, "s1")
    first = transport.to("agent-inventory")[0]
    assert isinstance(first, StepRequest)
    done = StepReply(
        order_id="o1",
        step="reserve",
        step_index=0,
        attempt=first.attempt,
        outcome="ok",
        incarnation=first.incarnation,
    )
    scheduler.on_reply(done)
    second = transport.to("agent-payment")[0]
    assert isinstance(second, StepRequest)
    refused = StepReply(
        order_id="o1",
        step="charge",
        step_index=1,
        attempt=second.attempt,
        outcome="error",
        error="card declined",
        incarnation=second.incarnation,
    )
    scheduler.on_reply(refused)
    assert points(reader, "sas.compensations") == [({"sas.reason": "refused"}, 1)]
    metrics.instruments.alerts.add(0)
    alerts.alert(scheduler.ctx, "o1", "x", clock.now(), alert_id="a1")
    assert points(reader, "sas.alerts") == [({}, 1)]


def test_breaker_state_is_observed_from_the_cached_status(reader):
    metrics.watch_breaker("unit-payment", lambda: "open")
    metrics.watch_breaker("unit-never-read", lambda: None)
    found = {
        a["sas.service"]: v
        for a, v in points(reader, "sas.breaker.state")
        if str(a["sas.service"]).startswith("unit-")
    }
    assert found == {"unit-payment": 1}


class _Depths:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def depth(self, queue: str) -> int:
        self.asked.append(queue)
        return len(queue)


class _Poison:
    def list(self, limit: int = 100) -> list[Any]:
        class P:
            queue = "orders"

        return [P(), P()]


def test_queue_gauges_sample_at_most_once_per_interval_and_only_when_exported(reader, monkeypatch):
    store, clock, depths = InMemoryStore(), FakeClock(), _Depths()
    store.park_message("replies", "bad", b"x", clock.now())
    gauges = QueueGauges(depths, ("orders", "replies"), store, _Poison(), clock)  # type: ignore[arg-type]
    assert gauges.maybe_sample() is False  # no SDK installed: no reads
    assert depths.asked == []
    monkeypatch.setattr(metrics, "metrics_enabled", lambda: True)
    assert gauges.maybe_sample() is True
    clock.advance(30)
    assert gauges.maybe_sample() is False
    assert depths.asked == ["orders", "replies"]
    assert sorted((a["sas.queue"], v) for a, v in points(reader, "sas.queue.depth")) == [
        ("orders", 6),
        ("replies", 7),
    ]
    # One gauge per queue for both kinds: parked by the app (the table) and by the host.
    assert sorted((a["sas.queue"], v) for a, v in points(reader, "sas.parked")) == [
        ("orders", 2),
        ("replies", 1),
    ]
    assert points(reader, "sas.poisoned") == []
    clock.advance(timedelta(seconds=31).total_seconds())
    assert gauges.maybe_sample() is True


def test_a_parked_listing_that_fails_leaves_no_stale_figure_and_the_depths_sampled(
    reader, monkeypatch, caplog
):
    store, clock, depths = InMemoryStore(), FakeClock(), _Depths()

    class Failing:
        def list(self, limit: int = 100) -> list[Any]:
            raise TimeoutError("peek of one dead-letter queue timed out")

    monkeypatch.setattr(metrics, "metrics_enabled", lambda: True)
    QueueGauges(depths, ("orders",), store, _Poison(), clock).sample()  # type: ignore[arg-type]
    assert points(reader, "sas.parked") != []
    with caplog.at_level(logging.WARNING):
        QueueGauges(depths, ("orders",), store, Failing(), clock).sample()  # type: ignore[arg-type]
    assert points(reader, "sas.parked") == []  # not the last sample's, as if current
    assert sorted(a["sas.queue"] for a, _ in points(reader, "sas.queue.depth")) == ["orders"]
    assert "sas.gauge_parked_failed error=TimeoutError" in caplog.text


def test_log_records_carry_the_order_and_the_trace(spans, caplog):
    handler = caplog.handler
    telemetry.install_log_filter([handler])
    telemetry.install_log_filter([handler])  # idempotent
    assert sum(isinstance(f, telemetry.OrderLogFilter) for f in handler.filters) == 1
    log = logging.getLogger("tests.telemetry")
    with caplog.at_level(logging.INFO):
        with telemetry.order_span(telemetry.AGENT, "o9", step="ship", attempt=3) as span:
            log.info("sas.inside")
            log.info("sas.explicit", extra={"order_id": "other"})
        log.info("sas.outside")
    inside, explicit, outside = caplog.records
    context = span.get_span_context()
    assert (inside.order_id, inside.step, inside.attempt) == ("o9", "ship", 3)
    assert inside.trace_id == f"{context.trace_id:032x}"
    assert inside.span_id == f"{context.span_id:016x}"
    assert explicit.order_id == "other"
    assert not hasattr(outside, "order_id") and not hasattr(outside, "trace_id")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("ClientId=abc-123;Authorization=AAD", "abc-123"),
        ("Authorization=AAD", ""),  # the system-assigned identity
        ("", None),
        (None, None),
        ("ClientId=abc", None),
    ],
)
def test_the_authentication_string_names_the_identity(value, expected):
    assert aad_client_id(value) == expected


def _context() -> SpanContext:
    return SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


def test_azure_monitor_gets_the_identity_no_log_export_and_no_duplicate_http_spans(monkeypatch):
    import azure.monitor.opentelemetry as distro
    from azure.identity import ManagedIdentityCredential

    from sas.adapters import telemetry_setup

    seen: dict[str, Any] = {}
    monkeypatch.setattr(distro, "configure_azure_monitor", lambda **options: seen.update(options))
    telemetry_setup._azure_monitor(
        {
            telemetry_setup.CONNECTION_STRING: "InstrumentationKey=" + "0" * 32,
            telemetry_setup.AUTHENTICATION_STRING: "ClientId=abc;Authorization=AAD",
        }
    )
    assert seen["disable_logging"] is True
    assert isinstance(seen["credential"], ManagedIdentityCredential)
    assert {name for name, on in seen["instrumentation_options"].items() if not on["enabled"]} == {
        "requests",
        "urllib",
        "urllib3",
    }

"""OpenTelemetry for sas: spans per order, the W3C context they travel with and the log fields
of the order being handled (docs/architecture.md, "Tracing and metrics"; metrics: metrics.py).

Only the OpenTelemetry API is used here. Without an SDK provider (sas/adapters/telemetry_setup.py
installs one when an exporter is configured) every call is a no-op: a span is the
non-recording parent (so an incoming context passes through unchanged) and no attribute is
built.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sas.domain.messages import Message, TraceContext
from sas.domain.wire import (
    MAX_TRACESTATE,
    TRACEPARENT,
    TRACEPARENT_PROPERTY,
    TRACESTATE,
    TRACESTATE_PROPERTY,
)

INSTRUMENTATION = "sas"
_tracer = trace.get_tracer(INSTRUMENTATION)
_propagator = TraceContextTextMapPropagator()

# --- span names and attributes ------------------------------------------------------------

SUBMIT = "sas.submit"
SCHEDULE = "sas.schedule"
AGENT = "sas.agent"
REMOTE_CALL = "sas.remote_call"
REPLY = "sas.reply"
RECOVER = "sas.supervisor.recover"
COMPENSATE = "sas.compensate"

ORDER_ID = "sas.order_id"
STEP = "sas.step"
ATTEMPT = "sas.attempt"
MODE = "sas.mode"
PRIORITY = "sas.priority"
ENDPOINT = "sas.endpoint"
OUTCOME = "sas.outcome"


@dataclass(frozen=True)
class OrderFields:
    """What every log record emitted while handling one order carries."""

    order_id: str
    step: str | None = None
    attempt: int | None = None


M = TypeVar("M", bound=Message)

_fields: ContextVar[OrderFields | None] = ContextVar("sas_order_fields", default=None)


def carrier_of(traceparent: str | None, tracestate: str | None = None) -> dict[str, str]:
    carrier: dict[str, str] = {}
    if traceparent:
        carrier[TRACEPARENT_PROPERTY] = traceparent
        if tracestate:
            carrier[TRACESTATE_PROPERTY] = tracestate
    return carrier


def current_carrier() -> dict[str, str]:
    """The W3C headers of the current span (traceparent, tracestate); empty without one."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return {}
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier


def current_traceparent() -> str | None:
    return current_carrier().get(TRACEPARENT_PROPERTY)


def stamped(message: M) -> M:
    """``message`` with the current span's context in its envelope (unchanged without one)."""
    carrier = current_carrier()
    traceparent = carrier.get(TRACEPARENT_PROPERTY)
    if traceparent is None:
        return message
    trace_context = TraceContext(
        traceparent=traceparent, tracestate=carrier.get(TRACESTATE_PROPERTY)
    )
    return message.model_copy(update={"trace": trace_context})


def carrier_from(
    message: Message, properties: Mapping[str | bytes, object] | None = None
) -> dict[str, str]:
    """The context a received message carries: its envelope's, else the transport's message
    properties (Service Bus application properties, names as bytes or str)."""
    if message.trace is not None:
        return carrier_of(message.trace.traceparent, message.trace.tracestate)
    if not properties:
        return {}
    found: dict[str, str] = {}
    for key, value in properties.items():
        name = key.decode("ascii", "replace") if isinstance(key, bytes) else key
        if name in (TRACEPARENT_PROPERTY, TRACESTATE_PROPERTY):
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
            if isinstance(text, str) and len(text) <= 512:
                found[name] = text
    return found


@contextmanager
def continued(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Run the block in the trace ``carrier`` names (a message's context); unchanged if it
    names none or one that does not parse."""
    carrier = _well_formed(carrier)
    if not carrier:
        yield
        return
    extracted = _propagator.extract(carrier)
    if not trace.get_current_span(extracted).get_span_context().is_valid:
        yield
        return
    token = otel_context.attach(extracted)
    try:
        yield
    finally:
        otel_context.detach(token)


def _well_formed(carrier: Mapping[str, str] | None) -> dict[str, str]:
    """Only what the W3C grammar allows reaches the propagator, which logs what it cannot parse
    word for word: a sender must not be able to write into the app's logs. A bad traceparent
    means no context; a bad tracestate is dropped, as W3C asks."""
    traceparent = (carrier or {}).get(TRACEPARENT_PROPERTY)
    if traceparent is None or not TRACEPARENT.matches(traceparent):
        return {}
    tracestate = (carrier or {}).get(TRACESTATE_PROPERTY)
    if tracestate is not None and (
        len(tracestate) > MAX_TRACESTATE or not TRACESTATE.matches(tracestate)
    ):
        tracestate = None
    return carrier_of(traceparent, tracestate)


def resumed(traceparent: str | None) -> AbstractContextManager[None]:
    """The order's stored trace made current, unless a span already is (work an operator or a
    timer started about the order then joins its trace)."""
    if traceparent is None or trace.get_current_span().get_span_context().is_valid:
        return nullcontext()
    return continued(carrier_of(traceparent))


@contextmanager
def order_span(
    name: str,
    order_id: str,
    *,
    step: str | None = None,
    attempt: int | None = None,
    mode: str | None = None,
    priority: str | None = None,
    endpoint: str | None = None,
    parent: str | None = None,
) -> Iterator[Span]:
    """A span about one order (a child of the current span, or of ``parent``, a stored
    traceparent, when there is no current one), with the order's log fields set meanwhile."""
    context = None
    if parent is not None and not trace.get_current_span().get_span_context().is_valid:
        context = _propagator.extract({TRACEPARENT_PROPERTY: parent})
    token = _fields.set(OrderFields(order_id, step, attempt))
    try:
        with _tracer.start_as_current_span(name, context=context) as span:
            if span.is_recording():
                span.set_attributes(_attributes(order_id, step, attempt, mode, priority, endpoint))
            yield span
    finally:
        _fields.reset(token)


@contextmanager
def child_span(name: str, **attributes: str | int | None) -> Iterator[Span]:
    """A span inside the current one (a remote call), attributes prefixed ``sas.``."""
    with _tracer.start_as_current_span(name) as span:
        if span.is_recording():
            span.set_attributes({f"sas.{k}": v for k, v in attributes.items() if v is not None})
        yield span


def annotate(span: Span, **attributes: str | int | None) -> None:
    """More attributes on a span, known only once the work is done (its outcome)."""
    if span.is_recording():
        span.set_attributes({f"sas.{k}": v for k, v in attributes.items() if v is not None})


def fail(span: Span, reason: str) -> None:
    """Mark a span failed without an exception (a refusal, a step given up)."""
    if span.is_recording():
        span.set_status(Status(StatusCode.ERROR, reason[:200]))


def _attributes(
    order_id: str,
    step: str | None,
    attempt: int | None,
    mode: str | None,
    priority: str | None,
    endpoint: str | None,
) -> dict[str, str | int]:
    found: dict[str, str | int | None] = {
        ORDER_ID: order_id,
        STEP: step,
        ATTEMPT: attempt,
        MODE: mode,
        PRIORITY: priority,
        ENDPOINT: endpoint,
    }
    return {key: value for key, value in found.items() if value is not None}


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) of a W3C traceparent; None if there is none."""
    if traceparent is None:
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) >= 4 and len(parts[1]) == 32 else None


# --- log records --------------------------------------------------------------------------


class OrderLogFilter(logging.Filter):
    """Adds order_id, step and attempt of the order being handled, and trace_id and span_id of
    the current span, to every record that does not already carry them. Install it on the
    handlers (a logger's own filters never see records propagated from its children)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _fields.get()
        if fields is not None:
            if not hasattr(record, "order_id"):
                record.order_id = fields.order_id
            if fields.step is not None and not hasattr(record, "step"):
                record.step = fields.step
            if fields.attempt is not None and not hasattr(record, "attempt"):
                record.attempt = fields.attempt
        span_context: SpanContext = trace.get_current_span().get_span_context()
        if span_context.is_valid and not hasattr(record, "trace_id"):
            record.trace_id = f"{span_context.trace_id:032x}"
            record.span_id = f"{span_context.span_id:016x}"
        return True


def install_log_filter(handlers: Iterable[logging.Handler] | None = None) -> None:
    """Put one OrderLogFilter on each handler (the root logger's by default); idempotent."""
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        if not any(isinstance(f, OrderLogFilter) for f in handler.filters):
            handler.addFilter(OrderLogFilter())

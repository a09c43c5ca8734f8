"""Where spans and metrics go: installs the OpenTelemetry SDK once per process, from the
environment (docs/architecture.md, "Tracing and metrics").

- ``APPLICATIONINSIGHTS_CONNECTION_STRING`` (Azure): azure-monitor-opentelemetry, authenticated
  with the managed identity ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` names
  (``ClientId=<id>;Authorization=AAD``, as infra/modules/functionapp.bicep sets it). Its log
  export stays off: the Functions host already ships the worker's log records, and the operator
  alert rule reads them there.
- else ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its ``_TRACES_``/``_METRICS_`` forms): OTLP over HTTP.
- else ``OTEL_TRACES_EXPORTER=console`` / ``OTEL_METRICS_EXPORTER=console``: printed to stdout.
- else nothing, and every instrument stays a no-op. ``OTEL_SDK_DISABLED=true`` also means
  nothing; so does a provider someone installed first (a test's in-memory exporter).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

CONNECTION_STRING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
AUTHENTICATION_STRING = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"
SERVICE_NAME = "sas"

AZURE_MONITOR_INSTRUMENTATIONS = {
    "requests": {"enabled": False},
    "urllib": {"enabled": False},
    "urllib3": {"enabled": False},
}
"""The storage and Service Bus calls are already spans of the Azure SDK's own instrumentation
(``azure_sdk``, kept on); the HTTP libraries under it would record every request again."""

_lock = threading.Lock()
_configured: list[str] = []


def configure(env: Mapping[str, str]) -> str:
    """Install exporters as ``env`` asks, once per process; returns which (``azure_monitor``,
    ``otlp``, ``console``, ``external`` or ``off``)."""
    with _lock:
        if not _configured:
            _configured.append(_configure(env))
            log.info("sas.telemetry_configured", extra={"exporter": _configured[0]})
        return _configured[0]


def _configure(env: Mapping[str, str]) -> str:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "off"
    from opentelemetry import trace

    if type(trace.get_tracer_provider()).__name__ not in (
        "ProxyTracerProvider",
        "NoOpTracerProvider",
    ):
        return "external"
    if env.get(CONNECTION_STRING):
        _azure_monitor(env)
        return "azure_monitor"
    if any(
        env.get(name)
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )
    ):
        _sdk(env, otlp=True)
        return "otlp"
    if "console" in (env.get("OTEL_TRACES_EXPORTER"), env.get("OTEL_METRICS_EXPORTER")):
        _sdk(env, otlp=False)
        return "console"
    return "off"


def aad_client_id(authentication: str | None) -> str | None:
    """The managed identity's client id in ``ClientId=<id>;Authorization=AAD``; None when the
    string asks for no Entra authentication."""
    if not authentication:
        return None
    parts = {
        key.strip().lower(): value.strip()
        for key, _, value in (part.partition("=") for part in authentication.split(";"))
        if key.strip()
    }
    if parts.get("authorization", "").lower() != "aad":
        return None
    return parts.get("clientid") or ""


def _azure_monitor(env: Mapping[str, str]) -> None:
    from azure.monitor.opentelemetry import configure_azure_monitor

    options: dict[str, Any] = {
        "connection_string": env[CONNECTION_STRING],
        "disable_logging": True,
        "resource": _resource(env),
        "instrumentation_options": AZURE_MONITOR_INSTRUMENTATIONS,
    }
    client_id = aad_client_id(env.get(AUTHENTICATION_STRING))
    if client_id is not None:
        from azure.identity import ManagedIdentityCredential

        options["credential"] = ManagedIdentityCredential(client_id=client_id or None)
    configure_azure_monitor(**options)


def _resource(env: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.resources import Resource

    return Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or SERVICE_NAME})


def _sdk(env: Mapping[str, str], *, otlp: bool) -> None:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        MetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    span_exporter: SpanExporter
    metric_exporter: MetricExporter
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter, metric_exporter = OTLPSpanExporter(), OTLPMetricExporter()
    else:
        span_exporter, metric_exporter = ConsoleSpanExporter(), ConsoleMetricExporter()
    resource = _resource(env)
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(metric_exporter)
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))

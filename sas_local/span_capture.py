"""A dev-host preload (``SAS_DEVHOST_PRELOAD=sas_local.span_capture``) that records every
finished span of a worker as one JSON line in ``$SAS_SPAN_CAPTURE_DIR/spans-<pid>.jsonl``.

Written as each span ends, so a worker that is stopped (or killed) loses nothing it finished:
what the end-to-end tracing test reads (tests/e2e/flex/test_tracing.py). Metrics go to an
in-memory reader, so the app sees an SDK meter provider as it would with an exporter.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

CAPTURE_DIR_ENV = "SAS_SPAN_CAPTURE_DIR"


class JsonLinesSpanExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span)) + "\n" for span in spans)
        with self._lock, self._path.open("a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


def span_record(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    if context is None:
        raise ValueError(f"span {span.name} has no context")
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "start": span.start_time,
        "end": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [event.name for event in span.events],
        "pid": os.getpid(),
    }


def read_spans(directory: Path) -> list[dict[str, Any]]:
    """Every span recorded in ``directory`` by any worker, in start order."""
    found: list[dict[str, Any]] = []
    for path in sorted(directory.glob("spans-*.jsonl")):
        found.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return sorted(found, key=lambda span: span["start"])


def install(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    provider = TracerProvider()
    exporter = JsonLinesSpanExporter(directory / f"spans-{os.getpid()}.jsonl")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


_directory = os.environ.get(CAPTURE_DIR_ENV)
if _directory:
    install(Path(_directory))

"""sas's OpenTelemetry metric instruments and gauges (docs/architecture.md, "Tracing and
metrics"). Without an SDK meter provider they record nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from opentelemetry import metrics

from sas.services.telemetry import INSTRUMENTATION

_meter = metrics.get_meter(INSTRUMENTATION)

BREAKER_LEVELS = {"closed": 0, "open": 1, "half_open": 2}
"""``sas.breaker.state`` values: a gauge is a number."""

_breakers: dict[str, Callable[[], str | None]] = {}
_breakers_lock = threading.Lock()


def watch_breaker(name: str, status: Callable[[], str | None]) -> None:
    """Report a breaker's state (from what its process already caches: no read is made)."""
    with _breakers_lock:
        _breakers[name] = status


def _observe_breakers(options: metrics.CallbackOptions) -> Iterator[metrics.Observation]:
    with _breakers_lock:
        watched = list(_breakers.items())
    for name, status in watched:
        level = BREAKER_LEVELS.get(status() or "")
        if level is not None:
            yield metrics.Observation(level, {"sas.service": name})


class Levels:
    """The last sampled value of each series of a gauge, reported at every collection (the
    sampling itself is the caller's, at its own pace: sas/services/gauges.py)."""

    def __init__(self, attribute: str) -> None:
        self._attribute = attribute
        self._values: dict[str, int] = {}
        self._lock = threading.Lock()

    def set(self, values: Mapping[str, int]) -> None:
        with self._lock:
            self._values = dict(values)

    def observe(self, options: metrics.CallbackOptions) -> Iterator[metrics.Observation]:
        with self._lock:
            values = list(self._values.items())
        for key, value in values:
            yield metrics.Observation(value, {self._attribute: key})


queue_depth = Levels("sas.queue")
parked = Levels("sas.queue")


@dataclass(frozen=True)
class Instruments:
    orders_finished: metrics.Counter
    step_duration: metrics.Histogram
    retries: metrics.Counter
    recoveries: metrics.Counter
    compensations: metrics.Counter
    alerts: metrics.Counter


def instruments_on(meter: metrics.Meter) -> Instruments:
    """Every instrument of sas on ``meter`` (the global one at import; a test's own)."""
    gauges = (
        (
            "sas.breaker.state",
            _observe_breakers,
            "1",
            "Breaker per target: 0 closed, 1 open, 2 half",
        ),
        ("sas.queue.depth", queue_depth.observe, "{message}", "Messages waiting per queue"),
        (
            "sas.parked",
            parked.observe,
            "{message}",
            "Messages parked per queue: bad input the app refused and what the host gave up on",
        ),
    )
    for name, callback, unit, description in gauges:
        meter.create_observable_gauge(
            name, callbacks=[callback], unit=unit, description=description
        )
    return Instruments(
        orders_finished=meter.create_counter(
            "sas.orders.finished", unit="{order}", description="Orders that reached a final state"
        ),
        step_duration=meter.create_histogram(
            "sas.step.duration",
            unit="s",
            description="One step attempt in its agent, remote retries included",
        ),
        retries=meter.create_counter(
            "sas.retries", unit="{retry}", description="Remote calls tried again, steps retried"
        ),
        recoveries=meter.create_counter(
            "sas.supervisor.recoveries",
            unit="{expiry}",
            description="Expired steps the Supervisor acted on",
        ),
        compensations=meter.create_counter(
            "sas.compensations", unit="{order}", description="Compensations started"
        ),
        alerts=meter.create_counter("sas.alerts", unit="{alert}", description="Operator alerts"),
    )


instruments = instruments_on(_meter)


def metrics_enabled() -> bool:
    """Whether an SDK meter provider is installed (the sampled gauges cost reads)."""
    provider = metrics.get_meter_provider()
    return type(provider).__name__ not in ("NoOpMeterProvider", "_ProxyMeterProvider")

"""Timer trigger: fire on the NCRONTAB schedule (UTC), never overlapping itself."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from azure.functions.timer import TimerRequest

from sas_local.devhost.invoke import InvocationContext, arguments, call_sync
from sas_local.devhost.loader import TimerFunction

log = logging.getLogger(__name__)

PAST_DUE_AFTER = timedelta(seconds=1)


def utcnow() -> datetime:
    return datetime.now(UTC)


class TimerRunner:
    def __init__(self, function: TimerFunction, app_dir: Path) -> None:
        self.function = function
        self._app_dir = app_dir
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"devhost-timer-{function.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def wait_idle(self, deadline: float) -> bool:
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def _run(self) -> None:
        if self.function.run_on_startup and not self._stop.is_set():
            self._fire(past_due=False)
        while not self._stop.is_set():
            due = self.function.schedule.next_after(utcnow())
            while not self._stop.is_set():
                remaining = (due - utcnow()).total_seconds()
                if remaining <= 0:
                    break
                self._stop.wait(remaining)
            if self._stop.is_set():
                break
            self._fire(past_due=utcnow() - due > PAST_DUE_AFTER)

    def _fire(self, *, past_due: bool) -> None:
        function = self.function
        context = InvocationContext(function.name, self._app_dir)
        request = TimerRequest(past_due=past_due)
        fields = {"function": function.name, "invocation_id": context.invocation_id}
        started = time.monotonic()
        try:
            call_sync(
                function.fn,
                arguments(function.fn, function.arg_name, request, context),
                context.invocation_id,
            )
        except Exception:
            log.exception("sas.devhost.timer_failed", extra=fields)
            return
        elapsed = round((time.monotonic() - started) * 1000, 1)
        log.debug("sas.devhost.timer_fired", extra={**fields, "duration_ms": elapsed})

"""Logging for the dev host: one line per record on stderr, ``extra`` fields as key=value.

Records go through a queue: the thread that logs formats its record and enqueues it, and one
listener thread writes to stderr. A worker runs well over a hundred invocation threads; with
the stream handler on the root logger they queued on its lock behind every write (and behind
a full stderr pipe). :func:`shutdown` writes what is still queued; call it before exiting.
:func:`flush` waits until what was logged so far is written (a worker calls it before it
reports ready, so its start-up lines are on stderr by then).
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys
import threading
from collections.abc import Callable
from typing import TextIO

_STANDARD = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
_QUIET = ("azure", "uvicorn", "uvicorn.error", "uvicorn.access", "urllib3")


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{key}={value}" for key, value in vars(record).items() if key not in _STANDARD]
        if not fields:
            return line
        head, newline, tail = line.partition("\n")
        return f"{head} {' '.join(fields)}{newline}{tail}"


DROPPED = "dropped_in_azure"
"""The field that marks an app's record the Functions host would not forward: no invocation
id where it was emitted (sas/entrypoints/invocation.py)."""


class _EnqueueHandler(logging.handlers.QueueHandler):
    """A QueueHandler that emits without taking the handler's lock: its emit formats a copy
    of the record and puts it on a thread-safe queue, so the lock ``Handler.handle`` holds
    around it would only serialise the logging threads. In the emitting thread, it marks an
    app's record that carries no invocation, as the worker would find it there."""

    def __init__(
        self,
        records: queue.SimpleQueue[logging.LogRecord],
        invocation_of: Callable[[], str | None] | None,
    ) -> None:
        super().__init__(records)
        self._invocation_of = invocation_of

    def handle(self, record: logging.LogRecord) -> bool:
        kept = self.filter(record)
        if kept:
            invocation_of = self._invocation_of
            app_record = not record.name.startswith("sas_local")
            if invocation_of is not None and app_record and invocation_of() is None:
                setattr(record, DROPPED, 1)
            self.emit(record)
        return bool(kept)


_FLUSH = "sas_local.devhost.logs.flush"
"""The logger name of the marker :func:`flush` queues behind what was logged before it."""


def _flush_marker(record: logging.LogRecord) -> bool:
    """Writes every record but the flush marker, which it signals instead: one writer thread
    takes records in order, so everything queued before the marker has been written."""
    if record.name != _FLUSH:
        return True
    done = getattr(record, "done", None)
    if isinstance(done, threading.Event):
        done.set()
    return False


class _Pipeline:
    def __init__(
        self, stream: logging.Handler, invocation_of: Callable[[], str | None] | None
    ) -> None:
        stream.addFilter(_flush_marker)
        self.stream = stream
        self.records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self.enqueue = _EnqueueHandler(self.records, invocation_of)
        self.listener = logging.handlers.QueueListener(self.records, stream)
        self.listener.start()


_pipeline: _Pipeline | None = None


def configure(level: str, role: str, stream: TextIO | None = None, *, app: bool = True) -> None:
    """Log to ``stream`` (stderr) through a queue and one writer thread (replacing any earlier
    setup). ``app``: this process runs the app's functions (a worker, not the pool's parent),
    so its records carry the order, the trace and the invocation."""
    global _pipeline
    shutdown()
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(
        KeyValueFormatter(f"%(asctime)s %(levelname)s [{role}] %(name)s: %(message)s")
    )
    if not app:  # the parent imports none of the app's modules: it starts in a tenth the CPU
        _pipeline = _Pipeline(handler, None)
    else:
        from sas.services import telemetry
        from sas_local.devhost.invoke import current_invocation_id

        _pipeline = _Pipeline(handler, current_invocation_id)
        # In the logging thread, where the order being handled and its span are known.
        telemetry.install_log_filter([_pipeline.enqueue])
    root = logging.getLogger()
    root.handlers[:] = [_pipeline.enqueue]
    root.setLevel(level.upper())
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))


def flush(timeout: float = 5.0) -> None:
    """Wait (at most ``timeout`` seconds) until every record logged so far is written."""
    pipeline = _pipeline
    if pipeline is None:
        return
    done = threading.Event()
    pipeline.records.put(logging.makeLogRecord({"name": _FLUSH, "done": done}))
    done.wait(timeout)
    pipeline.stream.flush()


def shutdown() -> None:
    """Write every queued record, stop the writer thread and log directly from then on."""
    global _pipeline
    pipeline, _pipeline = _pipeline, None
    if pipeline is None:
        return
    root = logging.getLogger()
    if pipeline.enqueue in root.handlers:
        root.handlers[:] = [pipeline.stream if h is pipeline.enqueue else h for h in root.handlers]
    pipeline.listener.stop()  # drains the queue, then joins the writer thread
    pipeline.stream.flush()


atexit.register(shutdown)

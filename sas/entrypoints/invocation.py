"""Every log record of an invocation reaches the Functions host, whichever thread writes it.

The Python worker forwards a record as the invocation's only when it finds the invocation id in
the emitting thread's ``context.thread_local_storage`` (or on its asyncio task); a record from a
thread the app runs work on (the Supervisor's pool, FastAPI's threadpool for sync routes) has
none and never reaches Application Insights. Each trigger runs inside ``attributed``; the
invocation travels in a context variable, which those threads inherit (sas/services/supervisor.py
copies it into its pool; anyio copies it into FastAPI's), and a log record factory sets the id
in the thread's storage before the record is emitted: what the Functions documentation asks of
threads an app starts. A thread outside any invocation (the router's heartbeat) has none: its
records (``sas.endpoint_load_*_failed``) stay in the host's own log, not Application Insights.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_CURRENT: ContextVar[tuple[Any, str] | None] = ContextVar("sas_invocation", default=None)
_lock = threading.Lock()
_previous: Callable[..., logging.LogRecord] | None = None


@contextmanager
def attributed(storage: Any, invocation_id: str) -> Iterator[None]:
    """Records logged in this invocation, from any thread that inherits it, carry its id.
    ``storage``: the invocation's ``context.thread_local_storage``."""
    _install()
    token = _CURRENT.set((storage, invocation_id))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _record(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record = (_previous or logging.LogRecord)(*args, **kwargs)
    found = _CURRENT.get()
    if found is not None:
        storage, invocation_id = found
        if getattr(storage, "invocation_id", None) != invocation_id:
            storage.invocation_id = invocation_id
    return record


def _install() -> None:
    """Put ``_record`` in front of the current record factory, once per process."""
    global _previous
    with _lock:
        if _previous is None:
            _previous = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_record)

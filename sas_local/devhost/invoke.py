"""Calling user functions the way the Python worker does: trigger argument plus ``context``.

As in the worker, one thread-local storage per process holds the invocation id of the thread
that runs an invocation (``context.thread_local_storage``), set around a sync call and on the
task of an async one; ``current_invocation_id`` reads it where a record is emitted, and the dev
host's logs mark a record without one, which the Functions host would not forward
(sas_local/devhost/logs.py)."""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import azure.functions as func


class _TraceContext:
    """What ``func.Context.trace_context`` offers: no trace came in."""

    @property
    def trace_state(self) -> str:
        return ""

    @property
    def trace_parent(self) -> str:
        return ""

    @property
    def attributes(self) -> dict[str, str]:
        return {}


class _RpcException:
    @property
    def source(self) -> str:
        return ""

    @property
    def stack_trace(self) -> str:
        return ""

    @property
    def message(self) -> str:
        return ""


class _RetryContext:
    """What ``func.Context.retry_context`` offers: the first try, no retry policy."""

    @property
    def retry_count(self) -> int:
        return 0

    @property
    def max_retry_count(self) -> int:
        return 0

    @property
    def exception(self) -> _RpcException:
        return _RpcException()


WORKER_LOCAL = threading.local()
"""The worker's thread-local invocation storage: one per process, set per thread."""
_TASK_ATTRIBUTE = "_sas_devhost_invocation_id"
_running: set[str] = set()
"""The invocations under way: the host forwards a record only for one of them (an id left on
a reused thread by a finished invocation counts for nothing)."""
_running_lock = threading.Lock()


def current_invocation_id() -> str | None:
    """The running invocation the calling thread (or asyncio task) names, as the host takes it."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop in this thread
        task = None
    found = getattr(task, _TASK_ATTRIBUTE, None) if task is not None else None
    found = found or getattr(WORKER_LOCAL, "invocation_id", None)
    with _running_lock:
        return found if found in _running else None


@contextmanager
def _under_way(invocation_id: str) -> Iterator[None]:
    with _running_lock:
        _running.add(invocation_id)
    try:
        yield
    finally:
        with _running_lock:
            _running.discard(invocation_id)


class InvocationContext(func.Context):
    """A concrete ``func.Context`` (the abstract one cannot be instantiated)."""

    def __init__(self, function_name: str, function_directory: Path) -> None:
        self._invocation_id = str(uuid.uuid4())
        self._function_name = function_name
        self._function_directory = str(function_directory)
        self._thread_local = WORKER_LOCAL

    @property
    def invocation_id(self) -> str:
        return self._invocation_id

    @property
    def thread_local_storage(self) -> type[threading.local]:
        # The worker hands out a threading.local instance; the ABC annotates it as a type.
        return cast(type[threading.local], self._thread_local)

    @property
    def function_name(self) -> str:
        return self._function_name

    @property
    def function_directory(self) -> str:
        return self._function_directory

    @property
    def trace_context(self) -> Any:  # the SDK types these with its private ABCs
        return _TraceContext()

    @property
    def retry_context(self) -> Any:
        return _RetryContext()


def wants_context(fn: Callable[..., Any], arg_name: str) -> bool:
    return arg_name != "context" and "context" in inspect.signature(fn).parameters


def arguments(
    fn: Callable[..., Any], arg_name: str, value: object, context: InvocationContext
) -> dict[str, object]:
    kwargs: dict[str, object] = {arg_name: value}
    if wants_context(fn, arg_name):
        kwargs["context"] = context
    return kwargs


def call_sync(fn: Callable[..., Any], kwargs: dict[str, object], invocation_id: str) -> object:
    """Call from a worker thread, attributed to ``invocation_id`` while it runs; an ``async
    def`` function gets its own event loop."""
    WORKER_LOCAL.invocation_id = invocation_id
    try:
        with _under_way(invocation_id):
            result = fn(**kwargs)
            if inspect.isawaitable(result):
                return asyncio.run(call_async(result, invocation_id))
            return result
    finally:
        WORKER_LOCAL.invocation_id = None


async def call_async(awaitable: Any, invocation_id: str) -> object:
    """Await in a task of its own that carries ``invocation_id``, as the worker's do."""
    task = asyncio.ensure_future(awaitable)
    setattr(task, _TASK_ATTRIBUTE, invocation_id)
    with _under_way(invocation_id):
        return await task

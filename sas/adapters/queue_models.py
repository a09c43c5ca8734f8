"""The Storage Queue SDK's first calls in a process, one at a time.

azure-storage-queue works out each of its generated model classes' fields on the class's first
instance, unguarded: when several threads send or receive for the first time in a process at
once, one can read a class another is still filling in, and the call fails with
``RuntimeError: dictionary changed size during iteration`` or returns a half-decoded answer
(``'Element' object has no attribute 'message_id'``) after the message was queued.

:func:`first_calls_alone` runs an operation's calls under one process-wide lock until one of
them has decoded an answer: the classes it uses are then filled in, by one thread, and later
calls run unlocked. Only the SDK's public API is used.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_decoded: set[str] = set()


def first_calls_alone(
    operation: str, call: Callable[[], T], *, decoded: Callable[[T], bool] = bool
) -> T:
    """``call()``, alone in the process until ``decoded(result)`` held once for ``operation``
    (an SDK method name). ``decoded``: whether the answer made the SDK build its models (a
    receive or peek that found nothing built none); by default, a truthy result."""
    if operation in _decoded:
        return call()
    with _lock:
        result = call()
        if decoded(result):
            _decoded.add(operation)
        return result


def sent(_: object) -> bool:
    """A send's answer is always decoded (the new message's id and receipt)."""
    return True

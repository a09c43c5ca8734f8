"""The order states this process wrote last, each with the ETag its write returned.

A step's reply often comes back to the instance that claimed the step (always, on one
instance). That instance already knows the state row as it wrote it, and the ETag proves
whether the row is still that: the Scheduler starts from the remembered state instead of
reading it, and its write is conditional on the remembered ETag as it would be on a read one.
If anyone wrote the row since, the write fails and the Scheduler reads it and decides again;
a remembered state is never trusted to refuse a reply (a fence that does not let the reply
through is decided again on a fresh read). Bounded: the least recently written are forgotten
first, and an order that finished is forgotten at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from sas.domain.model import OrderState, Versioned

CAPACITY = 2_000
"""Orders remembered per process: about 2 KiB each for a typical order (more with many lines),
so a few MB; more than one instance has waiting for a reply at once."""


class RecentStates:
    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._lock = threading.Lock()
        self._states: OrderedDict[str, Versioned[OrderState]] = OrderedDict()

    def remember(self, state: OrderState, etag: str) -> None:
        """``state`` is what the row holds at ``etag`` (this process just wrote it)."""
        with self._lock:
            if state.is_terminal:
                self._states.pop(state.order_id, None)
                return
            self._states[state.order_id] = Versioned(state, etag)
            self._states.move_to_end(state.order_id)
            while len(self._states) > self._capacity:
                self._states.popitem(last=False)

    def get(self, order_id: str) -> Versioned[OrderState] | None:
        with self._lock:
            return self._states.get(order_id)

    def forget(self, order_id: str) -> None:
        with self._lock:
            self._states.pop(order_id, None)

    def clear(self) -> None:
        with self._lock:
            self._states.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._states)

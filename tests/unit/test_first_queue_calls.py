"""First calls of a Storage Queue operation run one at a time (sas/adapters/storage_queues.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import count

import pytest

from sas.adapters.storage_queues import first_calls_alone, sent

pytestmark = [pytest.mark.unit, pytest.mark.fast]


class Overlaps:
    """A call that records how many of its kind ran at once."""

    def __init__(self, answer: list[str]) -> None:
        self.answer = answer
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self) -> list[str]:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.01)
        with self._lock:
            self.running -= 1
        return self.answer


_names = count()


def operation() -> str:
    """A name no other test used: the module's memory is per process."""
    return f"op-{next(_names)}"


def run_together(name: str, call: Overlaps, threads: int = 8) -> None:
    barrier = threading.Barrier(threads)

    def one(_: int) -> None:
        barrier.wait()
        first_calls_alone(name, call)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))


def test_first_calls_never_overlap_until_one_decoded_an_answer_then_they_may() -> None:
    name, empty, full = operation(), Overlaps([]), Overlaps(["message"])
    run_together(name, empty)
    run_together(name, empty)
    assert empty.most == 1  # empty answers build no models: still one at a time
    first_calls_alone(name, full)
    run_together(name, full)
    assert full.most > 1


def test_a_failed_first_call_leaves_the_next_ones_alone_too() -> None:
    name = operation()

    def failing() -> list[str]:
        raise ConnectionError("storage down")

    with pytest.raises(ConnectionError):
        first_calls_alone(name, failing)
    calls = Overlaps([])
    run_together(name, calls)
    assert calls.most == 1


def test_a_send_counts_as_decoded_whatever_it_returns() -> None:
    name = operation()
    first_calls_alone(name, lambda: None, decoded=sent)
    calls = Overlaps([])
    run_together(name, calls)
    assert calls.most > 1

"""Requests whose answer a reset connection lost, in the benchmark's own bursts on Azurite.

Under 16 concurrent writers Azurite, on its one thread, sometimes resets a connection; azure-core
retries no POST whose answer was lost (it may have been applied). The benchmark's set-up writes
are tried again here, knowing what an applied first try looks like; its timed requests count
such a loss apart instead of stopping the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from azure.core.exceptions import ServiceResponseError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_fixed

T = TypeVar("T")

TRIES = 3


def retried(call: Callable[[], T], landed: tuple[type[Exception], ...] = ()) -> T | None:
    """``call()``, tried again while its answer is lost (ServiceResponseError), at most TRIES
    times. An exception in ``landed`` on a later try says an earlier try was applied: None."""
    for attempt in Retrying(
        retry=retry_if_exception_type(ServiceResponseError),
        stop=stop_after_attempt(TRIES),
        wait=wait_fixed(0.2),
        reraise=True,
    ):
        with attempt:
            try:
                return call()
            except landed:
                if attempt.retry_state.attempt_number == 1:
                    raise
                return None
    raise AssertionError("unreachable: Retrying returns or raises")  # for the type checker

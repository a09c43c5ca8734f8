"""Test an application's workflows in memory, in milliseconds (README, "Extend"):

    harness = Harness(REGISTRY)
    harness.script("payment", "charge", fault(), refuse("card declined"))
    order_id = harness.submit("order", details)
    harness.run()
    assert harness.state(order_id).process_state is ProcessState.COMPENSATED

Not deployed with the app (``.funcignore``).
"""

from sas.domain.model import ProcessState
from sas.testing.harness import (
    Call,
    Crash,
    Harness,
    HarnessError,
    Outcome,
    crash_before_reply,
    fault,
    ok,
    refuse,
    too_slow,
)
from sas.testing.memory import FakeClock, InMemoryStore

__all__ = [
    "Call",
    "Crash",
    "FakeClock",
    "Harness",
    "HarnessError",
    "InMemoryStore",
    "Outcome",
    "ProcessState",
    "crash_before_reply",
    "fault",
    "ok",
    "refuse",
    "too_slow",
]

"""Test an application's workflows in memory, in milliseconds (README, "Extend"):

    harness = Harness(REGISTRY)
    harness.script("payment", "charge", fault(), refuse("card declined"))
    order_id = harness.submit("order", details)
    harness.run()
    assert harness.state(order_id).process_state is ProcessState.COMPENSATED

Its parts are the doubles sas's own tests use too: ``InMemoryStore``, ``InMemoryQueues`` (the
transport), ``InMemoryRemote`` (every remote service, scripted), ``InMemoryTables`` (the Python
agents' tables, ``app_table``), ``InMemoryLoads`` (endpoints' loads), ``InMemoryBudgets``
(retries held back), ``InMemoryBreakers`` (circuit breakers' state), ``FakeClock``, and
``instance`` (the handlers on one context). Not deployed with the app (``.funcignore``).
"""

from sas.domain.model import ProcessState
from sas.testing.harness import Harness, HarnessError
from sas.testing.instance import Instance, instance
from sas.testing.memory import (
    FakeClock,
    InMemoryBreakers,
    InMemoryBudgets,
    InMemoryLoads,
    InMemoryQueues,
    InMemoryStore,
    Sent,
)
from sas.testing.remote import (
    Call,
    Crash,
    InMemoryRemote,
    Outcome,
    crash_before_reply,
    fault,
    ok,
    refuse,
    too_slow,
)
from sas.testing.tables import InMemoryTable, InMemoryTables

__all__ = [
    "Call",
    "Crash",
    "FakeClock",
    "Harness",
    "HarnessError",
    "InMemoryBreakers",
    "InMemoryBudgets",
    "InMemoryLoads",
    "InMemoryQueues",
    "InMemoryRemote",
    "InMemoryStore",
    "InMemoryTable",
    "InMemoryTables",
    "Instance",
    "Outcome",
    "ProcessState",
    "Sent",
    "crash_before_reply",
    "fault",
    "instance",
    "ok",
    "refuse",
    "too_slow",
]

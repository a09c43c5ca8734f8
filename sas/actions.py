"""What an application's Python agents are written with (see README, "Extend").

def charge(context: ActionContext, data: dict) -> dict:
    if context.time_left() < 1:
        raise Transient("too little time left")
    client = Payments(context.setting("PAYMENTS_URL"))
    ...

PAYMENT = PythonAgent(
    "payment",
    {"charge": charge, "refund": refund},
    tables=("charges",),  # its records (app_table), provisioned with the app's
    settings={"PAYMENTS_URL": "http://127.0.0.1:7081/payment"},  # and its local value
)

``Transient(reason, retry_after=None, order_scoped=False)``: a fault that may clear; the step is
retried. ``order_scoped=True`` says the fault is this order's own (its card, its address), not
the service's: retried the same, but never counted by the agent's circuit breaker, so a few
bad orders cannot open it for every other. ``Refused(reason)``: a refusal for good.
"""

from typing import Any

from sas.domain.errors import PermanentRemoteError as Refused
from sas.domain.errors import TransientRemoteError as Transient
from sas.domain.workflow import PythonAgent
from sas.services.actions import TABLES, ActionContext

__all__ = ["ActionContext", "PythonAgent", "Refused", "Transient", "app_table"]


def app_table(name: str) -> Any:
    """An ``azure.data.tables.TableClient`` on a table of the app's own storage account that the
    agent declares (``PythonAgent(..., tables=(name,))``), over sas's storage connection: where
    an action can keep what it did under its idempotency key. One client per process. In a
    ``sas.testing.Harness``, an in-memory table with the same answers (``InMemoryTable``)."""
    in_memory = TABLES.get()
    if in_memory is not None:
        return in_memory(name)
    from sas import bootstrap  # on first use: the app's settings are read then, not at import

    return bootstrap.app_table(name)

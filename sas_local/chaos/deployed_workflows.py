"""The code a chaos campaign deploys mid-run: the app's workflows plus a version 2 of each.

Never deployed for real and never part of the app's ``workflows`` package (whose versions
``infra/workflows.lock.json`` locks): the campaign's ``deploy`` fault restarts dev hosts with
``SAS_APP_WORKFLOWS`` naming this module (``sas_local/python_faults.py`` wraps its Python
agents as it wraps the app's). Version 1 is the app's own object, so its fingerprint is the
one every order in flight was bound to; version 2 changes what a version must not change in
place (docs/your-workflow.md, "Changing a workflow"):

- ``reserve`` renamed ``hold`` (same agent, action and undo): new idempotency keys for v2
  orders only;
- ``ship`` moved before ``charge``: the same names at other positions, so a host that read a
  v1 order as v2 (or the reverse) would run another step than the one the order waits on;
- ``invoice`` appended, a payment action the simulator serves like any other (undone by
  ``void``, so a compensation can take back an invoice an expired attempt issued).

Version 2 of ``workspace`` lets ``notify`` be skipped (``on_failure="continue"``): a workspace
whose owner cannot be told ends Processed, without the message, instead of in Error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sas.domain.workflow import Registry, StepDefinition, Workflow
from workflows import REGISTRY as APP_REGISTRY
from workflows.order import OrderDetails
from workflows.workspace import WORKSPACE_WORKFLOW

_BUDGET = timedelta(seconds=15)


def held_shipment(
    order: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """What ship is sent in v2: the order, and the reservation ``hold`` made for it (v1's
    builder reads ``reserve``, a step v2 does not have)."""
    return {**order, "reservation": dict(results["hold"])}


ORDER_WORKFLOW_V2 = Workflow(
    name="order",
    steps=(
        StepDefinition("hold", "inventory", action="reserve", budget=_BUDGET, undo="release"),
        StepDefinition(
            "ship", "shipping", action="ship", budget=_BUDGET, undo="cancel", input=held_shipment
        ),
        StepDefinition("charge", "payment", action="charge", budget=_BUDGET, undo="refund"),
        StepDefinition("invoice", "payment", action="invoice", budget=_BUDGET, undo="void"),
    ),
    pickup_budget=timedelta(seconds=60),
    input=OrderDetails,
    version=2,
)

*_UP_TO_NOTIFY, _NOTIFY = WORKSPACE_WORKFLOW.steps
WORKSPACE_WORKFLOW_V2 = replace(
    WORKSPACE_WORKFLOW, steps=(*_UP_TO_NOTIFY, replace(_NOTIFY, on_failure="continue")), version=2
)

REGISTRY = Registry(
    workflows=(*APP_REGISTRY.workflows, ORDER_WORKFLOW_V2, WORKSPACE_WORKFLOW_V2),
    python_agents=APP_REGISTRY.python_agents,
)
"""What the new hosts run: every workflow of the app as its own object (the fingerprints its
orders in flight were bound to), and the version 2s beside them."""

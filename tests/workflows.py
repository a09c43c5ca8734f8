"""The workflows sas's own tests run, declared here so that the app's examples (``workflows/``)
can change, or gain a third, without touching a test of sas. Only the tests that check the
examples themselves import ``workflows``.

``SHOP`` reserves, charges and ships through three HTTP agents, each step undone backwards;
``STRICT`` stops in Error for an operator instead of compensating. ``REGISTRY`` (for
``SAS_WORKFLOWS_MODULE=tests.workflows``) declares both."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from sas.domain.workflow import Registry, StepDefinition, Workflow

_STRICT_MODEL = ConfigDict(extra="forbid", frozen=True, strict=True)  # Rust regex: $ ends the text
Key = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")]


class Line(BaseModel):
    model_config = _STRICT_MODEL

    sku: Key
    quantity: int = Field(ge=1, le=10_000)
    unit_price_cents: int = Field(ge=0, le=100_000_000)


class Basket(BaseModel):
    """SHOP's input."""

    model_config = _STRICT_MODEL

    customer_id: Key
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]
    lines: list[Line] = Field(min_length=1, max_length=100)
    address: Annotated[str, StringConstraints(min_length=1, max_length=200)]


def basket(customer_id: str = "c1", address: str = "1 Main St", **line: Any) -> dict[str, Any]:
    """SHOP's input as an application sends it: one line (``line``: its fields)."""
    first = {"sku": "sku-1", "quantity": 1, "unit_price_cents": 100, **line}
    document = {"customer_id": customer_id, "currency": "EUR", "lines": [first]}
    return Basket.model_validate({**document, "address": address}).model_dump(mode="json")


def shipment(order: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """What ship is sent: the order, and the reservation reserve made for it."""
    return {**order, "reservation": dict(results["reserve"])}


BUDGET = timedelta(seconds=15)
RESERVE = StepDefinition("reserve", "inventory", "reserve", BUDGET, undo="release")
CHARGE = StepDefinition("charge", "payment", "charge", BUDGET, undo="refund")
SHIP = StepDefinition("ship", "shipping", "ship", BUDGET, undo="cancel", input=shipment)

SHOP = Workflow("order", (RESERVE, CHARGE, SHIP), pickup_budget=timedelta(seconds=60), input=Basket)
STRICT = Workflow(
    "strict", (RESERVE, CHARGE), pickup_budget=timedelta(seconds=60), on_failure="error"
)
REGISTRY = Registry(workflows=(SHOP, STRICT))


def registry(*more: Workflow) -> Registry:
    """``REGISTRY`` with ``more`` workflows beside its own."""
    return Registry(workflows=(*REGISTRY.workflows, *more), python_agents=REGISTRY.python_agents)

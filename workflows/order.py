"""The order: reserve inventory, charge payment, ship; undone backwards if a step fails."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from sas.domain.workflow import StepDefinition, Workflow

BusinessId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")]
"""Customer ids and SKUs: the same safe alphabet as order ids."""


class OrderLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, regex_engine="python-re")

    sku: Annotated[BusinessId, StringConstraints(max_length=40)]
    quantity: int = Field(ge=1, le=10_000)
    unit_price_cents: int = Field(ge=0, le=100_000_000)


class OrderDetails(BaseModel):
    """The order workflow's input: what an ``OrderSubmitted`` carries as ``details``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, regex_engine="python-re")

    customer_id: BusinessId
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}\Z")]
    lines: list[OrderLine] = Field(min_length=1, max_length=100)
    address: Annotated[str, StringConstraints(min_length=1, max_length=200)]

    @property
    def total_cents(self) -> int:
        return sum(line.quantity * line.unit_price_cents for line in self.lines)


_BUDGET = timedelta(seconds=15)


def shipment(order: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """What ship is sent: the order, and the reservation reserve made for it."""
    return {**order, "reservation": dict(results["reserve"])}


ORDER_WORKFLOW = Workflow(
    name="order",
    steps=(
        StepDefinition("reserve", "inventory", action="reserve", budget=_BUDGET, undo="release"),
        StepDefinition("charge", "payment", action="charge", budget=_BUDGET, undo="refund"),
        StepDefinition(
            "ship", "shipping", action="ship", budget=_BUDGET, undo="cancel", input=shipment
        ),
    ),
    pickup_budget=timedelta(seconds=60),
    input=OrderDetails,
    # About the pace one stack on 2 cores keeps (8-10 orders/s) times how long an order holds
    # its place (latency, the 17 s claim deadline and a sweep): past it, orders wait their turn.
    max_in_flight=200,
)

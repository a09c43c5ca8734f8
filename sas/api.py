"""HTTP API (FastAPI), served by Azure Functions through its ASGI integration.

Routes are absolute (/api/...): host.json sets the Functions route prefix to "".
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Path, status
from pydantic import BaseModel

from sas import bootstrap
from sas.domain.messages import OrderSubmitted

api = FastAPI(title="sas", version="0.1.0", docs_url="/api/docs", openapi_url="/api/openapi.json")

OrderIdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]


class StepView(BaseModel):
    index: int
    name: str
    attempt: int
    completed_at: datetime
    result: dict[str, Any]


class OrderView(BaseModel):
    order_id: str
    workflow: str
    process_state: str
    step_index: int
    step: str
    attempt: int
    failure_count: int
    locked_by: str | None
    complete_by: datetime | None
    submitted_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    last_error: str | None
    details: dict[str, Any]
    steps: list[StepView]


@api.get("/api/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@api.get("/api/orders/{order_id}", response_model=OrderView)
def get_order(order_id: OrderIdPath) -> OrderView:
    from sas.domain.workflow import workflow_named

    store = bootstrap.store()
    current = store.get_state(order_id)
    order = store.get_order(order_id)
    if current is None or order is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"order {order_id} not found")
    state = current.value
    return OrderView(
        order_id=state.order_id,
        workflow=state.workflow,
        process_state=state.process_state.value,
        step_index=state.step_index,
        step=workflow_named(state.workflow).step(state.step_index).name,
        attempt=state.attempt,
        failure_count=state.failure_count,
        locked_by=state.locked_by,
        complete_by=state.complete_by,
        submitted_at=state.submitted_at,
        updated_at=state.updated_at,
        finished_at=state.finished_at,
        last_error=state.last_error,
        details=order.details,
        steps=[StepView(**vars(step)) for step in store.get_steps(order_id) if step.attempt],
    )


@api.post("/api/orders", status_code=status.HTTP_202_ACCEPTED)
def submit_order(order: OrderSubmitted) -> dict[str, str]:
    """Convenience: posts the order to the orders queue, exactly as an application would."""
    bootstrap.transport().send(
        bootstrap.routes().orders, order, message_id=order.order_id, correlation_id=order.order_id
    )
    return {"order_id": order.order_id, "status": f"/api/orders/{order.order_id}"}

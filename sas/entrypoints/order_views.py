"""How the HTTP API shows an order: its state, its completed steps and its history."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, Field

from sas.domain.model import OrderState
from sas.domain.wire import ORDER_ID
from sas.domain.workflow import Registry
from sas.services import telemetry
from sas.services.operator import OrderDetail, step_name

OrderIdPath = Annotated[str, Path(pattern=ORDER_ID.end_of_text)]


class StateView(BaseModel):
    order_id: str
    workflow: str
    process_state: str
    step_index: int
    step: str
    mode: str
    attempt: int
    failure_count: int
    locked_by: str | None
    complete_by: datetime | None
    not_before: datetime | None
    submitted_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    last_error: str | None
    priority: str = Field(description="high, normal or low: the lane its messages take")
    deferrals: int = Field(
        description="times the current step waited for an endpoint with room or an open circuit"
    )
    trace_id: str | None = Field(
        default=None, description="the order's OpenTelemetry trace id (None: not traced)"
    )
    version: int = Field(default=1, description="the workflow version the order is bound to")
    waiting: str | None = Field(
        default=None,
        description="why it waits instead of running: its workflow version is not deployed",
    )
    cancelled: str | None = Field(
        default=None,
        description="who cancelled it and why: it is being undone, or was (Cancelled)",
    )
    suspended: bool = Field(
        default=False, description="an operator suspended it: nothing new runs until resumed"
    )

    @classmethod
    def of(cls, state: OrderState, workflows: Registry | None = None) -> StateView:
        """``workflows``: where the step's name is looked up (the app's by default)."""
        if workflows is None:
            from sas import bootstrap  # the app's wiring: only for the app's own workflows

            workflows = bootstrap.workflows()
        return cls(
            order_id=state.order_id,
            workflow=state.workflow,
            process_state=state.process_state.value,
            step_index=state.step_index,
            step=step_name(workflows, state) or "?",
            mode=state.mode,
            attempt=state.attempt,
            failure_count=state.failure_count,
            locked_by=state.locked_by,
            complete_by=state.complete_by,
            not_before=state.not_before,
            submitted_at=state.submitted_at,
            updated_at=state.updated_at,
            finished_at=state.finished_at,
            last_error=state.last_error,
            priority=state.priority,
            deferrals=state.deferrals,
            trace_id=telemetry.trace_id_of(state.traceparent),
            version=state.version,
            waiting=state.waiting,
            cancelled=state.cancelled,
            suspended=state.suspended,
        )


class StepView(BaseModel):
    index: int
    name: str
    attempt: int
    completed_at: datetime
    result: dict[str, Any]


class HistoryView(BaseModel):
    at: datetime
    kind: str
    attempt: int
    step: str | None
    mode: str
    actor: str | None
    detail: str | None
    endpoint: str | None = Field(description="the remote endpoint a reply's call went to")


class OrderView(StateView):
    details: dict[str, Any]
    steps: list[StepView]
    history: list[HistoryView]

    @classmethod
    def of_detail(cls, detail: OrderDetail, workflows: Registry | None = None) -> OrderView:
        return cls(
            **StateView.of(detail.state, workflows).model_dump(),
            details=detail.order.details,
            steps=[StepView(**vars(step)) for step in detail.steps],
            history=[HistoryView(**vars(h)) for h in detail.history],
        )

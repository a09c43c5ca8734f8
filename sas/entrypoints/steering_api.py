"""Steering a live order, part of the HTTP API: cancel (undo it), suspend, resume, terminate
(end it where it stands). 409 when the order's state does not allow it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, Field

from sas import bootstrap
from sas.entrypoints.order_views import OrderIdPath, StateView
from sas.entrypoints.params import SignedIn, actor_of

router = APIRouter()

Actor = Annotated[str, Field(min_length=1, max_length=100)]


class ReasonRequest(BaseModel):
    reason: Annotated[str, Field(min_length=1, max_length=500, pattern=r"\S")]
    """Why: kept in the order's history and the audit log."""
    actor: Actor = "operator"


class NoteRequest(BaseModel):
    reason: Annotated[str, Field(max_length=500)] | None = None
    actor: Actor = "operator"


@router.post("/api/orders/{order_id}/cancel", response_model=StateView)
def cancel_order(
    order_id: OrderIdPath, request: ReasonRequest, signed_in: SignedIn = None
) -> StateView:
    """Cancel a live order, or an Error one stopped part-way: no step goes forward, what was
    done is undone in reverse (a step still running is left to answer, and undone too), and
    the order ends Cancelled (Error, with an alert, if an undo fails for good)."""
    actor = actor_of(signed_in, request.actor)
    return StateView.of(bootstrap.operator().cancel(order_id, actor=actor, reason=request.reason))


@router.post("/api/orders/{order_id}/suspend", response_model=StateView)
def suspend_order(
    order_id: OrderIdPath, request: NoteRequest | None = None, signed_in: SignedIn = None
) -> StateView:
    """Suspend a live order: nothing new is dispatched and no deadline expires it until it is
    resumed; a step already running may finish, and is recorded."""
    note = request or NoteRequest()
    actor = actor_of(signed_in, note.actor)
    return StateView.of(bootstrap.operator().suspend(order_id, actor=actor, reason=note.reason))


@router.post("/api/orders/{order_id}/resume", response_model=StateView)
def resume_order(
    order_id: OrderIdPath, request: NoteRequest | None = None, signed_in: SignedIn = None
) -> StateView:
    """Resume a suspended order from where it stood."""
    note = request or NoteRequest()
    actor = actor_of(signed_in, note.actor)
    return StateView.of(bootstrap.operator().resume(order_id, actor=actor, reason=note.reason))


@router.post("/api/orders/{order_id}/terminate", response_model=StateView)
def terminate_order(
    order_id: OrderIdPath, request: ReasonRequest, signed_in: SignedIn = None
) -> StateView:
    """End a live order now and undo nothing: what its steps did stays done (for what a cancel
    cannot settle). A step still running is fenced off: its reply is dropped."""
    actor = actor_of(signed_in, request.actor)
    return StateView.of(
        bootstrap.operator().terminate(order_id, actor=actor, reason=request.reason)
    )

"""HTTP API (FastAPI), served by Azure Functions through its ASGI integration.

Routes are absolute (/api/...): host.json sets the Functions route prefix to "".
In Azure every route needs a function key (the app is registered with AuthLevel.FUNCTION),
the operators' dashboard (GET /api/dashboard) included.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from sas import bootstrap
from sas.domain.errors import (
    AlreadyExists,
    ConcurrencyConflict,
    IllegalTransition,
    InvalidMessage,
    NotFound,
)
from sas.domain.messages import OrderSubmitted
from sas.domain.model import ProcessState
from sas.domain.wire import Priority
from sas.entrypoints import api_docs, dashboard, health_api, parked_api, steering_api
from sas.entrypoints.invocation import attributed
from sas.entrypoints.order_views import OrderIdPath, OrderView, StateView
from sas.entrypoints.params import (
    MAX_AGE_SECONDS,
    MAX_OFFSET,
    ActorQuery,
    Instant,
    Limit,
    SignedIn,
    actor_of,
    seconds,
)
from sas.entrypoints.request_limits import BodyLimit, known_query_only
from sas.services.operator import MAX_QUERY_LIMIT, OrderQuery

api = FastAPI(
    title="sas",
    version="0.1.0",
    description=(
        "The operators' API of the sas app (Scheduler Agent Supervisor on Azure Functions): "
        "orders by state, one order's timeline, resubmitting or closing Error orders, parked "
        "messages (bad input the app refused, and messages the Functions host gave up on), the "
        "system's health (throughput, breakers, waiting alerts), and the dashboard page built "
        "on them. In Azure every route "
        "needs the function key: the `x-functions-key` header, or `?code=` in the URL."
    ),
    docs_url=None,  # served below, rendered here: Swagger UI would load from a CDN
    openapi_url="/api/openapi.json",
    dependencies=[Depends(known_query_only)],
)


class _Attributed:
    """Every request runs attributed to its invocation (sas/entrypoints/invocation.py): sync
    routes run on FastAPI's threadpool, whose records the worker would not forward."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        storage = scope.get("azure_functions.thread_local_storage")
        invocation_id = scope.get("azure_functions.invocation_id")
        if storage is None or not invocation_id:  # not served by the Functions worker
            await self.app(scope, receive, send)
            return
        with attributed(storage, invocation_id):
            await self.app(scope, receive, send)


api.add_middleware(_Attributed)
api.add_middleware(BodyLimit)
api.include_router(health_api.router)
api.include_router(parked_api.router)
api.include_router(steering_api.router)


# Domain errors mean the same on every route: no such thing (404), or not now / not in this
# state / someone else got there first (409).
@api.exception_handler(NotFound)
def _not_found(request: Request, exc: NotFound) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_404_NOT_FOUND)


@api.exception_handler(InvalidMessage)
def _invalid_input(request: Request, exc: InvalidMessage) -> JSONResponse:
    return JSONResponse({"detail": exc.reason}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


@api.exception_handler(IllegalTransition)
@api.exception_handler(ConcurrencyConflict)
def _conflict(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_409_CONFLICT)


@api.exception_handler(RequestValidationError)
def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with where and why, never the input back: input can hold text that cannot be
    written as UTF-8 (a lone surrogate), which would turn the answer into a 500."""
    detail = [
        {
            "loc": [_printable(part) if isinstance(part, str) else part for part in error["loc"]],
            "msg": _printable(str(error["msg"])),
            "type": error["type"],
        }
        for error in exc.errors()
    ]
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ResubmitRequest(BaseModel):
    actor: Annotated[str, Field(min_length=1, max_length=100)] = "operator"


@api.get("/api/health")
def health() -> dict[str, str]:
    """Answers while the app is up; it reads nothing."""
    return {"status": "ok"}


AgeSeconds = Annotated[float | None, Query(ge=0, le=MAX_AGE_SECONDS)]
WorkflowName = Annotated[
    str | None,
    Query(max_length=100, description="of this workflow (one the app deploys); any when left out"),
]


@api.get("/api/orders", response_model=list[StateView])
def list_orders(
    response: Response,
    state: Annotated[ProcessState | None, Query(description="any state when left out")] = None,
    priority: Annotated[Priority | None, Query(description="any priority when left out")] = None,
    workflow: WorkflowName = None,
    older_than_seconds: Annotated[
        AgeSeconds, Query(description="submitted more than this many seconds ago")
    ] = None,
    newer_than_seconds: Annotated[
        AgeSeconds, Query(description="submitted at most this many seconds ago")
    ] = None,
    step: Annotated[
        str | None, Query(max_length=100, description="at this step (its undo included)")
    ] = None,
    error: Annotated[
        str | None, Query(max_length=200, description="the last error contains this, any case")
    ] = None,
    submitted_from: Annotated[
        Instant | None, Query(description="submitted at or after this instant")
    ] = None,
    submitted_until: Annotated[
        Instant | None, Query(description="submitted before this instant")
    ] = (None),
    limit: Limit = 100,
    offset: Annotated[
        int, Query(ge=0, le=MAX_OFFSET, description="skip this many matches (the next page)")
    ] = 0,
) -> list[StateView]:
    """Orders matching every filter given, most recently updated first, a page of ``limit``
    from ``offset`` on; the header ``x-total-count`` says how many match in all.

    Filters on anything but the order id scan the table: an operator's look, not a hot path."""
    _check_range(older_than_seconds, newer_than_seconds, submitted_from, submitted_until)
    query = OrderQuery(
        state=state,
        priority=priority,
        workflow=workflow or None,
        older_than=seconds(older_than_seconds),
        newer_than=seconds(newer_than_seconds),
        step=step or None,
        error=error or None,
        submitted_from=submitted_from,
        submitted_until=submitted_until,
        limit=limit,
        offset=offset,
    )
    found, total = bootstrap.operator().find_page(query)
    response.headers["x-total-count"] = str(total)
    return [StateView.of(order) for order in found]


def _check_range(
    older_than: float | None,
    newer_than: float | None,
    submitted_from: datetime | None,
    submitted_until: datetime | None,
) -> None:
    """422 for a range no order could match (the filters are checked one by one elsewhere)."""
    if older_than is not None and newer_than is not None and newer_than < older_than:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            "newer_than_seconds must not be less than older_than_seconds: no order could match",
        )
    if submitted_from and submitted_until and submitted_until <= submitted_from:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            "submitted_until must be after submitted_from: no order could match",
        )


STATS_LIST_CAP = 100
"""Parked messages are counted by listing them, up to this many."""


class StatsView(BaseModel):
    at: datetime = Field(description="when the counts were taken, by the app's clock")
    states: dict[ProcessState, int] = Field(description="orders in each state, zeros included")
    parked: int = Field(
        description=f"parked messages, the app's and the host's, counted up to {STATS_LIST_CAP}"
    )
    parked_more: bool = Field(description=f"more than {STATS_LIST_CAP} are parked")


@api.get("/api/stats", response_model=StatsView)
def stats() -> StatsView:
    """Counts for the dashboard: orders by state, and parked messages."""
    operator = bootstrap.operator()
    counts = operator.counts()
    parked = len(bootstrap.parked_messages().list(STATS_LIST_CAP + 1))
    return StatsView(
        at=bootstrap.clock().now(),
        states={state: counts.get(state, 0) for state in ProcessState},
        parked=min(parked, STATS_LIST_CAP),
        parked_more=parked > STATS_LIST_CAP,
    )


@api.get("/api/docs", response_class=HTMLResponse, include_in_schema=False)
def docs() -> HTMLResponse:
    """The API's reference, from its schema: no script, nothing from elsewhere."""
    return HTMLResponse(
        api_docs.page(api.openapi(), "/api/openapi.json", "in Azure: ?code=<function key>"),
        headers={"content-security-policy": api_docs.CONTENT_SECURITY_POLICY},
    )


@api.get("/api/dashboard", response_class=HTMLResponse)
def dashboard_page() -> HTMLResponse:
    """The operators' dashboard: one self-contained page (no build step, nothing from a CDN)
    that refreshes every 2 s. In Azure open it as `/api/dashboard?code=<function key>`: it
    sends that key on its own API calls, and its source never holds one."""
    page = dashboard.page()
    return HTMLResponse(
        page.html,
        headers={
            "content-security-policy": page.content_security_policy,
            "cache-control": "no-store",
            "referrer-policy": "no-referrer",
            "x-content-type-options": "nosniff",
        },
    )


@api.get("/api/orders/{order_id}", response_model=OrderView)
def get_order(order_id: OrderIdPath) -> OrderView:
    """One order's timeline: its state, details, completed steps and every history row
    (claims, attempts, endpoints, refusals, expiries, compensation, resubmits)."""
    return OrderView.of_detail(bootstrap.operator().detail(order_id))


class BulkResubmitRequest(BaseModel):
    """Which Error orders to resubmit: every filter given must match."""

    actor: Annotated[str, Field(min_length=1, max_length=100)] = "operator"
    dry_run: bool = True
    priority: Priority | None = None
    workflow: Annotated[str | None, Field(max_length=100)] = None
    older_than_seconds: Annotated[float | None, Field(ge=0, le=MAX_AGE_SECONDS)] = None
    newer_than_seconds: Annotated[float | None, Field(ge=0, le=MAX_AGE_SECONDS)] = None
    step: Annotated[str | None, Field(max_length=100)] = None
    error: Annotated[str | None, Field(max_length=200)] = None
    submitted_from: Instant | None = None
    submitted_until: Instant | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_QUERY_LIMIT)] = 100
    order_ids: Annotated[list[str] | None, Field(max_length=MAX_QUERY_LIMIT)] = None
    """Only these, of what the filters match: the ids a dry run showed, so that the run acts
    on what the operator saw and no order that came since."""


class BulkOutcome(BaseModel):
    order_id: str
    outcome: str
    """``would be resubmitted`` (dry run), ``done``, or why not."""


class BulkReportView(BaseModel):
    dry_run: bool
    matched: int
    """The orders listed (at most ``limit``)."""
    total: int
    """How many Error orders the filters match in all."""
    orders: list[BulkOutcome]
    not_matched: list[str] = Field(
        default_factory=list,
        description="ids in ``order_ids`` the filters no longer match: nothing was done to them",
    )


@api.post("/api/orders/resubmit", response_model=BulkReportView)
def resubmit_orders(request: BulkResubmitRequest, signed_in: SignedIn = None) -> BulkReportView:
    """Resubmit every Error order matching the filters (at most ``limit``, most recently
    updated first). A dry run unless ``dry_run`` is false: it lists what would be resubmitted.
    Each order's write is conditional; the report says per order what happened."""
    _check_range(
        request.older_than_seconds,
        request.newer_than_seconds,
        request.submitted_from,
        request.submitted_until,
    )
    query = OrderQuery(
        state=ProcessState.ERROR,
        priority=request.priority,
        workflow=request.workflow or None,
        older_than=seconds(request.older_than_seconds),
        newer_than=seconds(request.newer_than_seconds),
        step=request.step or None,
        error=request.error or None,
        submitted_from=request.submitted_from,
        submitted_until=request.submitted_until,
        limit=request.limit,
    )
    report = bootstrap.operator().resubmit_matching(
        query,
        actor=actor_of(signed_in, request.actor),
        dry_run=request.dry_run,
        only=request.order_ids,
    )
    return BulkReportView(
        dry_run=report.dry_run,
        matched=len(report.matched),
        total=report.total,
        orders=[
            BulkOutcome(
                order_id=state.order_id,
                outcome=report.outcomes.get(state.order_id, "would be resubmitted"),
            )
            for state in report.matched
        ],
        not_matched=report.unmatched,
    )


@api.post("/api/orders/{order_id}/resubmit", response_model=StateView)
def resubmit_order(
    order_id: OrderIdPath, request: ResubmitRequest | None = None, signed_in: SignedIn = None
) -> StateView:
    """Run a failed (Error) order's failed step again, from a clean failure count."""
    actor = actor_of(signed_in, (request or ResubmitRequest()).actor)
    return StateView.of(bootstrap.operator().resubmit(order_id, actor=actor))


class CloseRequest(BaseModel):
    reason: Annotated[str, Field(min_length=1, max_length=500)]
    """How the operator settled it: kept in the order's history."""
    actor: Annotated[str, Field(min_length=1, max_length=100)] = "operator"


@api.post("/api/orders/{order_id}/close", response_model=StateView)
def close_order(
    order_id: OrderIdPath, request: CloseRequest, signed_in: SignedIn = None
) -> StateView:
    """Close an Error order an operator settled by hand (no more work; purge may remove it),
    or one waiting for a workflow version that is not deployed. 409 for any other order."""
    closed = bootstrap.operator().close(
        order_id, actor=actor_of(signed_in, request.actor), reason=request.reason
    )
    return StateView.of(closed)


@api.post("/api/orders", status_code=status.HTTP_202_ACCEPTED)
def submit_order(
    order: OrderSubmitted, actor: ActorQuery = "operator", signed_in: SignedIn = None
) -> dict[str, str]:
    """Convenience: posts the order to the orders queue of its priority lane, exactly as an
    application would, after the submission function's checks (422 with the reason); audited
    as submitted on behalf by ``actor``."""
    try:
        message_id = bootstrap.operator().submit(order, actor=actor_of(signed_in, actor))
    except InvalidMessage as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, exc.reason) from None
    except AlreadyExists as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    return {
        "order_id": order.order_id,
        "message_id": message_id,
        "status": f"/api/orders/{order.order_id}",
    }


class AuditView(BaseModel):
    at: datetime
    actor: str
    action: str
    target: str = Field(description="the order id or parked message id acted on")
    reason: str | None
    detail: str | None


@api.get("/api/audit", response_model=list[AuditView])
def list_audit(
    limit: Limit = 100,
    action: Annotated[str | None, Query(max_length=40, description="this action only")] = None,
    actor: Annotated[str | None, Query(max_length=100, description="by this actor only")] = None,
    target: Annotated[
        str | None, Query(max_length=300, description="on this order or parked message only")
    ] = None,
) -> list[AuditView]:
    """Operators' actions, newest first: submit on behalf, resubmit, close, purge, parked
    replay and discard. They outlive a purge of the orders they acted on."""
    found = bootstrap.operator().audit(limit, action=action, actor=actor, target=target)
    return [AuditView(**vars(entry)) for entry in found]

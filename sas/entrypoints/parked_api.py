"""Parked messages' routes, part of the HTTP API: bad input the app refused, and messages the
Functions host gave up on; one at a time, or every one a filter matches."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, Field

from sas import bootstrap
from sas.domain.parked import ParkedBy, ParkedMessage, PoisonTransport
from sas.entrypoints.params import (
    MAX_AGE_SECONDS,
    ActorQuery,
    Limit,
    SignedIn,
    actor_of,
    seconds,
)
from sas.services.operator import MAX_QUERY_LIMIT
from sas.services.parked_messages import ParkedQuery, ParkedReport

router = APIRouter()

ParkedIdPath = Annotated[
    str,
    Path(min_length=1, max_length=300, description="a parked message's id, as listed: whole"),
]


class ParkedView(BaseModel):
    id: str = Field(description="opaque; quote it whole in a URL path")
    parked_by: ParkedBy = Field(
        description="app: the app refused it as bad input (kept in its table); host: the "
        "Functions host gave up on it (a poison queue or a Service Bus dead-letter queue)"
    )
    queue: str = Field(description="the queue it was meant for")
    function: str | None = Field(description="the function that queue triggers")
    transport: PoisonTransport | None = Field(
        description="parked by the host: the transport whose poison / dead-letter queue holds it"
    )
    reason: str
    parked_at: datetime | None = Field(
        description="when it was parked (the host on Service Bus: when it was first enqueued)"
    )
    age_seconds: float | None = Field(description="how long it has been parked")
    delivery_count: int | None = Field(description="delivery attempts, when the transport says")
    body_base64: str
    body_text: str | None = Field(description="the body as UTF-8, when it is valid UTF-8")
    body_truncated: bool = Field(description="only the start of the body is kept")

    @classmethod
    def of(cls, message: ParkedMessage, age_seconds: float | None) -> ParkedView:
        try:
            text: str | None = message.body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        return cls(
            id=message.id,
            parked_by=message.parked_by,
            queue=message.queue,
            function=message.function,
            transport=message.transport,
            reason=message.reason,
            parked_at=message.parked_at,
            age_seconds=None if age_seconds is None else round(age_seconds, 3),
            delivery_count=message.delivery_count,
            body_base64=base64.b64encode(message.body).decode(),
            body_text=text,
            body_truncated=message.body_truncated,
        )


@router.get("/api/parked", response_model=list[ParkedView])
def list_parked(
    response: Response,
    parked_by: Annotated[ParkedBy | None, Query(description="who parked it (any if left out)")] = (
        None
    ),
    queue: Annotated[str | None, Query(max_length=260, description="meant for this queue")] = None,
    reason: Annotated[
        str | None, Query(max_length=200, description="the reason contains this, any case")
    ] = None,
    older_than_seconds: Annotated[
        float | None, Query(ge=0, le=MAX_AGE_SECONDS, description="parked longer ago than this")
    ] = None,
    limit: Limit = 100,
) -> list[ParkedView]:
    """Messages that were never processed, oldest first, with the reason and the original body:
    bad input the app refused (`parked_by` app) and messages the Functions host gave up on, in
    poison or dead-letter queues (`parked_by` host). Only those matching every filter given;
    the header ``x-total-count`` says how many match among those listed, and
    ``x-more-unlisted: true`` that more may be parked than were listed (a Storage poison queue
    shows its first 32): act on these, then list again."""
    parked = bootstrap.parked_messages()
    query = ParkedQuery(
        parked_by=parked_by,
        queue=queue or None,
        reason=reason or None,
        older_than=seconds(older_than_seconds),
        limit=limit,
    )
    page = parked.find(query)
    response.headers["x-total-count"] = str(page.total)
    if page.more_unlisted:
        response.headers["x-more-unlisted"] = "true"
    return [ParkedView.of(m, parked.age_seconds(m)) for m in page.messages]


@router.post("/api/parked/{parked_id}/replay")
def replay_parked(
    parked_id: ParkedIdPath, actor: ActorQuery = "operator", signed_in: SignedIn = None
) -> dict[str, str]:
    """Send it back to the queue it was meant for, and remove it from parked: the original body
    as an application would send it (parked by the app), or the very message, unchanged
    (parked by the host).

    409 if the app kept the body only in part, the queue is not one the app consumes, or
    (Service Bus) duplicate detection would still drop the copy."""
    bootstrap.parked_messages().replay(parked_id, actor=actor_of(signed_in, actor))
    return {"id": parked_id, "status": "replayed"}


@router.delete("/api/parked/{parked_id}")
def discard_parked(
    parked_id: ParkedIdPath, actor: ActorQuery = "operator", signed_in: SignedIn = None
) -> dict[str, str]:
    """Remove a parked message for good."""
    bootstrap.parked_messages().discard(parked_id, actor=actor_of(signed_in, actor))
    return {"id": parked_id, "status": "discarded"}


class BulkParkedRequest(BaseModel):
    """Which parked messages: every filter given must match."""

    actor: Annotated[str, Field(min_length=1, max_length=100)] = "operator"
    dry_run: bool = True
    parked_by: ParkedBy | None = None
    queue: Annotated[
        str | None, Field(max_length=260, description="the queue it was meant for")
    ] = None
    reason: Annotated[str | None, Field(max_length=200, description="its reason contains this")] = (
        None
    )
    older_than_seconds: Annotated[float | None, Field(ge=0, le=MAX_AGE_SECONDS)] = None
    limit: Annotated[int, Field(ge=1, le=MAX_QUERY_LIMIT)] = 100
    ids: Annotated[list[str] | None, Field(max_length=MAX_QUERY_LIMIT)] = None
    """Only these, of what the filters match: the ids a dry run showed."""


class BulkParkedOutcome(BaseModel):
    id: str
    queue: str
    reason: str
    outcome: str = Field(description="``would be`` replayed/discarded (dry run), done, or why not")


class BulkParkedReport(BaseModel):
    dry_run: bool
    matched: int = Field(description="the messages listed (at most ``limit``)")
    total: int = Field(description="how many match among those listed")
    more_unlisted: bool = Field(
        description="more may be parked than were listed (a Storage poison queue shows its "
        "first 32): run again once these are settled"
    )
    messages: list[BulkParkedOutcome]
    not_matched: list[str] = Field(
        default_factory=list,
        description="ids in ``ids`` the filters no longer match: nothing was done to them",
    )


@router.post("/api/parked/replay", response_model=BulkParkedReport)
def replay_parked_matching(
    request: BulkParkedRequest, signed_in: SignedIn = None
) -> BulkParkedReport:
    """Replay every parked message matching the filters (oldest first, at most ``limit``). A
    dry run unless ``dry_run`` is false; the report says per message what happened."""
    return _settle(request, signed_in, replay=True)


@router.post("/api/parked/discard", response_model=BulkParkedReport)
def discard_parked_matching(
    request: BulkParkedRequest, signed_in: SignedIn = None
) -> BulkParkedReport:
    """Discard every parked message matching the filters (oldest first, at most ``limit``). A
    dry run unless ``dry_run`` is false; the report says per message what happened."""
    return _settle(request, signed_in, replay=False)


def _settle(request: BulkParkedRequest, signed_in: str | None, *, replay: bool) -> BulkParkedReport:
    query = ParkedQuery(
        parked_by=request.parked_by,
        queue=request.queue or None,
        reason=request.reason or None,
        older_than=seconds(request.older_than_seconds),
        limit=request.limit,
    )
    report = bootstrap.parked_messages().settle_matching(
        query,
        replay=replay,
        actor=actor_of(signed_in, request.actor),
        dry_run=request.dry_run,
        only=request.ids,
    )
    return bulk_parked_view(report, "replayed" if replay else "discarded")


def bulk_parked_view(report: ParkedReport, verb: str) -> BulkParkedReport:
    return BulkParkedReport(
        dry_run=report.dry_run,
        matched=len(report.matched),
        total=report.total,
        more_unlisted=report.more_unlisted,
        messages=[
            BulkParkedOutcome(
                id=message.id,
                queue=message.queue,
                reason=message.reason,
                outcome=report.outcomes.get(message.id, f"would be {verb}"),
            )
            for message in report.matched
        ],
        not_matched=report.unmatched,
    )

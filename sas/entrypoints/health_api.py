"""The health view's route (sas/services/health.py), part of the HTTP API."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from sas import bootstrap
from sas.domain.breaker import BreakerStatus
from sas.domain.model import ProcessState
from sas.entrypoints.params import SignedIn, actor_of
from sas.services import alert_book
from sas.services.alert_book import AlertGroup
from sas.services.health import MAX_WINDOW, Bucket, EndpointHealth, HealthReport, WaitingAlert

router = APIRouter()


class BucketView(BaseModel):
    start: datetime
    submitted: int = Field(description="orders submitted in this bucket")
    processed: int = Field(description="orders that finished in it and are Processed")
    compensated: int
    error: int
    closed: int = Field(description="Error orders an operator closed in this bucket: apart")
    cancelled: int = Field(default=0, description="orders operators cancelled (undone): apart")
    terminated: int = Field(default=0, description="orders operators terminated: apart")
    failed: int = Field(description="compensated + error")

    @classmethod
    def of(cls, bucket: Bucket) -> BucketView:
        done = bucket.finished
        return cls(
            start=bucket.start,
            submitted=bucket.submitted,
            processed=done.get(ProcessState.PROCESSED, 0),
            compensated=done.get(ProcessState.COMPENSATED, 0),
            error=done.get(ProcessState.ERROR, 0),
            closed=done.get(ProcessState.CLOSED, 0),
            cancelled=done.get(ProcessState.CANCELLED, 0),
            terminated=done.get(ProcessState.TERMINATED, 0),
            failed=bucket.failed,
        )


class EndpointView(BaseModel):
    agent: str
    endpoint: str
    target: str = Field(description="agent/endpoint: what names its breaker and load rows")
    breaker: BreakerStatus = Field(
        description="as last written; an open breaker past opened_until lets the next call probe"
    )
    calls: int = Field(description="calls counted in the breaker's window (the last 30 s)")
    failures: int = Field(description="of them, the failures of the remote")
    opened_until: datetime | None
    changed_at: datetime | None = Field(description="the breaker's last write (None: never)")
    in_flight: int = Field(description="calls in flight, over every process counting them")
    capacity: int | None = Field(description="calls it takes at once (None: no limit declared)")
    processes: int = Field(description="processes with calls in flight to it")

    @classmethod
    def of(cls, endpoint: EndpointHealth) -> EndpointView:
        return cls(**vars(endpoint))


class AlertView(BaseModel):
    alert_id: str
    order_id: str
    reason: str
    at: datetime
    order_state: ProcessState | None = Field(description="the order's state now (None: purged)")
    order_mode: str | None = Field(default=None, description="undo while it is being undone")

    @classmethod
    def of(cls, alert: WaitingAlert) -> AlertView:
        return cls(**vars(alert))


class OpenAlertView(BaseModel):
    alert_id: str
    order_id: str
    at: datetime
    attempt: int


class AlertGroupView(BaseModel):
    workflow: str
    step: str
    reason: str
    count: int
    first_at: datetime
    last_at: datetime
    alerts: list[OpenAlertView] = Field(description="oldest first")

    @classmethod
    def of(cls, group: AlertGroup) -> AlertGroupView:
        return cls(
            workflow=group.workflow,
            step=group.step,
            reason=group.reason,
            count=len(group.alerts),
            first_at=group.alerts[0].at,
            last_at=group.alerts[-1].at,
            alerts=[
                OpenAlertView(alert_id=a.alert_id, order_id=a.order_id, at=a.at, attempt=a.attempt)
                for a in group.alerts
            ],
        )


class WaitingView(BaseModel):
    reason: str = Field(description="the workflow version they wait for, and why")
    orders: int


class HealthView(BaseModel):
    at: datetime = Field(description="when it was read, by the app's clock")
    since: datetime = Field(description="the first bucket's start")
    bucket_seconds: int
    buckets: list[BucketView]
    finished: int = Field(description="orders the app finished in the window (not Closed)")
    failed: int
    failure_rate: float | None = Field(description="failed / finished (None: none finished)")
    endpoints: list[EndpointView]
    alerts: list[AlertView] = Field(
        description="the first alerts waiting in the alerts queue, oldest first; reading them "
        "leaves them there"
    )
    alerts_waiting: int | None = Field(
        description="how many wait in the alerts queue, as the transport estimates it "
        "(Service Bus: what one peek sees)"
    )
    problems: list[str] = Field(description="parts that could not be read; the rest is shown")
    waiting: list[WaitingView] = Field(
        default_factory=list,
        description="orders waiting for a workflow version the app does not have, by reason: "
        "deploy it again, or close those orders",
    )
    retries_held_back: int | None = Field(
        default=0,
        description="expired steps the Supervisors' retry budget held back in the last minute "
        "(None: could not be read); those orders wait, no failure counted",
    )
    saturated: bool = Field(
        default=False, description="retries are being held back: the app is past its capacity"
    )
    open_alerts: list[AlertGroupView] = Field(
        default_factory=list,
        description="alerts no one acknowledged whose order is still in the trouble they were "
        "sent for, one group per workflow, step and reason; an alert clears itself once its "
        "order leaves Error (resubmitted, closed, cancelled, purged)",
    )

    @classmethod
    def of(cls, report: HealthReport) -> HealthView:
        return cls(
            at=report.at,
            since=report.since,
            bucket_seconds=int(report.bucket.total_seconds()),
            buckets=[BucketView.of(bucket) for bucket in report.buckets],
            finished=report.finished,
            failed=report.failed,
            failure_rate=report.failure_rate,
            endpoints=[EndpointView.of(endpoint) for endpoint in report.endpoints],
            alerts=[AlertView.of(alert) for alert in report.alerts],
            alerts_waiting=report.alerts_waiting,
            problems=report.problems,
            waiting=[WaitingView(reason=w.reason, orders=w.orders) for w in report.waiting],
            retries_held_back=report.retries_held_back,
            saturated=report.saturated,
            open_alerts=[AlertGroupView.of(group) for group in report.open_alerts],
        )


@router.get("/api/health/report", response_model=HealthView)
def health_report(
    minutes: Annotated[
        int, Query(ge=1, le=MAX_WINDOW // timedelta(minutes=1), description="the window")
    ] = 60,
    alerts: Annotated[int, Query(ge=1, le=100, description="list at most this many")] = 20,
) -> HealthView:
    """Orders submitted and finished per bucket of whole minutes on a fixed grid, from the
    bucket holding the window's start to the one under way (at most 61: one-minute buckets up
    to an hour), with the failure rate (Error and Compensated among Processed, Error and
    Compensated; Closed counted apart); every remote endpoint's breaker and load against its
    capacity; and the alerts waiting in the alerts queue. Reads every order updated in the
    window: an operator's look, not a hot path."""
    return HealthView.of(bootstrap.health().report(timedelta(minutes=minutes), alerts=alerts))


@router.get("/api/alerts", response_model=list[AlertGroupView])
def open_alerts() -> list[AlertGroupView]:
    """Open alerts, one group per workflow, step and reason (oldest first): those no one
    acknowledged whose order is still in the trouble they were sent for."""
    groups = alert_book.open_groups(bootstrap.store(), bootstrap.clock().now())
    return [AlertGroupView.of(group) for group in groups]


class AcknowledgeRequest(BaseModel):
    alert_ids: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=300)]],
        Field(min_length=1, max_length=alert_book.MAX_ACKNOWLEDGE),
    ]
    note: Annotated[str, Field(max_length=alert_book.MAX_NOTE)] | None = None
    actor: Annotated[str, Field(min_length=1, max_length=100)] = "operator"


class AcknowledgeView(BaseModel):
    outcomes: dict[str, str] = Field(
        description="by alert id: acknowledged, acknowledged already, cleared already, not "
        "found, or changed meanwhile: try again"
    )


@router.post("/api/alerts/acknowledge", response_model=AcknowledgeView)
def acknowledge_alerts(request: AcknowledgeRequest, signed_in: SignedIn = None) -> AcknowledgeView:
    """Acknowledge alerts (a whole group: its ids), with a note: they are no longer open.
    Audited, one entry per alert."""
    outcomes = alert_book.acknowledge(
        bootstrap.store(),
        bootstrap.clock().now(),
        request.alert_ids,
        actor=actor_of(signed_in, request.actor),
        note=request.note,
    )
    return AcknowledgeView(outcomes=outcomes)

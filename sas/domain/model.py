"""The state records kept in the state store (docs/architecture.md, "State store")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar, get_args

from sas.domain.wire import DEFAULT_PRIORITY, Mode, Priority, StatusLevel, step_row_key


class ProcessState(StrEnum):
    PENDING = "Pending"
    """Waiting for a Scheduler (new, or reset by the Supervisor for a retry)."""
    PROCESSING = "Processing"
    """A step is running: locked, with a complete-by deadline."""
    COMPENSATING = "Compensating"
    """An undo step is running: locked, with a complete-by deadline."""
    PROCESSED = "Processed"
    COMPENSATED = "Compensated"
    """The task failed and every effect it had was undone."""
    ERROR = "Error"
    """Needs an operator (who can resubmit, or close it once settled by hand)."""
    CLOSED = "Closed"
    """An Error order an operator settled by hand and closed, with a reason: no more work."""
    CANCELLED = "Cancelled"
    """An operator cancelled the order: every effect it had was undone."""
    TERMINATED = "Terminated"
    """An operator ended the order where it stood, with a reason: nothing was undone."""


TERMINAL_STATES = frozenset(
    {
        ProcessState.PROCESSED,
        ProcessState.COMPENSATED,
        ProcessState.ERROR,
        ProcessState.CLOSED,
        ProcessState.CANCELLED,
        ProcessState.TERMINATED,
    }
)
RUNNING_STATES = frozenset({ProcessState.PROCESSING, ProcessState.COMPENSATING})


@dataclass(frozen=True)
class OrderState:
    """One order's progress: who holds it, until when, and which step/attempt is current.

    ``attempt`` is the fencing token: every claim increments it, it travels in the agent
    request and reply, and a reply for any other attempt is dropped.
    ``complete_by`` is also set while Pending (the pickup deadline), so no live record is
    ever without a deadline the Supervisor can act on.
    """

    order_id: str
    workflow: str
    process_state: ProcessState
    submitted_at: datetime
    updated_at: datetime
    locked_by: str | None = None
    complete_by: datetime | None = None
    failure_count: int = 0
    attempt: int = 0
    step_index: int = 0
    mode: Mode = "do"
    """``undo`` while compensating: ``step_index`` then walks backwards."""
    reply_to: str | None = None
    finished_at: datetime | None = None
    last_error: str | None = None
    not_before: datetime | None = None
    """Retry backoff: a Scheduler does not claim before this time."""
    alert_pending: bool = False
    """Set with the move to Error, cleared once the operator alert is sent (so it is sent)."""
    alert_claimed_by: str | None = None
    """Who is sending the owed alert; nobody else sends it while the claim holds."""
    alert_claimed_until: datetime | None = None
    """When the claim lapses: a sender that died is replaced, with the same alert id."""
    status_events: StatusLevel = "outcome"
    """Which status events the submitter asked for (``reply_to``)."""
    details: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The order's details: the input every step request carries."""
    priority: Priority = DEFAULT_PRIORITY
    """Which lane the order's messages take at every hop (fixed at submission)."""
    deferrals: int = 0
    """Times the current step (in its direction) was deferred: no endpoint had room, or its
    circuit was open. Sets the backoff and bounds a circuit's deferrals; back to 0 when the next
    step, the compensation or a resubmit starts."""
    traceparent: str | None = None
    """The W3C context of the order's trace (its submission's span): what a Supervisor's
    recovery or an operator's resubmit continues. None when the order was not traced."""
    results: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    """What each completed step returned, by step name: the input of the steps after it."""
    version: int = 1
    """The version of ``workflow`` the order was bound to at submission: it runs on that
    version's steps to its end."""
    definition: str = ""
    """That version's fingerprint (``Workflow.fingerprint``) when the order was bound: a host
    whose version of the same number differs never runs the order. Empty in orders submitted
    before fingerprints were kept."""
    incarnation: str = ""
    """This submission of the order id (``wire.new_incarnation``): part of every idempotency
    key and carried by every step message. Empty in orders submitted before incarnations."""
    step: str = ""
    """The name of the step at ``step_index`` (the state names what it waits on). Empty in
    orders submitted before it was kept."""
    first_attempt: int = 0
    """The attempt at which the current step, in the current direction, was (or will be)
    first claimed: an attempt below it belonged to another step, so no reply of it applies
    here. 0 in orders from before it was kept."""
    waiting: str | None = None
    """Why the order waits instead of running: its workflow version is not deployed here."""
    load_expiries: int = 0
    """Expiries of the current step while the Supervisor was saturated: retried without
    counting as failures (``RetryPolicy.max_load_expiries`` at most); 0 when a step starts."""
    cancelled: str | None = None
    """Who cancelled the order and why: from then no step goes forward, what was done is
    undone, and the order ends Cancelled (``steering.cancel``)."""
    suspended: bool = False
    """An operator suspended the order: nothing new is dispatched and no deadline expires it
    until it is resumed; a step already running may finish (``steering.suspend``)."""

    @property
    def is_terminal(self) -> bool:
        return self.process_state in TERMINAL_STATES

    @property
    def is_running(self) -> bool:
        return self.process_state in RUNNING_STATES


@dataclass(frozen=True)
class OrderRecord:
    """The order as submitted; immutable once accepted."""

    order_id: str
    workflow: str
    details: dict[str, Any]
    fingerprint: str
    """Hash of the canonical submission, to tell a redelivery from a conflicting reuse of the id."""
    submitted_at: datetime
    reply_to: str | None = None
    priority: Priority = DEFAULT_PRIORITY
    version: int = 1
    incarnation: str = ""


@dataclass(frozen=True)
class StepRecord:
    """A completed step and what its compensation will need (recorded durably)."""

    order_id: str
    index: int
    name: str
    attempt: int
    completed_at: datetime
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def row_key(self) -> str:
        return step_row_key(self.index, self.name)


@dataclass(frozen=True)
class HistoryEntry:
    """One line of an order's audit trail, written atomically with the transition it records."""

    order_id: str
    at: datetime
    kind: str
    attempt: int
    step: str | None = None
    mode: Mode = "do"
    actor: str | None = None
    detail: str | None = None
    endpoint: str | None = None
    """The remote endpoint a reply's call went to."""


AuditAction = Literal[
    "submit", "resubmit", "close", "purge", "parked_replay", "parked_discard",
    "cancel", "suspend", "resume", "terminate", "acknowledge",
]  # fmt: skip
AUDIT_ACTIONS: tuple[AuditAction, ...] = get_args(AuditAction)


@dataclass(frozen=True)
class AuditEntry:
    """One operator action, kept apart from what it acted on, so that it outlives a purge."""

    at: datetime
    actor: str
    action: AuditAction
    target: str
    """The order id or parked message id acted on."""
    reason: str | None = None
    detail: str | None = None
    """What came of it, or what else it acted with (a state, a queue)."""


@dataclass(frozen=True)
class AlertRecord:
    """An operator alert as sent (the alerts queue has its message): open while its order is
    still in Error at that attempt (or still waits for its definition) and no one acknowledged
    it; cleared by itself once the order leaves Error."""

    alert_id: str
    order_id: str
    at: datetime
    reason: str
    workflow: str = ""
    step: str = ""
    attempt: int = 0
    acknowledged_by: str | None = None
    acknowledged_at: datetime | None = None
    note: str | None = None
    cleared_at: datetime | None = None
    """When it was found its order had left Error (or was gone)."""

    @property
    def is_open(self) -> bool:
        return self.acknowledged_at is None and self.cleared_at is None


@dataclass(frozen=True)
class AuditQuery:
    """Which operators' actions to list, newest first; None means any."""

    limit: int
    action: str | None = None
    actor: str | None = None
    target: str | None = None

    def matches(self, entry: AuditEntry) -> bool:
        return all(
            wanted is None or wanted == found
            for wanted, found in (
                (self.action, entry.action),
                (self.actor, entry.actor),
                (self.target, entry.target),
            )
        )


@dataclass(frozen=True)
class WaitingSubmission:
    """A submission kept in the waiting room until its workflow has room in flight."""

    row_key: str
    order_id: str
    body: bytes
    """The submission as it came (``messages.encode``)."""
    etag: str


@dataclass(frozen=True)
class LiveMarker:
    """Index entry: this order may be in flight. The Supervisor sweeps these, not history.

    ``due_at``: the Supervisor must look at the order by then. It is never later than the
    order's deadline, nor than any deadline a later transition can set (see
    ``transitions.look_again_at``), so a sweep that lists only due markers misses nothing."""

    order_id: str
    touched_at: datetime
    etag: str
    due_at: datetime
    workflow: str = ""
    """The order's workflow, which in-flight limits count by ("" in markers from before)."""
    finished: bool = False
    """Its order finished well (Processed or Compensated, which nothing revives): no longer
    in flight, the sweep only drops it (``StateStore.finish_live``)."""


@dataclass(frozen=True)
class StepStart:
    """An agent started an attempt of a step (its row: ``wire.start_row_key``): from then the
    step's budget runs; until then the request was only waiting in its queue. Or, written by a
    Supervisor giving the unstarted attempt up (``abandoned``), the mark that no agent may
    start it any more: the row is inserted once, so of the two the first decides."""

    order_id: str
    key: str
    """The step's idempotency key (its incarnation, name and direction)."""
    attempt: int
    started_at: datetime
    run_by: datetime
    """When the attempt must have answered: its first start plus the step's budget (a request
    delivered again runs only within it)."""
    instance: str
    abandoned: bool = False


@dataclass(frozen=True)
class MissingDefinition:
    """Orders wait for a workflow version this app does not have (or has changed): noted once,
    when the first one is found, which is when its one operator alert goes out."""

    key: str
    """``<workflow>.<version>.<fingerprint>`` (``wire.missing_definition_key``)."""
    reason: str
    since: datetime


T = TypeVar("T")


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A value read from the store with the ETag that guards the next write to it."""

    value: T
    etag: str

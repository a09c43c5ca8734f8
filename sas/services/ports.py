"""Small ports the services depend on; adapters implement them."""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from sas.domain.endpoints import EndpointLoad, HeldRetries
from sas.domain.messages import Message
from sas.domain.model import (
    AlertRecord,
    AuditEntry,
    AuditQuery,
    HistoryEntry,
    LiveMarker,
    MissingDefinition,
    OrderRecord,
    OrderState,
    ProcessState,
    StepRecord,
    StepStart,
    Versioned,
    WaitingSubmission,
)
from sas.domain.parked import ParkedMessage
from sas.domain.priority import Waiting
from sas.domain.wire import Priority


class StateStore(Protocol):
    def create_order(
        self,
        order: OrderRecord,
        state: OrderState,
        history: HistoryEntry | Sequence[HistoryEntry] | None = None,
    ) -> str:
        """Insert order, state (and history) together or not at all; AlreadyExists if taken.
        Returns the state row's ETag."""
        ...

    def get_order(self, order_id: str) -> OrderRecord | None: ...

    def get_state(self, order_id: str) -> Versioned[OrderState] | None: ...

    def update_state(
        self,
        state: OrderState,
        etag: str,
        history: HistoryEntry | Sequence[HistoryEntry] | None = None,
        *,
        step: StepRecord | None = None,
    ) -> str:
        """Write if unchanged since ``etag`` was read; ConcurrencyConflict otherwise.

        With ``history`` and ``step`` (a completed step's record, replacing any earlier one),
        both are written in the same transaction. Returns the new ETag."""
        ...

    def add_history(self, entry: HistoryEntry) -> None: ...

    def get_history(self, order_id: str) -> list[HistoryEntry]: ...

    def touch_live(self, order_id: str, at: datetime, due_at: datetime, workflow: str = "") -> str:
        """Index the order of ``workflow`` as possibly in flight (before it can become live),
        due by ``due_at``; returns the marker's new ETag."""
        ...

    def create_live_all(
        self, markers: Sequence[tuple[str, datetime, datetime, str]]
    ) -> dict[str, LiveMarker]:
        """A marker for each (order id, at, due at, workflow) that has none, a hundred to a
        request; one already there is left as it is. Returns those created, by order id."""
        ...

    def count_live(self, workflow: str, up_to: int) -> int:
        """Markers of ``workflow``, counted up to ``up_to`` at most (one query); finished
        ones are not counted."""
        ...

    def count_held(self, workflow: str, up_to: int) -> int:
        """``count_live`` plus ``workflow``'s submissions waiting in the room, up to ``up_to``
        at most (a query each; the second only while the first is below it)."""
        ...

    def finish_live(self, order_id: str, at: datetime) -> None:
        """Mark the order's marker finished and due at ``at``: out of its workflow's count at
        once, dropped by the next sweep without reading the order. Only for an order that
        finished well (no one touches its marker after)."""
        ...

    def wait_for_room(self, row_key: str, order_id: str, body: bytes) -> None:
        """Keep a submission in the waiting room under ``room_row_key`` (an existing row under
        that key is left as it is: a redelivery)."""
        ...

    def list_waiting(self, workflow: str, up_to: int) -> list[WaitingSubmission]:
        """``workflow``'s waiting submissions in the order they go in, ``up_to`` at most."""
        ...

    def list_stranded(self, known: tuple[str, ...], up_to: int) -> list[WaitingSubmission]:
        """Waiting submissions of workflows not in ``known`` (a deploy removed them)."""
        ...

    def drop_waiting(self, waiting: WaitingSubmission) -> bool:
        """Remove a waiting submission unless changed since read; False if it was (or is
        gone)."""
        ...

    def drop_waiting_all(self, rows: Sequence[WaitingSubmission]) -> int:
        """``drop_waiting`` for each, a hundred to a request; returns how many went."""
        ...

    def list_live(self) -> list[LiveMarker]:
        """Every marker (operators and tests; the Supervisor lists only due ones)."""
        ...

    def list_due(self, at: datetime) -> list[LiveMarker]:
        """The markers due at or before ``at``: one query, whatever else is in flight."""
        ...

    def rearm_live(
        self, rearms: Sequence[tuple[LiveMarker, datetime]], drops: Sequence[LiveMarker] = ()
    ) -> int:
        """Move each marker's due time in ``rearms`` and unindex each marker in ``drops``,
        unless it was touched since it was read (all markers share one partition, so many go
        in one request). Returns how many moved or went."""
        ...

    def drop_live(self, marker: LiveMarker) -> bool:
        """Unindex, unless the marker was touched since it was read."""
        ...

    def query_states(
        self,
        *,
        process_state: ProcessState | None = None,
        priority: Priority | None = None,
        submitted_after: datetime | None = None,
        submitted_before: datetime | None = None,
        finished_before: datetime | None = None,
        updated_after: datetime | None = None,
    ) -> Iterator[Versioned[OrderState]]:
        """Every order whose state matches all the filters given (None = any), in no promised
        order. Scans the table: for operators, never for the order path."""
        ...

    def count_states(self) -> dict[ProcessState, int]:
        """How many orders are in each state (every state, zeros included). Scans the table."""
        ...

    def purge_order(self, state: Versioned[OrderState]) -> bool:
        """Delete every row of a finished order (order, state, steps, history). The state row
        goes last and only if unchanged since ``state`` was read, so an interrupted purge leaves
        an order that the next purge finds again; False if the state changed (nothing of the
        state row deleted). A finished order has no in-flight marker left but briefly; one that
        is left is an orphan the Supervisor drops after its grace."""
        ...

    def get_steps(self, order_id: str) -> list[StepRecord]: ...

    def park_message(self, queue: str, reason: str, body: bytes, at: datetime) -> str:
        """Keep a message the app refused (reason + original body) for an operator; returns its
        id (a rejected row key)."""
        ...

    def list_parked(self, limit: int = 100) -> list[ParkedMessage]:
        """At most ``limit`` messages the app parked (``parked_by="app"``), oldest first; their
        ``function`` is None (the store does not know it)."""
        ...

    def get_parked(self, parked_id: str) -> ParkedMessage | None:
        """One message the app parked, as ``list_parked`` shows it; None if there is no such
        id."""
        ...

    def drop_parked(self, parked_id: str) -> bool:
        """Remove a parked message for good (conditionally on the version read); False if
        there is no such message (any more)."""
        ...

    def append_audit(self, entries: Sequence[AuditEntry]) -> None:
        """Keep operators' actions, inserted (never changed), apart from the orders they acted
        on: a purge leaves them."""
        ...

    def list_audit(self, query: AuditQuery) -> list[AuditEntry]:
        """At most ``query.limit`` actions, newest first, that ``query`` matches."""
        ...

    def record_alert(self, record: AlertRecord) -> None:
        """Keep an alert as sent; one already kept under its id is left as it is."""
        ...

    def list_alerts(self) -> list[Versioned[AlertRecord]]:
        """The alerts kept that are open (neither acknowledged nor cleared), oldest first."""
        ...

    def get_alert(self, alert_id: str) -> Versioned[AlertRecord] | None: ...

    def update_alert(self, record: AlertRecord, etag: str) -> str:
        """Write if unchanged since ``etag`` was read; ConcurrencyConflict otherwise."""
        ...

    def record_start(self, start: StepStart) -> StepStart:
        """Record that an agent started an attempt, or that a Supervisor gave it up (a row of
        its own, inserted once, never overwritten). Returns the row as the first writer left
        it: this one, an earlier start (its request delivered again), or an abandonment."""
        ...

    def get_start(self, order_id: str, key: str, attempt: int) -> StepStart | None:
        """The start of attempt ``attempt`` of the step keyed ``key``; None if not started."""
        ...

    def get_missing(self, key: str) -> MissingDefinition | None:
        """The note that orders wait for definition ``key`` (its alert was sent), if any."""
        ...

    def note_missing(self, missing: MissingDefinition) -> None:
        """Write (or replace) the note of ``missing.key``."""
        ...

    def forget_missing(self, key: str) -> None:
        """The definition is back: a later absence is a new episode (and a new alert)."""
        ...


class Transport(Protocol):
    def send(
        self,
        queue: str,
        message: Message,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        """Send one message; NotFound if the queue does not exist."""
        ...

    def waiting(self, queue: str) -> Waiting:
        """What a peek sees at the front of ``queue``: the oldest enqueue time and how many
        messages (up to ``Waiting.PEEK``). Approximate, as the transports' peek is: for holding
        off work, never for deciding a state."""
        ...

    def holds_messages(self, queue: str) -> bool:
        """Whether ``queue`` holds any message at all: visible, delayed, leased or locked (a
        Storage queue's approximate count, never below the true one; a Service Bus peek,
        which shows locked and scheduled messages too). For holding off a recovery, never
        for deciding a state; NotFound if the queue does not exist."""
        ...


class QueueDepth(Protocol):
    def depth(self, queue: str) -> int:
        """How many messages wait in ``queue``, as the transport estimates it (metrics only);
        NotFound if the queue does not exist."""
        ...


class QueuePeek(Protocol):
    def peek(self, queue: str, limit: int) -> list[bytes]:
        """The bodies of the first messages waiting in ``queue``, left where they are (a
        Storage queue shows at most 32); NotFound if the queue does not exist."""
        ...


class LoadStore(Protocol):
    """Calls in flight per remote endpoint, as each process last published its own."""

    def publish(self, instance_id: str, counts: Mapping[str, int], at: datetime) -> None:
        """This process's count for each target (``Endpoint.target``), replacing its last."""
        ...

    def read(self) -> list[EndpointLoad]:
        """Every process's last published counts."""
        ...


class BudgetStore(Protocol):
    """Retries held back by each Supervisor process's retry budget, as each last published."""

    def publish(self, held: HeldRetries) -> None:
        """This process's figure, replacing its last."""
        ...

    def read(self) -> list[HeldRetries]:
        """Every process's last published figure."""
        ...


class RemoteService(Protocol):
    def perform(
        self,
        agent: str,
        action: str,
        *,
        idempotency_key: str,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        """Apply one effect at most once per key.

        Raises TransientRemoteError or PermanentRemoteError."""
        ...


class PoisonStore(Protocol):
    """Messages the Functions host gave up on (parked by the host), in every queue the app
    consumes: Storage ``<queue>-poison`` queues or Service Bus dead-letter sub-queues."""

    def list(self, limit: int = 100) -> builtins.list[ParkedMessage]:
        """At most ``limit`` messages (``parked_by="host"``), oldest first (a Storage queue shows
        its first 32)."""
        ...

    def replay(self, poison_id: str) -> bool:
        """Send the original body back to its source queue unchanged, then remove it here.

        False if there is no such message (any more); NotFound if the source queue is gone."""
        ...

    def discard(self, poison_id: str) -> bool:
        """Remove it for good; False if there is no such message (any more)."""
        ...

    def requeue(self, queue: str, body: bytes, *, message_id: str) -> None:
        """Send a raw body to one of the app's source queues as the transport expects, so the
        function sees exactly ``body`` (Storage: Base64 text; Service Bus: the message body).

        ``message_id`` labels the message (Service Bus duplicate detection; logged on Storage).
        IllegalTransition if ``queue`` is not a queue the app consumes; NotFound if it is gone."""
        ...

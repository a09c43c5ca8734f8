"""An order's rows on Azure Table Storage (azure-data-tables): what the handlers read and write.
``sas/adapters/table_store.py`` adds what the Supervisor and operators need.

One table; PartitionKey = OrderID so the order and its state are inserted in one entity-group
transaction. Every update is conditional on the ETag (``MatchConditions.IfNotModified``): the
SDK's default is last-writer-wins. A transition and its history row share one batch; some
Azurite versions ignored If-Match inside batches, so a test pins that the pinned one honours it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Self

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from sas.domain.errors import AlreadyExists, ConcurrencyConflict, NotFound
from sas.domain.model import (
    HistoryEntry,
    OrderRecord,
    OrderState,
    ProcessState,
    StepRecord,
    StepStart,
    Versioned,
)
from sas.domain.wire import (
    DEFAULT_PRIORITY,
    HISTORY_ROW_PREFIX,
    LIVE_PARTITION,
    ORDER_ROW,
    PRIORITIES,
    STATE_ROW,
    STEP_ROW_PREFIX,
    Priority,
    history_row_key,
    live_table_name,
    prefix_range,
    start_row_key,
)
from sas.settings import Connection

# The in-flight index (LIVE_PARTITION of the in-flight table): one marker per order that may
# be in flight, with the time it is due for a look. The Supervisor queries the due markers, so
# a sweep costs in proportion to in-flight work that needs a look, never to history. A marker
# is written *before* its order can become live and removed only *after* it is terminal, so a
# lost write leaves an extra marker (swept away later), never a live order without one; its
# due time is never later than the order's deadline (transitions.look_again_at).


class OrderTables:
    def __init__(self, table: TableClient, live_table: TableClient) -> None:
        self._table = table
        self._live = live_table

    @classmethod
    def connect(cls, connection: Connection, table_name: str) -> Self:
        """The store on the orders table ``table_name`` and its in-flight table."""
        from sas.adapters.clients import table_client

        return cls(
            table_client(connection, table_name),
            table_client(connection, live_table_name(table_name)),
        )

    # --- orders and state -------------------------------------------------------------

    def create_order(
        self,
        order: OrderRecord,
        state: OrderState,
        history: HistoryEntry | Sequence[HistoryEntry] | None = None,
    ) -> str:
        entries = [history] if isinstance(history, HistoryEntry) else list(history or ())
        operations: list[tuple[str, dict[str, Any]]] = [
            ("create", _order_entity(order)),
            ("create", _state_entity(state)),
            *(("create", _history_entity(entry)) for entry in entries),
        ]
        try:
            results = self._table.submit_transaction(operations)
        except TableTransactionError as exc:
            if exc.status_code == 409:
                raise AlreadyExists(f"order {order.order_id} exists") from None
            raise
        return str(results[1]["etag"])  # the results follow the operations' order

    def get_order(self, order_id: str) -> OrderRecord | None:
        entity = self._get(order_id, ORDER_ROW)
        return None if entity is None else _order_from(entity)

    def get_state(self, order_id: str) -> Versioned[OrderState] | None:
        entity = self._get(order_id, STATE_ROW)
        if entity is None:
            return None
        return Versioned(state_from(entity), entity.metadata["etag"])

    def update_state(
        self,
        state: OrderState,
        etag: str,
        history: HistoryEntry | Sequence[HistoryEntry] | None = None,
        *,
        step: StepRecord | None = None,
    ) -> str:
        """Replace the state if unchanged since ``etag``; with ``history`` and ``step``, in one
        transaction (same partition), so the audit trail records exactly the transitions that
        happened and a step counts as done exactly when what its undo needs is kept."""
        entries = [history] if isinstance(history, HistoryEntry) else list(history or ())
        if entries or step is not None:
            return self._update_in_transaction(state, etag, entries, step)
        try:
            metadata = self._table.update_entity(
                _state_entity(state),
                mode=UpdateMode.REPLACE,
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except ResourceModifiedError:
            raise ConcurrencyConflict(f"state of {state.order_id} changed since read") from None
        except ResourceNotFoundError:
            raise NotFound(f"order {state.order_id} has no state") from None
        new_etag: str = metadata["etag"]
        return new_etag

    def _update_in_transaction(
        self,
        state: OrderState,
        etag: str,
        history: Sequence[HistoryEntry],
        step: StepRecord | None,
    ) -> str:
        operations: list[Any] = [("update", _state_entity(state), if_unchanged(etag))]
        operations += [("create", _history_entity(entry)) for entry in history]
        if step is not None:
            # An upsert: the record of a step run again (an operator's resubmit) replaces the
            # earlier one, and only together with the state write the fence allowed.
            operations.append(("upsert", _step_entity(step), {"mode": UpdateMode.REPLACE}))
        try:
            results = self._table.submit_transaction(operations)
        except TableTransactionError as exc:
            if exc.status_code == 412:
                raise ConcurrencyConflict(f"state of {state.order_id} changed since read") from None
            if exc.status_code == 404:
                raise NotFound(f"order {state.order_id} has no state") from None
            raise
        new_etag: str = results[0]["etag"]
        return new_etag

    # --- history ----------------------------------------------------------------------

    def add_history(self, entry: HistoryEntry) -> None:
        """An audit line that records no transition (e.g. a stale reply that was dropped)."""
        self._table.create_entity(_history_entity(entry))

    def get_history(self, order_id: str) -> list[HistoryEntry]:
        query = "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi"
        lo, hi = prefix_range(HISTORY_ROW_PREFIX)
        params = {"pk": order_id, "lo": lo, "hi": hi}
        return [_history_from(e) for e in self._table.query_entities(query, parameters=params)]

    # --- in-flight index --------------------------------------------------------------

    def touch_live(self, order_id: str, at: datetime, due_at: datetime, workflow: str = "") -> str:
        """Mark an order as possibly in flight. An upsert on purpose: it holds no state, and
        re-touching changes its ETag so a concurrent drop_live of an older read fails."""
        written = self._live.upsert_entity(
            marker_entity(order_id, at, due_at, workflow), mode=UpdateMode.REPLACE
        )
        return str(written["etag"])

    def finish_live(self, order_id: str, at: datetime) -> None:
        """An upsert too: it replaces whatever marker there is (a sweep's later conditional
        write of an older read then fails), and it carries no workflow, so no count sees it."""
        self._live.upsert_entity(
            marker_entity(order_id, at, at, finished=True), mode=UpdateMode.REPLACE
        )

    # --- steps ------------------------------------------------------------------------

    def get_steps(self, order_id: str) -> list[StepRecord]:
        query = "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi"
        lo, hi = prefix_range(STEP_ROW_PREFIX)
        params = {"pk": order_id, "lo": lo, "hi": hi}
        entities = self._table.query_entities(query, parameters=params)
        return [_step_from(entity) for entity in entities]

    # --- starts -----------------------------------------------------------------------

    def record_start(self, start: StepStart) -> StepStart:
        """An insert, one request; if the attempt started before (its request delivered
        again), the row as that first start wrote it."""
        try:
            self._table.create_entity(_start_entity(start))
        except ResourceExistsError:
            return self.get_start(start.order_id, start.key, start.attempt) or start
        return start

    def get_start(self, order_id: str, key: str, attempt: int) -> StepStart | None:
        found = self._get(order_id, start_row_key(key, attempt))
        return None if found is None else _start_from(order_id, key, attempt, found)

    def _get(self, partition: str, row: str) -> Any:
        try:
            return self._table.get_entity(partition, row)
        except ResourceNotFoundError:
            return None


# --- mapping between records and entities -----------------------------------------------


def _start_entity(start: StepStart) -> dict[str, Any]:
    return {
        "PartitionKey": start.order_id,
        "RowKey": start_row_key(start.key, start.attempt),
        "StartedAt": start.started_at,
        "RunBy": start.run_by,
        "Instance": start.instance[:200],
        "Abandoned": start.abandoned,
    }


def _start_from(order_id: str, key: str, attempt: int, entity: Mapping[str, Any]) -> StepStart:
    return StepStart(
        order_id=order_id,
        key=key,
        attempt=attempt,
        started_at=utc(entity["StartedAt"]),
        run_by=utc(entity["RunBy"]),
        instance=str(entity.get("Instance", "")),
        abandoned=bool(entity.get("Abandoned", False)),
    )


def _without_none(entity: dict[str, Any]) -> dict[str, Any]:
    # REPLACE drops properties that are absent, which is how a field is cleared.
    return {key: value for key, value in entity.items() if value is not None}


def utc(value: Any) -> datetime:
    """A datetime read from Table Storage as a plain, tz-aware UTC datetime."""
    if not isinstance(value, datetime):
        raise TypeError(f"expected a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        raise ValueError("naive datetime read from the store")
    v = value.astimezone(UTC)  # a plain datetime, not the SDK's TablesEntityDatetime subclass
    return datetime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, tzinfo=UTC)


def optional_utc(value: Any) -> datetime | None:
    return None if value is None else utc(value)


def marker_entity(
    order_id: str,
    touched_at: datetime,
    due_at: datetime,
    workflow: str = "",
    *,
    finished: bool = False,
) -> dict[str, Any]:
    return {
        "PartitionKey": LIVE_PARTITION,
        "RowKey": order_id,
        "TouchedAt": touched_at,
        "DueAt": due_at,
        **({"Workflow": workflow} if workflow else {}),
        **({"Finished": True} if finished else {}),
    }


def if_unchanged(etag: str) -> dict[str, Any]:
    return {
        "mode": UpdateMode.REPLACE,
        "etag": etag,
        "match_condition": MatchConditions.IfNotModified,
    }


def _order_entity(order: OrderRecord) -> dict[str, Any]:
    return _without_none(
        {
            "PartitionKey": order.order_id,
            "RowKey": ORDER_ROW,
            "Workflow": order.workflow,
            "Details": json.dumps(order.details, separators=(",", ":")),
            "Fingerprint": order.fingerprint,
            "SubmittedAt": order.submitted_at,
            "ReplyTo": order.reply_to,
            "Priority": _priority_column(order.priority),
            "Version": order.version,
            "Incarnation": order.incarnation or None,
        }
    )


def _order_from(entity: Mapping[str, Any]) -> OrderRecord:
    return OrderRecord(
        order_id=entity["PartitionKey"],
        workflow=entity["Workflow"],
        details=json.loads(entity["Details"]),
        fingerprint=entity["Fingerprint"],
        submitted_at=utc(entity["SubmittedAt"]),
        reply_to=entity.get("ReplyTo"),
        priority=_priority(entity.get("Priority")),
        version=int(entity.get("Version") or 1),
        incarnation=entity.get("Incarnation") or "",
    )


def _state_entity(state: OrderState) -> dict[str, Any]:
    return _without_none(
        {
            "PartitionKey": state.order_id,
            "RowKey": STATE_ROW,
            "Workflow": state.workflow,
            "ProcessState": state.process_state.value,
            "LockedBy": state.locked_by,
            "CompleteBy": state.complete_by,
            "FailureCount": state.failure_count,
            "Attempt": state.attempt,
            "StepIndex": state.step_index,
            "Mode": state.mode,
            "NotBefore": state.not_before,
            "AlertPending": state.alert_pending,
            "AlertClaimedBy": state.alert_claimed_by,
            "AlertClaimedUntil": state.alert_claimed_until,
            "ReplyTo": state.reply_to,
            "SubmittedAt": state.submitted_at,
            "UpdatedAt": state.updated_at,
            "FinishedAt": state.finished_at,
            "LastError": state.last_error,
            "StatusEvents": state.status_events if state.status_events != "outcome" else None,
            "Priority": _priority_column(state.priority),
            "Deferrals": state.deferrals or None,
            "LoadExpiries": state.load_expiries or None,
            "TraceParent": state.traceparent,
            "Version": state.version,
            "Definition": state.definition or None,
            "Incarnation": state.incarnation or None,
            "Step": state.step or None,
            "FirstAttempt": state.first_attempt or None,
            "Waiting": state.waiting,
            "Cancelled": state.cancelled,
            "Suspended": state.suspended or None,
            "Details": json.dumps(state.details, separators=(",", ":")),
            **_results_columns(state.results),
        }
    )


def state_from(entity: Mapping[str, Any]) -> OrderState:
    return OrderState(
        order_id=entity["PartitionKey"],
        workflow=entity["Workflow"],
        process_state=ProcessState(entity["ProcessState"]),
        locked_by=entity.get("LockedBy"),
        complete_by=optional_utc(entity.get("CompleteBy")),
        failure_count=int(entity["FailureCount"]),
        attempt=int(entity["Attempt"]),
        step_index=int(entity["StepIndex"]),
        mode="undo" if entity.get("Mode") == "undo" else "do",
        not_before=optional_utc(entity.get("NotBefore")),
        alert_pending=bool(entity.get("AlertPending", False)),
        alert_claimed_by=entity.get("AlertClaimedBy"),
        alert_claimed_until=optional_utc(entity.get("AlertClaimedUntil")),
        reply_to=entity.get("ReplyTo"),
        submitted_at=utc(entity["SubmittedAt"]),
        updated_at=utc(entity["UpdatedAt"]),
        finished_at=optional_utc(entity.get("FinishedAt")),
        last_error=entity.get("LastError"),
        status_events="steps" if entity.get("StatusEvents") == "steps" else "outcome",
        details=json.loads(entity["Details"]),
        priority=_priority(entity.get("Priority")),
        deferrals=int(entity.get("Deferrals") or 0),
        load_expiries=int(entity.get("LoadExpiries") or 0),
        traceparent=entity.get("TraceParent"),
        results=_results_from(entity),
        # Absent in rows written before orders were bound to a version: version 1, and
        # nothing to check the definition, the key or the first claim against.
        version=int(entity.get("Version") or 1),
        definition=entity.get("Definition") or "",
        incarnation=entity.get("Incarnation") or "",
        step=entity.get("Step") or "",
        first_attempt=int(entity.get("FirstAttempt") or 0),
        waiting=entity.get("Waiting"),
        cancelled=entity.get("Cancelled"),
        suspended=bool(entity.get("Suspended", False)),
    )


_RESULTS_CHUNK = 30_000
"""Characters per ``ResultsNN`` column: the JSON is ASCII (``json.dumps`` escapes the rest), so
this many fit a string property's 64 KiB of UTF-16."""


def _results_columns(results: Mapping[str, Any]) -> dict[str, str]:
    """The steps' results as JSON in as many columns as it needs (none while there are none)."""
    if not results:
        return {}
    text = json.dumps(results, separators=(",", ":"))
    chunks = range(0, len(text), _RESULTS_CHUNK)
    return {f"Results{i // _RESULTS_CHUNK:02d}": text[i : i + _RESULTS_CHUNK] for i in chunks}


def _results_from(entity: Mapping[str, Any]) -> dict[str, Any]:
    keys = sorted(k for k in entity if k.startswith("Results") and k[7:].isdigit())
    return json.loads("".join(entity[k] for k in keys)) if keys else {}


def _priority_column(priority: Priority) -> str | None:
    """Written only when not the default: rows of normal orders stay as they were."""
    return None if priority == DEFAULT_PRIORITY else priority


def _priority(value: object) -> Priority:
    for priority in PRIORITIES:
        if value == priority:
            return priority
    return DEFAULT_PRIORITY


def _step_entity(step: StepRecord) -> dict[str, Any]:
    return {
        "PartitionKey": step.order_id,
        "RowKey": step.row_key,
        "Index": step.index,
        "Name": step.name,
        "Attempt": step.attempt,
        "CompletedAt": step.completed_at,
        "Result": json.dumps(step.result, separators=(",", ":")),
    }


def _step_from(entity: Mapping[str, Any]) -> StepRecord:
    return StepRecord(
        order_id=entity["PartitionKey"],
        index=int(entity["Index"]),
        name=entity["Name"],
        attempt=int(entity["Attempt"]),
        completed_at=utc(entity["CompletedAt"]),
        result=json.loads(entity["Result"]),
    )


def _history_entity(entry: HistoryEntry) -> dict[str, Any]:
    return _without_none(
        {
            "PartitionKey": entry.order_id,
            "RowKey": history_row_key(entry.at, entry.attempt, uuid.uuid4().hex[:8]),
            "At": entry.at,
            "Kind": entry.kind,
            "Attempt": entry.attempt,
            "Step": entry.step,
            "Mode": entry.mode,
            "Actor": entry.actor,
            "Detail": None if entry.detail is None else entry.detail[:1000],
            "Endpoint": entry.endpoint,
        }
    )


def _history_from(entity: Mapping[str, Any]) -> HistoryEntry:
    return HistoryEntry(
        order_id=entity["PartitionKey"],
        at=utc(entity["At"]),
        kind=entity["Kind"],
        attempt=int(entity["Attempt"]),
        step=entity.get("Step"),
        mode="undo" if entity.get("Mode") == "undo" else "do",
        actor=entity.get("Actor"),
        detail=entity.get("Detail"),
        endpoint=entity.get("Endpoint"),
    )

"""The state store on Azure Table Storage (azure-data-tables).

One table; PartitionKey = OrderID so the order and its state are inserted in one entity-group
transaction. Every update is conditional on the ETag (``MatchConditions.IfNotModified``): the
SDK's default is last-writer-wins. A transition and its history row share one batch; some
Azurite versions ignored If-Match inside batches, so a test pins that the pinned one honours it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from sas.domain.errors import AlreadyExists, ConcurrencyConflict, NotFound
from sas.domain.model import (
    HistoryEntry,
    LiveMarker,
    OrderRecord,
    OrderState,
    ProcessState,
    StepRecord,
    Versioned,
)
from sas.domain.parked import ParkedMessage
from sas.domain.wire import (
    DEFAULT_PRIORITY,
    HISTORY_ROW_PREFIX,
    LIVE_PARTITION,
    ORDER_ROW,
    PRIORITIES,
    REJECTED_PARTITION,
    STATE_ROW,
    STEP_ROW_PREFIX,
    Priority,
    history_row_key,
    live_table_name,
    prefix_range,
    rejected_row_key,
)
from sas.settings import Connection

log = logging.getLogger(__name__)

# The in-flight index (LIVE_PARTITION of the in-flight table): one marker per order that may
# be in flight, with the time it is due for a look. The Supervisor queries the due markers, so
# a sweep costs in proportion to in-flight work that needs a look, never to history. A marker
# is written *before* its order can become live and removed only *after* it is terminal, so a
# lost write leaves an extra marker (swept away later), never a live order without one; its
# due time is never later than the order's deadline (transitions.look_again_at).
_BODY_CHUNK = 60 * 1024  # a Table property holds at most 64 KiB
_MAX_BODY_CHUNKS = 14  # an entity holds at most 1 MiB
_MAX_BATCH = 100  # operations in one entity-group transaction
_FAILED_RETRIES = 3  # a batch of re-arms and drops sent again without the one that failed
_SLACK = timedelta(seconds=1)


class TableStateStore:
    def __init__(self, table: TableClient, live_table: TableClient) -> None:
        self._table = table
        self._live = live_table

    @classmethod
    def connect(cls, connection: Connection, table_name: str) -> TableStateStore:
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
        return Versioned(_state_from(entity), entity.metadata["etag"])

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
        operations: list[Any] = [("update", _state_entity(state), _if_unchanged(etag))]
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

    def touch_live(self, order_id: str, at: datetime, due_at: datetime) -> str:
        """Mark an order as possibly in flight. An upsert on purpose: it holds no state, and
        re-touching changes its ETag so a concurrent drop_live of an older read fails."""
        written = self._live.upsert_entity(
            _marker_entity(order_id, at, due_at), mode=UpdateMode.REPLACE
        )
        return str(written["etag"])

    def list_live(self) -> list[LiveMarker]:
        entities = self._live.query_entities(
            "PartitionKey eq @pk", parameters={"pk": LIVE_PARTITION}
        )
        return [_marker_from(e) for e in entities]

    def list_due(self, at: datetime) -> list[LiveMarker]:
        entities = self._live.query_entities(
            "PartitionKey eq @pk and DueAt le @at",
            parameters={"pk": LIVE_PARTITION, "at": at},
            results_per_page=1000,
        )
        return [_marker_from(e) for e in entities]

    def rearm_live(
        self,
        rearms: Sequence[tuple[LiveMarker, datetime]],
        drops: Sequence[LiveMarker] = (),
    ) -> int:
        """In transactions of up to 100 (one partition), each operation conditional on the
        ETag the marker was read with: a re-arm replaces the marker with its new due time, a
        drop deletes it. A marker that changed (or went) since read fails its transaction,
        which is sent again without it (the service names the failed operation), a few times
        at most; then, or on a failure that names no operation, the rest of that transaction
        is given up: each marker left is due already, so the next sweep looks at it again.
        Returns how many markers moved or went."""
        writes: list[tuple[LiveMarker, datetime | None]] = [*rearms, *((m, None) for m in drops)]
        done = 0
        for start in range(0, len(writes), _MAX_BATCH):
            done += self._write_markers(writes[start : start + _MAX_BATCH])
        return done

    def _write_markers(self, writes: Sequence[tuple[LiveMarker, datetime | None]]) -> int:
        chunk = list(writes)
        for _ in range(_FAILED_RETRIES + 1):
            try:
                self._live.submit_transaction([_marker_write(*write) for write in chunk])
            except TableTransactionError as exc:
                if exc.status_code not in (404, 412):
                    raise
                index = _named_index(exc)
                if index is None or index >= len(chunk):
                    break
                del chunk[index]  # touched or dropped since: its new owner decides
                if not chunk:
                    return 0
                continue
            return len(chunk)
        log.info("sas.marker_writes_left", extra={"count": len(chunk)})
        return 0

    def drop_live(self, marker: LiveMarker) -> bool:
        """Remove a marker unless it was touched since read; False if it was (or is gone)."""
        try:
            self._live.delete_entity(
                LIVE_PARTITION,
                marker.order_id,
                etag=marker.etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except ResourceModifiedError:
            return False
        return True

    def query_states(
        self,
        *,
        process_state: ProcessState | None = None,
        priority: Priority | None = None,
        submitted_after: datetime | None = None,
        submitted_before: datetime | None = None,
        finished_before: datetime | None = None,
    ) -> Iterator[Versioned[OrderState]]:
        clauses = ["RowKey eq @row"]
        params: dict[str, Any] = {"row": STATE_ROW}
        if process_state is not None:
            clauses.append("ProcessState eq @state")
            params["state"] = process_state.value
        # A normal order has no Priority column (_priority_column), which a filter cannot ask
        # for: normal is picked out below instead.
        if priority is not None and priority != DEFAULT_PRIORITY:
            clauses.append("Priority eq @priority")
            params["priority"] = priority
        # Time filters are widened by a second on the service and applied exactly here: a
        # filter's datetime literal may be coarser than the stored value.
        for name, clause, value in (
            ("after", "SubmittedAt ge @after", submitted_after and submitted_after - _SLACK),
            ("before", "SubmittedAt lt @before", submitted_before and submitted_before + _SLACK),
            ("finished", "FinishedAt lt @finished", finished_before and finished_before + _SLACK),
        ):
            if value is not None:
                clauses.append(clause)
                params[name] = value
        entities = self._table.query_entities(
            " and ".join(clauses), parameters=params, results_per_page=1000
        )
        for entity in entities:
            state = _state_from(entity)
            finished = state.finished_at
            if (
                (priority is None or state.priority == priority)
                and (submitted_after is None or state.submitted_at >= submitted_after)
                and (submitted_before is None or state.submitted_at < submitted_before)
                and (
                    finished_before is None or (finished is not None and finished < finished_before)
                )
            ):
                yield Versioned(state, str(entity.metadata["etag"]))

    def count_states(self) -> dict[ProcessState, int]:
        counts = dict.fromkeys(ProcessState, 0)
        entities = self._table.query_entities(
            "RowKey eq @row",
            parameters={"row": STATE_ROW},
            select=["ProcessState"],
            results_per_page=1000,
        )
        for entity in entities:
            counts[ProcessState(entity["ProcessState"])] += 1
        return counts

    def purge_order(self, state: Versioned[OrderState]) -> bool:
        """One entity-group transaction when the order has at most 100 rows (a 3-step order
        has about 15): all or nothing. A longer order goes in several, each of which also
        rewrites the state row conditionally (a merge of nothing: only its ETag changes), so
        every one commits only while the order is as it was read, a purge that loses a race
        deletes nothing more, and one cut short is found and finished by the next."""
        order_id = state.value.order_id
        key = {"PartitionKey": order_id, "RowKey": STATE_ROW}
        etag = state.etag
        others = self._rows_besides_state(order_id)
        try:
            while len(others) >= _MAX_BATCH:
                batch, others = others[: _MAX_BATCH - 1], others[_MAX_BATCH - 1 :]
                merge = {
                    "mode": UpdateMode.MERGE,
                    "etag": etag,
                    "match_condition": MatchConditions.IfNotModified,
                }
                results = self._table.submit_transaction(
                    [("update", key, merge), *(("delete", row) for row in batch)]
                )
                etag = str(results[0]["etag"])
            unchanged = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
            self._table.submit_transaction(
                [*(("delete", row) for row in others), ("delete", key, unchanged)]
            )
        except TableTransactionError as exc:
            if exc.status_code in (404, 412):  # changed, or purged by someone else meanwhile
                return False
            raise
        # A row written while the purge ran (a stale reply's history row) would outlive its
        # order, where no purge could find it: gone too.
        for row in self._rows_besides_state(order_id):
            with contextlib.suppress(ResourceNotFoundError):
                self._table.delete_entity(order_id, row["RowKey"])
        return True

    def _rows_besides_state(self, order_id: str) -> list[dict[str, str]]:
        rows = self._table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": order_id}, select=["RowKey"]
        )
        return [
            {"PartitionKey": order_id, "RowKey": row["RowKey"]}
            for row in rows
            if row["RowKey"] != STATE_ROW
        ]

    # --- steps ------------------------------------------------------------------------

    def get_steps(self, order_id: str) -> list[StepRecord]:
        query = "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi"
        lo, hi = prefix_range(STEP_ROW_PREFIX)
        params = {"pk": order_id, "lo": lo, "hi": hi}
        entities = self._table.query_entities(query, parameters=params)
        return [_step_from(entity) for entity in entities]

    # --- messages the app parked (rejected) ---------------------------------------------

    def park_message(self, queue: str, reason: str, body: bytes, at: datetime) -> str:
        parked_id = rejected_row_key(at, uuid.uuid4().hex[:12])
        kept = body[: _BODY_CHUNK * _MAX_BODY_CHUNKS]
        entity: dict[str, Any] = {
            "PartitionKey": REJECTED_PARTITION,
            "RowKey": parked_id,
            "Queue": queue,
            "Reason": reason[:1000],
            "At": at,
            "BodyLength": len(body),
            "BodyTruncated": len(kept) < len(body),
        }
        for index in range(0, len(kept), _BODY_CHUNK):
            entity[f"Body{index // _BODY_CHUNK:02d}"] = kept[index : index + _BODY_CHUNK]
        self._table.create_entity(entity)
        return parked_id

    def list_parked(self, limit: int = 100) -> list[ParkedMessage]:
        entities = self._table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": REJECTED_PARTITION}, results_per_page=limit
        )
        parked: list[ParkedMessage] = []
        for entity in entities:
            parked.append(_parked_from(entity))
            if len(parked) >= limit:
                break
        return parked

    def get_parked(self, parked_id: str) -> ParkedMessage | None:
        entity = self._get(REJECTED_PARTITION, parked_id)
        return None if entity is None else _parked_from(entity)

    def drop_parked(self, parked_id: str) -> bool:
        """Delete a parked message if unchanged since read; False if it is gone (or changed).

        A one-operation transaction, not ``delete_entity``: the SDK's delete treats 404 as
        success, so two operators dropping the same message would both be told they did."""
        entity = self._get(REJECTED_PARTITION, parked_id)
        if entity is None:
            return False
        conditional = {
            "etag": entity.metadata["etag"],
            "match_condition": MatchConditions.IfNotModified,
        }
        try:
            self._table.submit_transaction([("delete", entity, conditional)])
        except TableTransactionError as exc:
            if exc.status_code in (404, 412):
                return False
            raise
        return True

    def _get(self, partition: str, row: str) -> Any:
        try:
            return self._table.get_entity(partition, row)
        except ResourceNotFoundError:
            return None


# --- mapping between records and entities -----------------------------------------------


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


def _parked_from(entity: Mapping[str, Any]) -> ParkedMessage:
    chunks = sorted(key for key in entity if key.startswith("Body") and key[4:].isdigit())
    return ParkedMessage(
        id=entity["RowKey"],
        parked_by="app",
        queue=entity["Queue"],
        function=None,  # not stored: the operator knows which function the queue triggers
        reason=entity["Reason"],
        body=b"".join(bytes(entity[key]) for key in chunks),
        body_truncated=bool(entity["BodyTruncated"]),
        parked_at=utc(entity["At"]),
    )


def _marker_entity(order_id: str, touched_at: datetime, due_at: datetime) -> dict[str, Any]:
    return {
        "PartitionKey": LIVE_PARTITION,
        "RowKey": order_id,
        "TouchedAt": touched_at,
        "DueAt": due_at,
    }


def _if_unchanged(etag: str) -> dict[str, Any]:
    return {
        "mode": UpdateMode.REPLACE,
        "etag": etag,
        "match_condition": MatchConditions.IfNotModified,
    }


def _marker_write(marker: LiveMarker, due_at: datetime | None) -> tuple[Any, ...]:
    """A re-arm to ``due_at`` (None: a drop), as a transaction operation conditional on the
    ETag ``marker`` was read with."""
    if due_at is None:
        condition = {"etag": marker.etag, "match_condition": MatchConditions.IfNotModified}
        return ("delete", _marker_key(marker.order_id), condition)
    entity = _marker_entity(marker.order_id, marker.touched_at, due_at)
    return ("update", entity, _if_unchanged(marker.etag))


def _marker_key(order_id: str) -> dict[str, Any]:
    return {"PartitionKey": LIVE_PARTITION, "RowKey": order_id}


def _marker_from(entity: Any) -> LiveMarker:
    touched = utc(entity["TouchedAt"])
    return LiveMarker(entity["RowKey"], touched, str(entity.metadata["etag"]), utc(entity["DueAt"]))


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
    )


def _named_index(error: TableTransactionError) -> int | None:
    """The operation a failed transaction names (its message starts ``<index>:``). The SDK's
    ``index`` is 0 also when the service names none, which would blame the first operation."""
    head, colon, _ = (error.message or "").partition(":")
    return int(head) if colon and head.strip().isdigit() else None


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
            "TraceParent": state.traceparent,
            "Details": json.dumps(state.details, separators=(",", ":")),
        }
    )


def _state_from(entity: Mapping[str, Any]) -> OrderState:
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
        traceparent=entity.get("TraceParent"),
    )


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

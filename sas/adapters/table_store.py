"""The whole state store: an order's rows (``sas/adapters/tables.py``), plus what the
Supervisor and operators use: the in-flight index's sweeps, queries over every order, purge,
and the messages the app parked."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from sas.adapters.tables import (
    OrderTables,
    if_unchanged,
    marker_entity,
    optional_utc,
    state_from,
    utc,
)
from sas.domain.errors import ConcurrencyConflict
from sas.domain.model import (
    AlertRecord,
    AuditEntry,
    AuditQuery,
    LiveMarker,
    MissingDefinition,
    OrderState,
    ProcessState,
    Versioned,
    WaitingSubmission,
)
from sas.domain.parked import ParkedMessage
from sas.domain.wire import (
    ALERTS_PARTITION,
    DEFAULT_PRIORITY,
    LIVE_PARTITION,
    MISSING_PARTITION,
    REJECTED_PARTITION,
    ROOM_PARTITION,
    STATE_ROW,
    Priority,
    audit_partition,
    audit_partition_range,
    audit_row_key,
    rejected_row_key,
    room_rows,
    room_rows_besides,
)

log = logging.getLogger(__name__)

_BODY_CHUNK = 60 * 1024  # a Table property holds at most 64 KiB
_MAX_BODY_CHUNKS = 14  # an entity holds at most 1 MiB
_MAX_BATCH = 100  # operations in one entity-group transaction
_SLACK = timedelta(seconds=1)


class TableStateStore(OrderTables):
    # --- in-flight index --------------------------------------------------------------

    def list_live(self) -> list[LiveMarker]:
        entities = self._live.query_entities(
            "PartitionKey eq @pk", parameters={"pk": LIVE_PARTITION}
        )
        return [_marker_from(e) for e in entities]

    def create_live_all(
        self, markers: Sequence[tuple[str, datetime, datetime, str]]
    ) -> dict[str, LiveMarker]:
        """Inserts, a hundred to a transaction (one partition); one whose marker exists already
        fails its transaction, which is sent again without it (as ``rearm_live``)."""
        created: dict[str, LiveMarker] = {}
        for start in range(0, len(markers), _MAX_BATCH):
            chunk = markers[start : start + _MAX_BATCH]
            went = self._submit_leaving_out_failed([("create", marker_entity(*m)) for m in chunk])
            for operation, response in went:
                entity = operation[1]
                created[entity["RowKey"]] = LiveMarker(
                    entity["RowKey"],
                    entity["TouchedAt"],
                    str(response["etag"]),
                    entity["DueAt"],
                    entity.get("Workflow", ""),
                )
        return created

    def count_live(self, workflow: str, up_to: int) -> int:
        entities = self._live.query_entities(
            "PartitionKey eq @pk and Workflow eq @workflow",
            parameters={"pk": LIVE_PARTITION, "workflow": workflow},
            select=["RowKey"],
            results_per_page=min(max(up_to, 1), 1000),
        )
        counted = 0
        for _ in entities:  # pages are fetched as they are read: no more than needed
            counted += 1
            if counted >= up_to:
                break
        return counted

    def count_held(self, workflow: str, up_to: int) -> int:
        held = self.count_live(workflow, up_to)
        if held >= up_to:
            return held
        first, after = room_rows(workflow)
        entities = self._live.query_entities(
            "PartitionKey eq @pk and RowKey ge @first and RowKey lt @after",
            parameters={"pk": ROOM_PARTITION, "first": first, "after": after},
            select=["RowKey"],
            results_per_page=min(max(up_to - held, 1), 1000),
        )
        for _ in entities:  # pages are fetched as they are read: no more than needed
            held += 1
            if held >= up_to:
                break
        return held

    # --- the waiting room -------------------------------------------------------------

    def wait_for_room(self, row_key: str, order_id: str, body: bytes) -> None:
        entity: dict[str, Any] = {
            "PartitionKey": ROOM_PARTITION,
            "RowKey": row_key,
            "OrderID": order_id,
        }
        entity.update(_body_chunks(body))
        with contextlib.suppress(ResourceExistsError):
            self._live.create_entity(entity)

    def list_waiting(self, workflow: str, up_to: int) -> list[WaitingSubmission]:
        return self._waiting([room_rows(workflow)], up_to)

    def list_stranded(self, known: tuple[str, ...], up_to: int) -> list[WaitingSubmission]:
        return self._waiting(room_rows_besides(known), up_to)

    def _waiting(
        self, ranges: Sequence[tuple[str | None, str | None]], up_to: int
    ) -> list[WaitingSubmission]:
        """Waiting submissions whose RowKey is in any of ``ranges`` (None: open), in order."""
        parameters: dict[str, Any] = {"pk": ROOM_PARTITION}
        alternatives = []
        for n, (first, after) in enumerate(ranges):
            terms = []
            if first is not None:
                terms.append(f"RowKey ge @f{n}")
                parameters[f"f{n}"] = first
            if after is not None:
                terms.append(f"RowKey lt @a{n}")
                parameters[f"a{n}"] = after
            alternatives.append(" and ".join(terms))
        # The SDK finds @names between spaces: no parenthesis may touch one.
        keys = (
            ""
            if "" in alternatives
            else " and ( " + " or ".join(f"( {a} )" for a in alternatives) + " )"
        )
        entities = self._live.query_entities(
            f"PartitionKey eq @pk{keys}",
            parameters=parameters,
            results_per_page=min(max(up_to, 1), 1000),
        )
        found: list[WaitingSubmission] = []
        for entity in entities:  # pages are fetched as they are read: no more than needed
            etag = entity.metadata["etag"] or ""  # the service always sends one
            row = WaitingSubmission(entity["RowKey"], entity["OrderID"], _body_of(entity), etag)
            found.append(row)
            if len(found) >= up_to:
                break
        return found

    def drop_waiting(self, waiting: WaitingSubmission) -> bool:
        key = {"PartitionKey": ROOM_PARTITION, "RowKey": waiting.row_key}
        return _delete_if_unchanged(self._live, key, waiting.etag)

    def drop_waiting_all(self, rows: Sequence[WaitingSubmission]) -> int:
        """Deletes conditional on the ETag each row was read with, a hundred to a transaction;
        a row changed or gone since is left out and the rest sent again (as ``rearm_live``)."""
        done = 0
        for start in range(0, len(rows), _MAX_BATCH):
            chunk = [
                ("delete", {"PartitionKey": ROOM_PARTITION, "RowKey": row.row_key},
                 {"etag": row.etag, "match_condition": MatchConditions.IfNotModified})
                for row in rows[start : start + _MAX_BATCH]
            ]  # fmt: skip
            done += len(self._submit_leaving_out_failed(chunk))
        return done

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
        which is sent again without it (the service names the failed operation) until the
        rest go; on a failure that names no operation, the rest of that transaction is given
        up: each marker left is due already, so the next sweep looks at it again.
        Returns how many markers moved or went."""
        writes: list[tuple[LiveMarker, datetime | None]] = [*rearms, *((m, None) for m in drops)]
        done = 0
        for start in range(0, len(writes), _MAX_BATCH):
            done += self._write_markers(writes[start : start + _MAX_BATCH])
        return done

    def _write_markers(self, writes: Sequence[tuple[LiveMarker, datetime | None]]) -> int:
        return len(self._submit_leaving_out_failed([_marker_write(*w) for w in writes]))

    def _submit_leaving_out_failed(
        self, operations: Sequence[tuple[Any, ...]]
    ) -> list[tuple[tuple[Any, ...], Mapping[str, Any]]]:
        """One transaction of conditional ``operations``; one the service names as failed (its
        row changed, went or came since read: its new owner decides) is left out and the rest
        sent again, until they go. Under load many orders finish during a sweep, each changing
        its marker: giving the rest up would have the next sweep read all of those orders again.
        Returns the operations that went, each with its response."""
        chunk = list(operations)
        for _ in range(len(operations)):  # each failure leaves one out: no more tries than that
            try:
                responses = self._live.submit_transaction(chunk)
            except TableTransactionError as exc:
                if exc.status_code not in (404, 409, 412):
                    raise
                index = _named_index(exc)
                if index is None or index >= len(chunk):
                    break
                del chunk[index]  # touched, dropped or made since: its new owner decides
                if not chunk:
                    return []
                continue
            return list(zip(chunk, responses, strict=True))
        log.info("sas.index_writes_left", extra={"count": len(chunk)})
        return []

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
        updated_after: datetime | None = None,
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
            ("updated", "UpdatedAt ge @updated", updated_after and updated_after - _SLACK),
        ):
            if value is not None:
                clauses.append(clause)
                params[name] = value
        entities = self._table.query_entities(
            " and ".join(clauses), parameters=params, results_per_page=1000
        )
        for entity in entities:
            state = state_from(entity)
            finished = state.finished_at
            if (
                (priority is None or state.priority == priority)
                and (submitted_after is None or state.submitted_at >= submitted_after)
                and (submitted_before is None or state.submitted_at < submitted_before)
                and (
                    finished_before is None or (finished is not None and finished < finished_before)
                )
                and (updated_after is None or state.updated_at >= updated_after)
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
        entity.update(_body_chunks(kept))
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
        return _delete_if_unchanged(self._table, entity, entity.metadata["etag"])

    # --- operators' actions -------------------------------------------------------------

    def append_audit(self, entries: Sequence[AuditEntry]) -> None:
        """Inserts, a hundred to a transaction, in the in-flight table (purge never reads it)."""
        rows = [_audit_entity(entry) for entry in entries]
        by_partition: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_partition.setdefault(row["PartitionKey"], []).append(row)
        for partition in by_partition.values():
            for start in range(0, len(partition), _MAX_BATCH):
                chunk = partition[start : start + _MAX_BATCH]
                if len(chunk) == 1:
                    self._live.create_entity(chunk[0])
                else:
                    self._live.submit_transaction([("create", row) for row in chunk])

    def list_audit(self, query: AuditQuery) -> list[AuditEntry]:
        first, after = audit_partition_range()
        clauses = ["PartitionKey ge @first and PartitionKey lt @after"]
        parameters: dict[str, Any] = {"first": first, "after": after}
        wanted = (("Action", query.action), ("Actor", query.actor), ("Target", query.target))
        for name, value in wanted:
            if value is not None:
                clauses.append(f"{name} eq @{name.lower()}")
                parameters[name.lower()] = value
        entities = self._live.query_entities(
            " and ".join(clauses), parameters=parameters, results_per_page=min(query.limit, 1000)
        )
        found: list[AuditEntry] = []
        for entity in entities:  # pages are fetched as they are read: no more than needed
            found.append(_audit_from(entity))
            if len(found) >= query.limit:
                break
        return found

    # --- operator alerts ----------------------------------------------------------------

    def record_alert(self, record: AlertRecord) -> None:
        with contextlib.suppress(ResourceExistsError):  # the same alert sent again
            self._live.create_entity(_alert_entity(record))

    def list_alerts(self) -> list[Versioned[AlertRecord]]:
        entities = self._live.query_entities(
            "PartitionKey eq @pk and Open eq true",
            parameters={"pk": ALERTS_PARTITION},
            results_per_page=1000,
        )
        found = [Versioned(_alert_from(e), str(e.metadata["etag"])) for e in entities]
        return sorted(found, key=lambda v: (v.value.at, v.value.alert_id))

    def get_alert(self, alert_id: str) -> Versioned[AlertRecord] | None:
        try:
            entity = self._live.get_entity(ALERTS_PARTITION, alert_id)
        except ResourceNotFoundError:
            return None
        return Versioned(_alert_from(entity), str(entity.metadata["etag"]))

    def update_alert(self, record: AlertRecord, etag: str) -> str:
        try:
            written = self._live.update_entity(_alert_entity(record), **if_unchanged(etag))
        except (ResourceModifiedError, ResourceNotFoundError) as exc:
            raise ConcurrencyConflict(f"alert {record.alert_id} changed meanwhile") from exc
        return str(written["etag"])

    # --- workflow versions orders wait for ----------------------------------------------

    def get_missing(self, key: str) -> MissingDefinition | None:
        try:
            e = self._live.get_entity(MISSING_PARTITION, key)
        except ResourceNotFoundError:
            return None
        return MissingDefinition(e["RowKey"], e["Reason"], utc(e["Since"]))

    def note_missing(self, missing: MissingDefinition) -> None:
        entity = {
            "PartitionKey": MISSING_PARTITION,
            "RowKey": missing.key,
            "Reason": missing.reason[:1000],
            "Since": missing.since,
        }
        self._live.upsert_entity(entity, mode=UpdateMode.REPLACE)

    def forget_missing(self, key: str) -> None:
        self._live.delete_entity(MISSING_PARTITION, key)  # absent already: no error


def _delete_if_unchanged(table: TableClient, key: Mapping[str, Any], etag: str | None) -> bool:
    """Delete the entity unless it changed since read; False if it did (or is gone). A
    one-operation transaction, not ``delete_entity``, which takes a 404 for success."""
    condition = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
    try:
        table.submit_transaction([("delete", key, condition)])
    except TableTransactionError as exc:
        if exc.status_code in (404, 412):
            return False
        raise
    return True


def _body_chunks(body: bytes) -> dict[str, bytes]:
    """``body`` as properties of at most 60 KiB each (Body00, Body01 …)."""
    return {
        f"Body{index // _BODY_CHUNK:02d}": body[index : index + _BODY_CHUNK]
        for index in range(0, len(body), _BODY_CHUNK)
    }


def _body_of(entity: Mapping[str, Any]) -> bytes:
    chunks = sorted(key for key in entity if key.startswith("Body") and key[4:].isdigit())
    return b"".join(bytes(entity[key]) for key in chunks)


def _parked_from(entity: Mapping[str, Any]) -> ParkedMessage:
    return ParkedMessage(
        id=entity["RowKey"],
        parked_by="app",
        queue=entity["Queue"],
        function=None,  # not stored: the operator knows which function the queue triggers
        reason=entity["Reason"],
        body=_body_of(entity),
        body_truncated=bool(entity["BodyTruncated"]),
        parked_at=utc(entity["At"]),
    )


def _marker_write(marker: LiveMarker, due_at: datetime | None) -> tuple[Any, ...]:
    """A re-arm to ``due_at`` (None: a drop), as a transaction operation conditional on the
    ETag ``marker`` was read with."""
    if due_at is None:
        condition = {"etag": marker.etag, "match_condition": MatchConditions.IfNotModified}
        return ("delete", _marker_key(marker.order_id), condition)
    entity = marker_entity(
        marker.order_id, marker.touched_at, due_at, marker.workflow, finished=marker.finished
    )
    return ("update", entity, if_unchanged(marker.etag))


def _marker_key(order_id: str) -> dict[str, Any]:
    return {"PartitionKey": LIVE_PARTITION, "RowKey": order_id}


def _marker_from(entity: Any) -> LiveMarker:
    touched = utc(entity["TouchedAt"])
    etag, due = str(entity.metadata["etag"]), utc(entity["DueAt"])
    workflow, finished = str(entity.get("Workflow") or ""), bool(entity.get("Finished"))
    return LiveMarker(entity["RowKey"], touched, etag, due, workflow, finished)


def _named_index(error: TableTransactionError) -> int | None:
    """The operation a failed transaction names (its message starts ``<index>:``). The SDK's
    ``index`` is 0 also when the service names none, which would blame the first operation."""
    head, colon, _ = (error.message or "").partition(":")
    return int(head) if colon and head.strip().isdigit() else None


def _alert_entity(record: AlertRecord) -> dict[str, Any]:
    row = {
        "PartitionKey": ALERTS_PARTITION,
        "RowKey": record.alert_id,
        "OrderId": record.order_id,
        "At": record.at,
        "Reason": record.reason[:1000],
        "Workflow": record.workflow or None,
        "Step": record.step or None,
        "Attempt": record.attempt,
        "AcknowledgedBy": record.acknowledged_by,
        "AcknowledgedAt": record.acknowledged_at,
        "Note": record.note,
        "ClearedAt": record.cleared_at,
        "Open": record.is_open,
    }
    return {name: value for name, value in row.items() if value is not None}


def _alert_from(entity: Mapping[str, Any]) -> AlertRecord:
    acknowledged = entity.get("AcknowledgedAt")
    return AlertRecord(
        alert_id=entity["RowKey"],
        order_id=entity["OrderId"],
        at=utc(entity["At"]),
        reason=entity.get("Reason") or "",
        workflow=entity.get("Workflow") or "",
        step=entity.get("Step") or "",
        attempt=int(entity.get("Attempt") or 0),
        acknowledged_by=entity.get("AcknowledgedBy"),
        acknowledged_at=None if acknowledged is None else utc(acknowledged),
        note=entity.get("Note"),
        cleared_at=optional_utc(entity.get("ClearedAt")),
    )


def _audit_entity(entry: AuditEntry) -> dict[str, Any]:
    row = {
        "PartitionKey": audit_partition(entry.at),
        "RowKey": audit_row_key(entry.at, uuid.uuid4().hex[:16]),
        "At": entry.at,
        "Actor": entry.actor[:100],
        "Action": entry.action,
        "Target": entry.target[:300],
        "Reason": (entry.reason or "")[:1000] or None,
        "Detail": (entry.detail or "")[:1000] or None,
    }
    return {name: value for name, value in row.items() if value is not None}


def _audit_from(entity: Mapping[str, Any]) -> AuditEntry:
    return AuditEntry(
        at=utc(entity["At"]),
        actor=entity["Actor"],
        action=entity["Action"],
        target=entity["Target"],
        reason=entity.get("Reason"),
        detail=entity.get("Detail"),
    )

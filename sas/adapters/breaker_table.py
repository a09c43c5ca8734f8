"""Circuit breaker state on Azure Table Storage (azure-data-tables).

Same table as the orders, PartitionKey ``~breaker``, RowKey = the breaker's (agent's) name.
A create is ``create_entity`` (AlreadyExists if another instance created it first); every
update is a REPLACE conditional on the ETag (``MatchConditions.IfNotModified``): without it
the SDK sends ``If-Match: *`` and the last writer wins. Times are tz-aware UTC. The window's
buckets are one string property, ``Window``: JSON ``[[start (ISO 8601), calls, failures], ...]``
(at most ``MAX_BUCKETS`` of them: well under a property's 64 KiB).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, TableErrorCode, UpdateMode

from sas.adapters.tables import optional_utc, utc
from sas.domain.breaker import BreakerState, BreakerStatus, Tally
from sas.domain.errors import AlreadyExists, ConcurrencyConflict, NotFound
from sas.domain.model import Versioned
from sas.domain.wire import BREAKER_PARTITION

_FORBIDDEN_IN_KEYS = frozenset("/\\#?")


class TableBreakerStore:
    def __init__(self, table: TableClient) -> None:
        self._table = table

    def get(self, name: str) -> Versioned[BreakerState] | None:
        try:
            entity = self._table.get_entity(BREAKER_PARTITION, _row_key(name))
        except ResourceNotFoundError as exc:
            if _table_missing(exc):
                raise NotFound(f"table {self._table.table_name} does not exist") from None
            return None
        etag = entity.metadata["etag"]
        if not etag:
            raise ValueError(f"breaker {name} read without an ETag")
        return Versioned(_state_from(entity), etag)

    def put(self, state: BreakerState, etag: str | None) -> str:
        entity = _entity(state)
        try:
            if etag is None:
                metadata = self._table.create_entity(entity)
            else:
                metadata = self._table.update_entity(
                    entity,
                    mode=UpdateMode.REPLACE,
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                )
        except ResourceExistsError:
            raise AlreadyExists(f"breaker {state.name} exists") from None
        except ResourceModifiedError:
            raise ConcurrencyConflict(f"breaker {state.name} changed since read") from None
        except ResourceNotFoundError as exc:
            if etag is None or _table_missing(exc):
                raise NotFound(f"table {self._table.table_name} does not exist") from None
            # Deleted since read (an operator reset it): a lost race, re-read and re-apply.
            raise ConcurrencyConflict(f"breaker {state.name} deleted since read") from None
        new_etag: str = metadata["etag"]
        return new_etag


def _row_key(name: str) -> str:
    if not name or any(c in _FORBIDDEN_IN_KEYS or ord(c) < 0x20 for c in name):
        raise ValueError(f"invalid breaker name {name!r}")
    return name


def _table_missing(exc: ResourceNotFoundError) -> bool:
    code = getattr(exc, "error_code", None)
    return code == TableErrorCode.TABLE_NOT_FOUND or "TableNotFound" in str(exc)


def _entity(state: BreakerState) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": BREAKER_PARTITION,
        "RowKey": _row_key(state.name),
        "Status": state.status.value,
        "Window": _window_text(state.window),
        # Read by hosts of the release before windows, which a rolling deploy runs beside.
        "ConsecutiveFailures": sum(tally.failures for tally in state.window),
        "OpenedUntil": state.opened_until,
        "ProbeUntil": state.probe_until,
        "ProbeOwner": state.probe_owner,
        "UpdatedAt": state.updated_at,
    }
    # REPLACE drops properties that are absent, which is how a field is cleared.
    return {key: value for key, value in entity.items() if value is not None}


def _state_from(entity: Mapping[str, Any]) -> BreakerState:
    return BreakerState(
        name=entity["RowKey"],
        status=BreakerStatus(entity["Status"]),
        window=_window_from(entity.get("Window")),
        opened_until=optional_utc(entity.get("OpenedUntil")),
        probe_until=optional_utc(entity.get("ProbeUntil")),
        probe_owner=entity.get("ProbeOwner"),
        updated_at=utc(entity["UpdatedAt"]),
    )


def _window_text(window: tuple[Tally, ...]) -> str | None:
    if not window:
        return None
    rows = [[tally.start.isoformat(), tally.calls, tally.failures] for tally in window]
    return json.dumps(rows, separators=(",", ":"))


def _window_from(text: object) -> tuple[Tally, ...]:
    if text is None:
        return ()
    rows = json.loads(str(text))
    return tuple(
        Tally(utc(datetime.fromisoformat(start)), int(calls), int(failures))
        for start, calls, failures in rows
    )

"""The tables a Python agent declares (``PythonAgent.tables``), in memory: what
``sas.actions.app_table`` gives an action that ``Harness`` runs.

``InMemoryTable`` has the part of ``azure.data.tables.TableClient`` an action keeps its effects
with (``create_entity``, ``upsert_entity``, ``update_entity``, ``delete_entity``,
``get_entity``, ``query_entities``, ``list_entities``), with the service's answers: a second
create of a row raises ``ResourceExistsError``; reading, or updating, a row that is not there
``ResourceNotFoundError``; a write conditional on an ETag that changed ``ResourceModifiedError``
(``etag=..., match_condition=MatchConditions.IfNotModified``); a delete of a row that is not
there does nothing (as the SDK's does). Rows come back as ``TableEntity`` with their ETag and
timestamp, in key order. tests/integration/test_app_tables.py runs the same checks on Azurite.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Any
from uuid import UUID

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import EntityMetadata, EntityProperty, TableEntity, UpdateMode

from sas.domain.clock import Clock
from sas.domain.errors import ConfigurationError
from sas.testing.table_filter import compile_filter

_FORBIDDEN_IN_KEYS = re.compile(r"[/\\#?\x00-\x1f\x7f-\x9f]")
MAX_KEY_CHARS = 512
"""A key's limit (1 KiB of UTF-16)."""
MAX_PROPERTIES = 252
"""Besides PartitionKey, RowKey and Timestamp."""
_INT32 = range(-(2**31), 2**31)
_STORABLE = (str, int, float, bytes, datetime, UUID, EntityProperty)


class _Row(TableEntity):
    """A row as the SDK returns it: the properties, and ``metadata`` (ETag, timestamp)."""

    def __init__(self, values: Mapping[str, Any], etag: str, timestamp: datetime) -> None:
        super().__init__(copy.deepcopy(dict(values)))
        self.etag = etag
        self.timestamp = timestamp

    @property
    def metadata(self) -> EntityMetadata:
        return {"etag": self.etag, "timestamp": self.timestamp}

    def copy_of(self, select: str | list[str] | None = None) -> _Row:
        """A copy for a caller (``select``: only those properties)."""
        if select is None:
            return _Row(self, self.etag, self.timestamp)
        names = select.split(",") if isinstance(select, str) else select
        wanted = {name.strip() for name in names}
        picked = {name: value for name, value in self.items() if name in wanted}
        return _Row(picked, self.etag, self.timestamp)


def _failure(kind: type[HttpResponseError], status: int, message: str) -> HttpResponseError:
    error = kind(message=message)
    error.status_code = status
    return error


class InMemoryTable:
    """One table, its rows by (PartitionKey, RowKey)."""

    def __init__(self, table_name: str, clock: Clock | None = None) -> None:
        self.table_name = table_name
        self._clock = clock
        self._rows: dict[tuple[str, str], _Row] = {}
        self._versions = itertools.count(1)

    # --- writes ----------------------------------------------------------------------------

    def create_entity(self, entity: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        key = _key(entity)
        if key in self._rows:
            raise _failure(ResourceExistsError, 409, f"EntityAlreadyExists: {key}")
        return self._write(key, _properties(entity))

    def upsert_entity(
        self, entity: Mapping[str, Any], mode: UpdateMode = UpdateMode.MERGE, **kwargs: Any
    ) -> dict[str, Any]:
        key = _key(entity)
        return self._write(key, self._merged(key, entity, mode))

    def update_entity(
        self,
        entity: Mapping[str, Any],
        mode: UpdateMode = UpdateMode.MERGE,
        *,
        etag: str | None = None,
        match_condition: MatchConditions | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        key = _key(entity)
        self._existing(key, _condition(entity, etag, match_condition))
        return self._write(key, self._merged(key, entity, mode))

    def delete_entity(self, *args: Any, **kwargs: Any) -> None:
        """``delete_entity(partition_key, row_key)`` or ``delete_entity(entity)``, with
        ``etag`` and ``match_condition`` as the SDK takes them."""
        entity = kwargs.get("entity", args[0] if args else None)
        if isinstance(entity, Mapping):
            key = _key(entity)
        else:
            entity = None
            given = iter(args)
            partition = kwargs.get("partition_key")
            partition = next(given) if partition is None else partition
            row = kwargs.get("row_key")
            key = (partition, next(given) if row is None else row)
        condition = _condition(entity, kwargs.get("etag"), kwargs.get("match_condition"))
        if key in self._rows:
            self._existing(key, condition)
            del self._rows[key]

    # --- reads -----------------------------------------------------------------------------

    def get_entity(
        self,
        partition_key: str,
        row_key: str,
        *,
        select: str | list[str] | None = None,
        **kwargs: Any,
    ) -> TableEntity:
        return self._existing((partition_key, row_key), None).copy_of(select)

    def query_entities(
        self,
        query_filter: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        select: str | list[str] | None = None,
        results_per_page: int | None = None,
        **kwargs: Any,
    ) -> Iterator[TableEntity]:
        matches = compile_filter(query_filter, parameters)
        return self._listed(matches, select)

    def list_entities(
        self,
        *,
        select: str | list[str] | None = None,
        results_per_page: int | None = None,
        **kwargs: Any,
    ) -> Iterator[TableEntity]:
        return self._listed(lambda entity: True, select)

    # --- how -------------------------------------------------------------------------------

    def _listed(
        self, matches: Callable[[Mapping[str, Any]], bool], select: str | list[str] | None
    ) -> Iterator[TableEntity]:
        found = [row for key, row in sorted(self._rows.items()) if matches(row)]
        return iter([row.copy_of(select) for row in found])

    def _existing(self, key: tuple[str, str], etag: str | None) -> _Row:
        found = self._rows.get(key)
        if found is None:
            raise _failure(ResourceNotFoundError, 404, f"ResourceNotFound: {key}")
        if etag is not None and found.etag != etag:
            raise _failure(ResourceModifiedError, 412, f"UpdateConditionNotSatisfied: {key}")
        return found

    def _merged(
        self, key: tuple[str, str], entity: Mapping[str, Any], mode: UpdateMode
    ) -> dict[str, Any]:
        given = _properties(entity)
        before = self._rows.get(key)
        if mode == UpdateMode.MERGE and before is not None:
            return {**before, **given}
        return given

    def _write(self, key: tuple[str, str], values: dict[str, Any]) -> dict[str, Any]:
        if len(values) - 2 > MAX_PROPERTIES:
            raise _failure(HttpResponseError, 400, f"TooManyProperties: {len(values) - 2}")
        now = self._clock.now() if self._clock is not None else datetime.now(UTC)
        etag = f"W/\"datetime'{now.isoformat()}'-{next(self._versions)}\""
        self._rows[key] = _Row(values, etag, now)
        return {"etag": etag, "date": now}


class InMemoryTables:
    """Every table of ``names`` (a registry's ``tables``), each empty at first."""

    def __init__(self, names: Iterable[str], clock: Clock | None = None) -> None:
        self._clock = clock
        self.tables: dict[str, InMemoryTable] = {}
        self.declare(names)

    def declare(self, names: Iterable[str]) -> None:
        """Tables a newer registry declares too (those there already keep their rows)."""
        for name in names:
            self.tables.setdefault(name.lower(), InMemoryTable(name, self._clock))

    def __call__(self, name: str) -> InMemoryTable:
        """The table ``app_table(name)`` gives; ConfigurationError for one no agent declares,
        as in the app."""
        found = self.tables.get(name.lower())
        if found is None:
            raise ConfigurationError(f"table {name!r}: no Python agent declares it")
        return found

    def __getitem__(self, name: str) -> InMemoryTable:
        return self(name)


def _key(entity: Mapping[str, Any]) -> tuple[str, str]:
    keys = (entity.get("PartitionKey"), entity.get("RowKey"))
    for name, value in zip(("PartitionKey", "RowKey"), keys, strict=True):
        if not isinstance(value, str):
            raise TypeError("PartitionKey or RowKey must be of type string.")
        if len(value) > MAX_KEY_CHARS or _FORBIDDEN_IN_KEYS.search(value):
            raise _failure(HttpResponseError, 400, f"InvalidInput: {name} {value!r}")
    return keys[0], keys[1]  # type: ignore[return-value]


def _properties(entity: Mapping[str, Any]) -> dict[str, Any]:
    """What the service stores: None values left out, an enum as its text, a typed value
    (``EntityProperty``) as it is; TypeError for a value the SDK cannot send, as it raises."""
    stored: dict[str, Any] = {}
    for name, value in entity.items():
        if value is None or name == "Timestamp":
            continue
        if isinstance(value, Enum):
            value = str(value)
        if not isinstance(value, _STORABLE):
            raise TypeError(f"Type not supported when sending data to the service: {type(value)}.")
        if isinstance(value, int) and not isinstance(value, bool) and value not in _INT32:
            raise TypeError(f"{value} is too large to be cast to type Edm.Int32.")
        stored[name] = value
    return stored


def _condition(
    entity: Mapping[str, Any] | None, etag: str | None, match_condition: MatchConditions | None
) -> str | None:
    """The ETag a write must find, as the SDK reads its arguments (None: unconditional)."""
    if match_condition in (None, MatchConditions.Unconditionally):
        if etag:
            raise ValueError("Etag is not supported for an Unconditional operation.")
        return None
    if match_condition != MatchConditions.IfNotModified:
        raise ValueError(f"Unsupported match condition: {match_condition}")
    if etag is None and isinstance(entity, TableEntity):
        etag = entity.metadata.get("etag")
    if not etag:
        raise ValueError("IfNotModified must be specified with etag.")
    return etag

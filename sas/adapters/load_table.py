"""Measurement rows on Table Storage: each process's calls in flight per remote endpoint
(PartitionKey ``~load``, RowKey = ``load_row_key(target, instance)``), and each Supervisor
process's retries held back (``~budget``, RowKey = ``instance_row_key(instance)``).

In the in-flight table (small, so the read is cheap even on Azurite, which scans a table for
any query). Each row has exactly one writer, the process it names, and holds a measurement
rather than state: it is upserted unconditionally (last write wins by design) and readers
ignore rows that are stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from azure.core.exceptions import HttpResponseError
from azure.data.tables import TableClient, UpdateMode

from sas.adapters.tables import utc
from sas.domain.endpoints import EndpointLoad, HeldRetries
from sas.domain.errors import NotFound
from sas.domain.wire import BUDGET_PARTITION, LOAD_PARTITION, instance_row_key, load_row_key


class TableLoadStore:
    def __init__(self, table: TableClient) -> None:
        self._table = table

    def publish(self, instance_id: str, counts: Mapping[str, int], at: datetime) -> None:
        operations = [
            (
                "upsert",
                {
                    "PartitionKey": LOAD_PARTITION,
                    "RowKey": load_row_key(target, instance_id),
                    "Target": target,
                    "Instance": instance_id,
                    "InFlight": count,
                    "At": at,
                },
                {"mode": UpdateMode.REPLACE},
            )
            for target, count in sorted(counts.items())
        ]
        for start in range(0, len(operations), 100):  # a transaction holds at most 100
            with _table_exists(self._table):
                self._table.submit_transaction(operations[start : start + 100])

    def read(self) -> list[EndpointLoad]:
        rows = _rows(self._table, LOAD_PARTITION, ["Target", "Instance", "InFlight", "At"])
        return [
            EndpointLoad(
                target=str(row["Target"]),
                instance_id=str(row["Instance"]),
                in_flight=int(row["InFlight"]),
                at=utc(row["At"]),
            )
            for row in rows
        ]


class TableBudgetStore:
    def __init__(self, table: TableClient) -> None:
        self._table = table

    def publish(self, held: HeldRetries) -> None:
        row = {
            "PartitionKey": BUDGET_PARTITION,
            "RowKey": instance_row_key(held.instance_id),
            "Instance": held.instance_id,
            "HeldBack": held.held_back,
            "At": held.at,
        }
        with _table_exists(self._table):
            self._table.upsert_entity(row, mode=UpdateMode.REPLACE)

    def read(self) -> list[HeldRetries]:
        rows = _rows(self._table, BUDGET_PARTITION, ["Instance", "HeldBack", "At"])
        return [
            HeldRetries(str(row["Instance"]), int(row["HeldBack"]), utc(row["At"])) for row in rows
        ]


@contextmanager
def _table_exists(table: TableClient) -> Iterator[None]:
    """A write to a table that is not there is NotFound (the app was not provisioned)."""
    try:
        yield
    except HttpResponseError as exc:
        if exc.status_code == 404:
            raise NotFound(f"table {table.table_name} does not exist") from None
        raise


def _rows(table: TableClient, partition: str, select: list[str]) -> Iterable[dict[str, Any]]:
    return table.query_entities(
        "PartitionKey eq @partition", parameters={"partition": partition}, select=select
    )

"""What an app's table answers, each check a function of a table client: run on
``sas.testing.InMemoryTable`` (tests/unit/test_memory_tables.py) and on Azurite's TableClient
(tests/integration/test_app_tables.py), so the harness's tables answer as Table Storage does."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import UpdateMode

Check = Callable[[Any], None]
CHECKS: dict[str, Check] = {}


def check(function: Check) -> Check:
    CHECKS[function.__name__] = function
    return function


def row(partition: str, key: str, **values: Any) -> dict[str, Any]:
    return {"PartitionKey": partition, "RowKey": key, **values}


def props(entity: Any) -> dict[str, Any]:
    return {name: value for name, value in entity.items() if name not in ("Timestamp",)}


@check
def a_created_row_reads_back_with_its_etag(table: Any) -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    written = table.create_entity(row("p", "a", Text="x", Count=3, Share=0.5, Ok=True, At=at))
    found = table.get_entity("p", "a")
    assert props(found) == row("p", "a", Text="x", Count=3, Share=0.5, Ok=True, At=at)
    assert found.metadata["etag"] == written["etag"]


@check
def a_second_create_of_a_row_conflicts_and_changes_nothing(table: Any) -> None:
    table.create_entity(row("p", "a", Text="first"))
    with pytest.raises(ResourceExistsError):
        table.create_entity(row("p", "a", Text="second"))
    assert table.get_entity("p", "a")["Text"] == "first"


@check
def a_missing_row_is_not_found_to_read_or_update(table: Any) -> None:
    with pytest.raises(ResourceNotFoundError):
        table.get_entity("p", "nothing")
    for mode in (UpdateMode.MERGE, UpdateMode.REPLACE):
        with pytest.raises(ResourceNotFoundError):
            table.update_entity(row("p", "nothing", Text="x"), mode=mode)
    assert list(table.list_entities()) == []


@check
def merge_keeps_other_properties_and_replace_drops_them(table: Any) -> None:
    table.create_entity(row("p", "a", Text="x", Count=1))
    table.update_entity(row("p", "a", Count=2), mode=UpdateMode.MERGE)
    assert props(table.get_entity("p", "a")) == row("p", "a", Text="x", Count=2)
    table.update_entity(row("p", "a", Count=3), mode=UpdateMode.REPLACE)
    assert props(table.get_entity("p", "a")) == row("p", "a", Count=3)


@check
def upsert_creates_then_merges_or_replaces(table: Any) -> None:
    table.upsert_entity(row("p", "a", Text="x"))
    table.upsert_entity(row("p", "a", Count=1))  # MERGE by default
    assert props(table.get_entity("p", "a")) == row("p", "a", Text="x", Count=1)
    table.upsert_entity(row("p", "a", Count=2), mode=UpdateMode.REPLACE)
    assert props(table.get_entity("p", "a")) == row("p", "a", Count=2)


@check
def a_write_conditional_on_a_changed_etag_is_refused(table: Any) -> None:
    first = table.create_entity(row("p", "a", Count=1))["etag"]
    second = table.update_entity(
        row("p", "a", Count=2), etag=first, match_condition=MatchConditions.IfNotModified
    )["etag"]
    assert second != first
    with pytest.raises(ResourceModifiedError):
        table.update_entity(
            row("p", "a", Count=9), etag=first, match_condition=MatchConditions.IfNotModified
        )
    with pytest.raises(ResourceModifiedError):
        table.delete_entity("p", "a", etag=first, match_condition=MatchConditions.IfNotModified)
    read = table.get_entity("p", "a")
    assert read["Count"] == 2
    read["Count"] = 3  # the etag read with the row is the condition
    table.update_entity(read, match_condition=MatchConditions.IfNotModified)
    assert table.get_entity("p", "a")["Count"] == 3


@check
def a_delete_removes_the_row_and_a_missing_one_is_no_error(table: Any) -> None:
    table.create_entity(row("p", "a"))
    table.create_entity(row("p", "b"))
    table.delete_entity("p", "a")
    table.delete_entity(row("p", "b"))
    table.delete_entity("p", "a")  # gone already: nothing happens
    with pytest.raises(ResourceNotFoundError):
        table.get_entity("p", "a")
    assert list(table.list_entities()) == []


@check
def a_query_matches_with_its_parameters_in_key_order(table: Any) -> None:
    for partition, key, count in [("q", "c", 3), ("p", "b", 2), ("p", "a", 1), ("p", "d", 4)]:
        table.create_entity(row(partition, key, Count=count, Name=f"n'{key}"))
    table.create_entity(row("p", "e", Name="no count"))

    def keys(query: str, **parameters: Any) -> list[tuple[str, str]]:
        found = table.query_entities(query, parameters=parameters)
        return [(entity["PartitionKey"], entity["RowKey"]) for entity in found]

    assert keys("PartitionKey eq @pk", pk="p") == [("p", "a"), ("p", "b"), ("p", "d"), ("p", "e")]
    assert keys("PartitionKey eq 'p' and Count gt 1") == [("p", "b"), ("p", "d")]
    assert keys("Count le 1 or RowKey eq 'c'") == [("p", "a"), ("q", "c")]
    assert keys("(Count ge 2 and Count lt 4) and not (RowKey eq 'b')") == [("q", "c")]
    assert keys("Name eq @name", name="n'd") == [("p", "d")]
    assert keys("Name eq 'n''a'") == [("p", "a")]
    assert keys("Count ne 2") == [("p", "a"), ("p", "d"), ("q", "c")]  # no Count: no match
    listed = [(entity["PartitionKey"], entity["RowKey"]) for entity in table.list_entities()]
    assert listed == [("p", "a"), ("p", "b"), ("p", "d"), ("p", "e"), ("q", "c")]


@check
def none_is_not_stored_and_select_picks_properties(table: Any) -> None:
    table.create_entity(row("p", "a", Text="x", Count=1, Gone=None))
    assert "Gone" not in table.get_entity("p", "a")
    picked = table.get_entity("p", "a", select=["Text"])
    assert props(picked) == {"Text": "x"}
    (queried,) = table.query_entities("RowKey eq 'a'", select="Count")
    assert props(queried) == {"Count": 1}


@check
def a_returned_row_is_a_copy(table: Any) -> None:
    table.create_entity(row("p", "a", Text="x"))
    read = table.get_entity("p", "a")
    read["Text"] = "changed"
    assert table.get_entity("p", "a")["Text"] == "x"

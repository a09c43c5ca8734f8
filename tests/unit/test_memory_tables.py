"""The harness's tables (``sas.testing.InMemoryTable``) answer as Table Storage does: each check
of tests/table_checks.py, which tests/integration/test_app_tables.py runs on Azurite too."""

from __future__ import annotations

from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError

from sas.domain.errors import ConfigurationError
from sas.testing import FakeClock, InMemoryTable, InMemoryTables
from tests.table_checks import CHECKS, row

pytestmark = [pytest.mark.unit, pytest.mark.fast]


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_in_memory_table_answers_as_table_storage(name: str) -> None:
    CHECKS[name](InMemoryTable("effects", FakeClock()))


@pytest.mark.parametrize(
    ("entity", "error"),
    [
        (row("p/q", "a"), HttpResponseError),
        (row("p", "a#b"), HttpResponseError),
        (row("p", "x" * 600), HttpResponseError),
        ({"PartitionKey": "p", "RowKey": 1}, TypeError),
        (row("p", "a", Big=2**40), TypeError),
        (row("p", "a", Thing=object()), TypeError),
    ],
    ids=["slash-in-key", "hash-in-key", "long-key", "key-not-text", "int64-untyped", "object"],
)
def test_what_the_service_or_the_sdk_refuses_is_refused_and_stores_nothing(
    entity: dict[str, Any], error: type[Exception]
) -> None:
    table = InMemoryTable("effects")
    with pytest.raises(error):
        table.create_entity(entity)
    assert list(table.list_entities()) == []


@pytest.mark.parametrize(
    "query", ["PartitionKey eq", "Count gt 'a' and", "(RowKey eq 'a'", "Count like 1", "@x eq 1"]
)
def test_a_filter_it_cannot_read_is_a_value_error_naming_it(query: str) -> None:
    with pytest.raises(ValueError, match="filter"):
        list(InMemoryTable("effects").query_entities(query))


def test_tables_are_those_declared_by_name_in_any_case() -> None:
    tables = InMemoryTables(("Cards",))
    tables("cards").create_entity(row("p", "a"))
    assert [e["RowKey"] for e in tables["CARDS"].list_entities()] == ["a"]
    with pytest.raises(ConfigurationError, match="table 'stamps': no Python agent declares it"):
        tables("stamps")

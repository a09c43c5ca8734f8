"""Entity-group transactions through the app's table clients start no threads (see
sas/adapters/multipart.py), and behave as the SDK's own: the same results, the same errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.pipeline._base import Pipeline
from azure.core.rest import _helpers, _http_response_impl
from azure.data.tables import TableTransactionError, UpdateMode

from sas.adapters import clients, multipart
from sas.settings import Connection
from sas_local.azurite import Azurite

pytestmark = pytest.mark.integration


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of every thread started while the test runs."""
    names: list[str] = []
    original = threading.Thread.start

    def record(self: threading.Thread) -> None:
        names.append(self.name)
        original(self)

    monkeypatch.setattr(threading.Thread, "start", record)
    yield names


def app_table(azurite: Azurite, name: str) -> Any:
    connection = Connection(setting="SasStorage", connection_string=azurite.connection_string)
    return clients.table_client(connection, name)


def test_a_transaction_starts_no_thread_and_returns_what_the_sdk_returns(azurite, table, started):
    client = app_table(azurite, table.table_name)
    results = client.submit_transaction(
        [
            ("create", {"PartitionKey": "o1", "RowKey": "a", "N": 1}),
            ("upsert", {"PartitionKey": "o1", "RowKey": "b", "N": 2}),
            (
                "upsert",
                {"PartitionKey": "o1", "RowKey": "c", "Text": "é€"},
                {"mode": UpdateMode.REPLACE},
            ),
        ]
    )
    assert started == []
    assert [sorted(r) for r in results] == [["etag"], ["etag"], ["etag"]]
    stored = {e["RowKey"]: e for e in table.query_entities("PartitionKey eq 'o1'")}
    assert [stored[k].get("N") for k in "abc"] == [1, 2, None]
    assert stored["c"]["Text"] == "é€"
    assert results[0]["etag"] == stored["a"].metadata["etag"]


def test_a_failed_transaction_raises_the_sdks_error_and_writes_nothing(azurite, table, started):
    client = app_table(azurite, table.table_name)
    table.create_entity({"PartitionKey": "o2", "RowKey": "taken"})
    with pytest.raises(TableTransactionError) as failure:
        client.submit_transaction(
            [
                ("create", {"PartitionKey": "o2", "RowKey": "new"}),
                ("create", {"PartitionKey": "o2", "RowKey": "taken"}),
            ]
        )
    assert started == []
    assert "EntityAlreadyExists" in str(failure.value)
    assert "1:" in str(failure.value)  # the index of the failed operation, as the SDK reports it
    assert [e["RowKey"] for e in table.query_entities("PartitionKey eq 'o2'")] == ["taken"]


def test_unrecognised_sdk_helpers_are_left_alone(monkeypatch, caplog):
    def elsewhere(request: Any) -> None:
        return None

    monkeypatch.setattr(multipart, "_installed", None)
    monkeypatch.setattr(Pipeline, "_prepare_multipart_mixed_request", staticmethod(elsewhere))
    assert multipart.install() is False
    assert Pipeline.__dict__["_prepare_multipart_mixed_request"].__func__ is elsewhere
    assert "sas.sdk_multipart_kept" in caplog.text


@pytest.fixture
def both_readers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Any], list[Any]]]:
    """Every transaction response read by this module's reader and by the SDK's, side by side."""
    assert multipart.install()
    seen: list[tuple[list[Any], list[Any]]] = []

    def compare(response: Any, http_response_type: Any = None) -> list[Any]:
        ours = multipart.raw_parts(response, http_response_type)
        seen.append((ours, list(multipart._sdk_raw_parts(response, http_response_type))))
        return ours

    monkeypatch.setattr(_http_response_impl, "_get_raw_parts_helper", compare)
    return seen


def _described(parts: list[Any]) -> list[tuple[Any, ...]]:
    return [(p.status_code, p.reason, dict(p.headers), p.request.method, p.read()) for p in parts]


def test_the_reader_reads_every_response_as_the_sdk_does(azurite, table, both_readers):
    client = app_table(azurite, table.table_name)
    client.submit_transaction(
        [
            ("create", {"PartitionKey": "o3", "RowKey": f"r{n:03d}", "Text": "é€\n"})
            for n in range(100)
        ]
    )
    client.submit_transaction(
        [
            ("delete", {"PartitionKey": "o3", "RowKey": "r000"}),
            ("upsert", {"PartitionKey": "o3", "RowKey": "r001"}),
        ]
    )
    with pytest.raises(TableTransactionError):
        client.submit_transaction(
            [
                ("create", {"PartitionKey": "o3", "RowKey": "new"}),
                ("create", {"PartitionKey": "o3", "RowKey": "r002"}),
            ]
        )
    assert [len(ours) for ours, _ in both_readers] == [100, 2, 1]
    for ours, theirs in both_readers:
        assert _described(ours) == _described(theirs)


def test_the_writer_is_installed_only_because_it_writes_what_the_sdk_writes() -> None:
    assert multipart.install()
    assert vars(_helpers)["_prepare_multipart_body_helper"] is multipart.multipart_body
    assert multipart._same_body_as_the_sdk()

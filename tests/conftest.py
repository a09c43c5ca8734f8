"""Shared fixtures. Azurite is started once per session, only if a test asks for it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.data.tables import TableClient, TableServiceClient
from azure.storage.queue import QueueServiceClient

from sas.domain.wire import live_table_name
from sas_local.azurite import Azurite


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    with Azurite.start() as running:
        yield running


@pytest.fixture
def table(azurite: Azurite) -> Iterator[TableClient]:
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    name = f"t{uuid.uuid4().hex[:16]}"
    client = service.create_table(name)
    service.create_table(live_table_name(name))  # the in-flight table that goes with it
    yield client
    service.delete_table(name)
    service.delete_table(live_table_name(name))


@pytest.fixture
def queue_service(azurite: Azurite) -> QueueServiceClient:
    return QueueServiceClient.from_connection_string(azurite.connection_string)


def unique_queue(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def app_env(
    azurite: Azurite, table: TableClient, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Settings for the app's bootstrap: Storage Queues and this test's table on Azurite."""
    from sas import bootstrap, settings
    from sas_local.provision import provision
    from tests.instances import TEST_WORKFLOWS

    monkeypatch.setenv(settings.TRANSPORT, "storage")
    monkeypatch.setenv(settings.STORAGE_CONNECTION, azurite.connection_string)
    monkeypatch.setenv(settings.TABLE_NAME, table.table_name)
    for agent in ("inventory", "payment", "shipping"):
        monkeypatch.setenv(settings.remote_url_setting(agent), "http://127.0.0.1:9")
    # The workflows the tests' instances run, test-added ones included (tests/instances.py).
    monkeypatch.setattr(bootstrap, "workflows", lambda: TEST_WORKFLOWS)
    bootstrap.reset()
    provision(bootstrap.settings())
    # The queues are shared by every test of the session: start each test with them empty.
    queues = QueueServiceClient.from_connection_string(azurite.connection_string)
    for name in bootstrap.settings().queues.values():
        queues.get_queue_client(name).clear_messages()
    yield
    bootstrap.reset()

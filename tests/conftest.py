"""Shared fixtures. Azurite is started once per session, only if a test asks for it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.data.tables import TableClient, TableServiceClient
from azure.storage.queue import QueueServiceClient

from sas.devtools.azurite import Azurite


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    with Azurite.start() as running:
        yield running


@pytest.fixture
def table(azurite: Azurite) -> Iterator[TableClient]:
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    name = f"t{uuid.uuid4().hex[:16]}"
    client = service.create_table(name)
    yield client
    service.delete_table(name)


@pytest.fixture
def queue_service(azurite: Azurite) -> QueueServiceClient:
    return QueueServiceClient.from_connection_string(azurite.connection_string)


def unique_queue(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"

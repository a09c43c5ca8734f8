"""Azure Storage clients from a resolved Connection: connection string or managed identity."""

from __future__ import annotations

from azure.core.credentials import TokenCredential
from azure.data.tables import TableClient, TableServiceClient
from azure.storage.queue import QueueServiceClient

from sas.domain.errors import ConfigurationError
from sas.settings import Connection


def credential(connection: Connection) -> TokenCredential:
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    if connection.client_id:
        return ManagedIdentityCredential(client_id=connection.client_id)
    return DefaultAzureCredential()


def table_service_client(connection: Connection) -> TableServiceClient:
    if connection.connection_string:
        return TableServiceClient.from_connection_string(connection.connection_string)
    if connection.table_uri is None:
        raise ConfigurationError(f"{connection.setting}: no table endpoint")
    return TableServiceClient(endpoint=connection.table_uri, credential=credential(connection))


def table_client(connection: Connection, table_name: str) -> TableClient:
    return table_service_client(connection).get_table_client(table_name)


def queue_service_client(connection: Connection) -> QueueServiceClient:
    if connection.connection_string:
        return QueueServiceClient.from_connection_string(connection.connection_string)
    if connection.queue_uri is None:
        raise ConfigurationError(f"{connection.setting}: no queue endpoint")
    return QueueServiceClient(account_url=connection.queue_uri, credential=credential(connection))

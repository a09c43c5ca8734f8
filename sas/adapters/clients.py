"""Azure Storage clients from a resolved Connection: connection string or Entra identity.

The credential follows the Functions convention for identity-based connections, the same rule
the host applies to its triggers: ``<Conn>__credential=managedidentity`` means
ManagedIdentityCredential (user-assigned when ``<Conn>__clientId`` is set, else system-assigned);
no ``__credential`` means DefaultAzureCredential (az login, environment, ...).
"""

from __future__ import annotations

from typing import Any

from azure.core.credentials import TokenCredential
from azure.data.tables import TableClient, TableServiceClient
from azure.storage.queue import ExponentialRetry, QueueServiceClient

from sas.domain.errors import ConfigurationError
from sas.settings import Connection


def check_identity(connection: Connection) -> None:
    """Refuse a client id that no ``__credential=managedidentity`` asks for (see settings)."""
    if connection.client_id and connection.credential != "managedidentity":
        raise ConfigurationError(
            f"{connection.setting}__clientId is set without "
            f"{connection.setting}__credential=managedidentity"
        )


def credential(connection: Connection) -> TokenCredential:
    """The token credential of an identity-based connection (see the module docstring)."""
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    check_identity(connection)
    if connection.credential == "managedidentity":
        return ManagedIdentityCredential(client_id=connection.client_id or None)
    return DefaultAzureCredential()


def table_service_client(connection: Connection) -> TableServiceClient:
    if connection.connection_string:
        return TableServiceClient.from_connection_string(connection.connection_string)
    if connection.table_uri is None:
        raise ConfigurationError(f"{connection.setting}: no table endpoint")
    return TableServiceClient(endpoint=connection.table_uri, credential=credential(connection))


def table_client(connection: Connection, table_name: str) -> TableClient:
    return table_service_client(connection).get_table_client(table_name)


def bounded_queue_options() -> dict[str, Any]:
    """Keep one Storage Queue call, retries included, under about 36 s.

    The SDK's defaults (read timeout 60 s, 3 retries backing off from 15 s) let a single send
    run for minutes; a send that outlives the alert lease (``consequences.ALERT_LEASE``, minus
    twice the clock-skew allowance) could land after another instance re-sent the alert. Each
    try: 3 s to connect, 7 s per read; two retries after about 1 s and 3 s (jitter 1 s)."""
    return {
        "connection_timeout": 3,
        "read_timeout": 7,
        "retry_policy": ExponentialRetry(
            initial_backoff=1, increment_base=2, retry_total=2, random_jitter_range=1
        ),
    }


def queue_service_client(connection: Connection) -> QueueServiceClient:
    if connection.connection_string:
        return QueueServiceClient.from_connection_string(
            connection.connection_string, **bounded_queue_options()
        )
    if connection.queue_uri is None:
        raise ConfigurationError(f"{connection.setting}: no queue endpoint")
    return QueueServiceClient(
        account_url=connection.queue_uri,
        credential=credential(connection),
        **bounded_queue_options(),
    )

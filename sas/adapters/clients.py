"""Azure Storage clients from a resolved Connection: connection string or Entra identity.

The credential follows the Functions convention for identity-based connections, the same rule
the host applies to its triggers: ``<Conn>__credential=managedidentity`` means
ManagedIdentityCredential (user-assigned when ``<Conn>__clientId`` is set, else system-assigned);
no ``__credential`` means DefaultAzureCredential (az login, environment, ...).

Every Table and Queue client of a process sends over one ``requests.Session``
(:func:`http_session`): one connection pool per storage endpoint, kept at
:data:`POOL_MAXSIZE` connections, shared by all threads. The SDK's default is a session per
client with 10 pooled connections per endpoint; with more threads than that calling at once,
each call past the tenth opened a connection and threw it away afterwards (urllib3's
"Connection pool is full, discarding connection").

The session does not consult the environment on each request (``trust_env`` is off): requests
would otherwise look for a ``.netrc`` file and re-read the proxy variables on every call (and a
``.netrc`` entry for the storage host would replace the SDK's ``Authorization`` header). What it
would have read is read once, when a client is built, and handed to the client: the proxies for
its endpoint (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``, honouring ``NO_PROXY``) and a CA
bundle named by ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE``. Changing them afterwards takes a
new client (a restart), as for any other setting.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import requests
from azure.core.credentials import TokenCredential
from azure.core.exceptions import ResourceNotFoundError
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import TableClient, TableServiceClient
from azure.servicebus import ServiceBusClient
from azure.storage.queue import ExponentialRetry, QueueServiceClient
from requests.adapters import HTTPAdapter
from requests.utils import get_environ_proxies
from urllib3.util.retry import Retry

from sas.domain.errors import ConfigurationError
from sas.domain.wire import CLOCK_PROBE
from sas.settings import Connection

POOL_MAXSIZE = 64
"""Connections kept open per storage endpoint (table, queue) in one process. At least the
invocations a process runs at once: the Functions Python worker runs sync functions on a pool
of at most 32 threads (``PYTHON_THREADPOOL_THREAD_COUNT``; by default min(32, CPUs + 4)), and
the HTTP API's sync routes run on their own threads beside it. More calls than this still go
through (the pool does not block); only the connections past it are not kept."""

C = TypeVar("C", TableServiceClient, QueueServiceClient)
Hooks = dict[str, Callable[[Any], None]]

_session_lock = threading.Lock()
_session: tuple[int, requests.Session] | None = None


def pooled_session(pool_maxsize: int = POOL_MAXSIZE) -> requests.Session:
    """A new session that ignores the environment, with ``pool_maxsize`` connections per host.

    Its adapter is configured as azure-core configures the session it creates itself: urllib3
    never retries or follows a redirect (the SDK's retry and redirect policies do that)."""
    session = requests.Session()
    session.trust_env = False
    adapter = HTTPAdapter(
        pool_maxsize=pool_maxsize,
        max_retries=Retry(total=False, redirect=False, raise_on_status=False),
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def http_session() -> requests.Session:
    """This process's session, created on first use (a forked child makes its own)."""
    global _session
    pid = os.getpid()
    current = _session
    if current is None or current[0] != pid:
        with _session_lock:
            current = _session
            if current is None or current[0] != pid:
                current = _session = (pid, pooled_session())
    return current[1]


def shared_transport(**connection: Any) -> RequestsTransport:
    """An azure-core transport on :func:`http_session`, which it never closes.

    ``connection``: azure-core's connection options (``connection_timeout``, ``read_timeout``,
    ...); a client given a transport applies none of its own. The CA bundle requests would have
    taken from the environment is the default for ``connection_verify``."""
    verify: bool | str = (
        os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    )
    connection.setdefault("connection_verify", verify)
    return RequestsTransport(session=http_session(), session_owner=False, **connection)


def environment_proxies(url: str) -> dict[str, str] | None:
    """The proxies requests would take from the environment for ``url`` (None: no proxy)."""
    return get_environ_proxies(url) or None


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


def ping(table: TableClient) -> None:
    """One request whose only use is its answer's date: a read of a row never written."""
    with contextlib.suppress(ResourceNotFoundError):
        table.get_entity(*CLOCK_PROBE)


def _on_shared_session(build: Callable[..., C], hooks: Hooks | None = None, **connection: Any) -> C:
    """``build(transport=..., proxies=...)`` on :func:`shared_transport`, with the proxies the
    environment names for the client's own endpoint (known once the client has parsed its
    connection string; building a client does no I/O), and ``hooks`` (azure-core's
    ``raw_request_hook`` and ``raw_response_hook``: called on every try)."""
    hooks = hooks or {}
    client = build(transport=shared_transport(**connection), **hooks)
    proxies = environment_proxies(client.url)
    if proxies:
        client = build(transport=shared_transport(**connection), proxies=proxies, **hooks)
    return client


def table_service_client(connection: Connection, hooks: Hooks | None = None) -> TableServiceClient:
    if connection.connection_string:
        return _on_shared_session(
            partial(TableServiceClient.from_connection_string, connection.connection_string),
            hooks,
        )
    if connection.table_uri is None:
        raise ConfigurationError(f"{connection.setting}: no table endpoint")
    return _on_shared_session(
        partial(
            TableServiceClient, endpoint=connection.table_uri, credential=credential(connection)
        ),
        hooks,
    )


def table_client(
    connection: Connection, table_name: str, hooks: Hooks | None = None
) -> TableClient:
    return table_service_client(connection, hooks).get_table_client(table_name)


QUEUE_CONNECTION_TIMEOUT = 3
QUEUE_READ_TIMEOUT = 7


def bounded_queue_options() -> dict[str, Any]:
    """Keep one Storage Queue call, retries included, under about 36 s.

    The SDK's defaults (read timeout 60 s, 3 retries backing off from 15 s) let a single send
    run for minutes; a send that outlives the alert lease (``consequences.ALERT_LEASE``, minus
    twice the clock-skew allowance) could land after another instance re-sent the alert. Each
    try: 3 s to connect, 7 s per read; two retries after about 1 s and 3 s (jitter 1 s).
    ``connection_timeout`` and ``read_timeout`` are the transport's (see
    :func:`queue_service_client`), the retry policy the client's."""
    return {
        "connection_timeout": QUEUE_CONNECTION_TIMEOUT,
        "read_timeout": QUEUE_READ_TIMEOUT,
        "retry_policy": ExponentialRetry(
            initial_backoff=1, increment_base=2, retry_total=2, random_jitter_range=1
        ),
    }


def queue_service_client(connection: Connection, hooks: Hooks | None = None) -> QueueServiceClient:
    options = bounded_queue_options()
    timeouts = {key: options.pop(key) for key in ("connection_timeout", "read_timeout")}
    if connection.connection_string:
        return _on_shared_session(
            partial(
                QueueServiceClient.from_connection_string,
                connection.connection_string,
                **options,
            ),
            hooks,
            **timeouts,
        )
    if connection.queue_uri is None:
        raise ConfigurationError(f"{connection.setting}: no queue endpoint")
    return _on_shared_session(
        partial(
            QueueServiceClient,
            account_url=connection.queue_uri,
            credential=credential(connection),
            **options,
        ),
        hooks,
        **timeouts,
    )


@dataclass(frozen=True)
class ServiceBusClients:
    """How a resolved ``SasServiceBus`` connection makes its clients: nothing connects until
    ``make`` is called."""

    make: Callable[[], ServiceBusClient]
    endpoint: str
    """The namespace host, for logs (never the key)."""
    close: Callable[[], None]
    """Closes the credentials ``make`` made."""


def servicebus_clients(conn: Connection) -> ServiceBusClients:
    """Service Bus clients from a connection string, or from the namespace and the identity
    the connection names (the same rule as the storage clients, checked before any use)."""
    if conn.connection_string:
        connection_string = conn.connection_string
        return ServiceBusClients(
            lambda: ServiceBusClient.from_connection_string(connection_string),
            _namespace_of(connection_string),
            lambda: None,
        )
    if conn.namespace:
        namespace = conn.namespace
        check_identity(conn)
        made: list[TokenCredential] = []

        def with_identity() -> ServiceBusClient:
            made.append(credential(conn))
            return ServiceBusClient(fully_qualified_namespace=namespace, credential=made[-1])

        def close() -> None:
            while made:
                closing = getattr(made.pop(), "close", None)
                if callable(closing):
                    closing()

        return ServiceBusClients(with_identity, namespace, close)
    raise ConfigurationError(
        f"{conn.setting}: need a connection string or {conn.setting}__fullyQualifiedNamespace"
    )


def _namespace_of(connection_string: str) -> str:
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "endpoint":
            return value.strip().removeprefix("sb://").rstrip("/") or "servicebus"
    return "servicebus"

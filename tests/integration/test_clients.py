"""The storage client factory against Azurite: one shared session per process, sized for many
threads, that reads no environment per request, while the proxies and CA bundle the
environment names are still applied (read once, when a client is built)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
from azure.storage.queue import QueueServiceClient

from sas.adapters import clients
from sas.adapters.storage_queues import StorageQueueTransport
from sas.domain.messages import ScheduleRequest
from sas.settings import Connection
from sas_local.azurite import Azurite
from tests.conftest import unique_queue

pytestmark = pytest.mark.integration


@pytest.fixture
def connection(azurite: Azurite) -> Connection:
    return Connection(setting="SasStorage", connection_string=azurite.connection_string)


@pytest.fixture
def seen() -> Iterator[list[str]]:
    """The URL of every response the shared session receives while the test runs."""
    urls: list[str] = []

    def record(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        urls.append(str(response.request.url))

    hooks = clients.http_session().hooks["response"]
    hooks.append(record)
    yield urls
    hooks.remove(record)


def test_table_and_queue_clients_send_over_the_one_session(connection, table, seen):
    session = clients.http_session()
    assert session.trust_env is False
    adapter = session.get_adapter("https://account.table.core.windows.net/")
    assert isinstance(adapter, requests.adapters.HTTPAdapter)
    assert adapter.poolmanager.connection_pool_kw["maxsize"] == clients.POOL_MAXSIZE

    name = unique_queue()
    service = clients.queue_service_client(connection)
    service.create_queue(name)
    StorageQueueTransport(service).send(
        name, ScheduleRequest(order_id="o1"), message_id="m", correlation_id="o1"
    )
    clients.table_client(connection, table.table_name).upsert_entity(
        {"PartitionKey": "p", "RowKey": "r"}
    )

    ports = {urlsplit(url).port for url in seen}
    table_port = urlsplit(clients.table_service_client(connection).url).port
    assert {table_port, urlsplit(service.url).port} <= ports
    assert clients.http_session() is session


def test_a_netrc_entry_for_the_storage_host_is_never_read(connection, tmp_path, monkeypatch):
    # requests with trust_env would send these credentials as Basic auth in place of the
    # SDK's signature, and storage would refuse every request.
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))

    with pytest.raises(ClientAuthenticationError):  # the hazard, with the SDK's own session
        list(QueueServiceClient.from_connection_string(connection.connection_string).list_queues())
    list(clients.queue_service_client(connection).list_queues())  # ours: not consulted


class FakeProxy:
    """Accepts connections, records each request line and answers 404."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.lines.append(data.split(b"\r\n", 1)[0].decode())
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def proxy() -> Iterator[FakeProxy]:
    running = FakeProxy()
    yield running
    running.close()


def test_the_proxy_the_environment_names_is_used(connection, proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    service = clients.queue_service_client(connection)

    with pytest.raises(HttpResponseError):
        list(service.list_queues())

    assert proxy.lines and proxy.lines[0].startswith(f"GET {service.url}")


def test_no_proxy_is_honoured_for_the_clients_endpoint(connection, proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    list(clients.queue_service_client(connection).list_queues())
    assert proxy.lines == []


def test_a_ca_bundle_named_in_the_environment_is_the_default_for_verify(tmp_path, monkeypatch):
    bundle = tmp_path / "ca.pem"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    assert clients.shared_transport().connection_config.verify == str(bundle)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    assert clients.shared_transport().connection_config.verify is True


def test_queue_calls_keep_their_bounded_timeouts(connection, monkeypatch):
    # A client given a transport applies none of its own timeouts: the transport carries them.
    made: list[dict[str, Any]] = []
    shared_transport = clients.shared_transport

    def recording(**options: Any) -> Any:
        made.append(options)
        return shared_transport(**options)

    monkeypatch.setattr(clients, "shared_transport", recording)
    clients.queue_service_client(connection)
    assert made and all(
        (options["connection_timeout"], options["read_timeout"])
        == (clients.QUEUE_CONNECTION_TIMEOUT, clients.QUEUE_READ_TIMEOUT)
        for options in made
    )
    bounded = clients.bounded_queue_options()
    assert (bounded["connection_timeout"], bounded["read_timeout"]) == (3, 7)

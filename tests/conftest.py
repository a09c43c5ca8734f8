"""Shared fixtures. Azurite is started once per session (per xdist worker: each has its own),
only if a test asks for it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.data.tables import TableClient, TableServiceClient
from azure.storage.queue import QueueServiceClient
from hypothesis import settings as hypothesis_settings

from sas.domain.wire import live_table_name
from sas_local.azurite import Azurite

# `make fast` (--hypothesis-profile=fast): each property a quick look; the full run elsewhere.
hypothesis_settings.register_profile("fast", max_examples=20)


ONE_AT_A_TIME = {
    "test_bench",
    "test_campaign",
    "test_clock_skew",  # its timing bound (a request reaches its agent in time) needs a core
    "test_tutorial",  # the tutorial's second run is in the Flex layout
    "test_dashboard",
}
"""Modules whose stacks run every function in processes of its own (~30 processes each), the
benchmark's, which starts one stack after another, and the 300-order chaos campaign; with
them, tests/e2e/flex/, whose modules share one such stack. They run one after another, and so
does the dashboard's browser test: beside the campaign its page's API calls took 28 s."""


def shared_by(nodeid: str) -> str:
    """Which tests must run on one xdist worker with this one: those sharing its expensive
    fixtures (an e2e module's stack; the deploy tests' package and venvs); the heaviest stacks
    and the most timing-bound, one at a time (two Flex stacks at once would start some sixty
    processes on two cores). Any other test goes wherever a worker is free."""
    path = nodeid.split("::")[0]
    module = path.rsplit("/", 1)[-1].removesuffix(".py")
    if module in ONE_AT_A_TIME or path.startswith("tests/e2e/flex/"):
        return "one at a time"
    if path.startswith("tests/deploy/"):
        return "deploy"
    return path if path.startswith("tests/e2e/") else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test``'s two workers (pytest-xdist), scheduled by ``shared_by``."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtures(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return shared_by(nodeid)

    return SharedFixtures(config, log)


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
    from tests.workflows import REGISTRY

    monkeypatch.setenv(settings.TRANSPORT, "storage")
    monkeypatch.setenv(settings.STORAGE_CONNECTION, azurite.connection_string)
    monkeypatch.setenv(settings.TABLE_NAME, table.table_name)
    for agent in settings.HTTP_AGENTS:  # the app's, whatever workflows it declares
        monkeypatch.setenv(settings.remote_url_setting(agent), "http://127.0.0.1:9")
    # The tests' own workflows (tests/workflows.py), whatever the app's examples declare.
    monkeypatch.setattr(bootstrap, "workflows", lambda: REGISTRY)
    bootstrap.reset()
    provision(bootstrap.settings())
    # The queues are shared by every test of the session: start each test with them empty.
    queues = QueueServiceClient.from_connection_string(azurite.connection_string)
    for name in bootstrap.settings().queues.values():
        queues.get_queue_client(name).clear_messages()
    yield
    bootstrap.reset()

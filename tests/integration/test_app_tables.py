"""A Python agent's declared table on Azurite (``sas.actions.app_table``), and the workspace
example's effects kept there: each applied once per idempotency key, whoever calls first; and
what a table answers, as the harness's in-memory tables answer it (tests/table_checks.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import TableClient, TableServiceClient

from sas import bootstrap, settings
from sas.actions import ActionContext, Refused, app_table
from sas.domain.errors import ConfigurationError
from sas.services.store_time import SystemClock
from sas_local.azurite import Azurite
from sas_local.provision import provision
from tests.table_checks import CHECKS
from workflows import REGISTRY, workspace

pytestmark = pytest.mark.integration


@pytest.fixture
def declared(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(settings.TRANSPORT, "storage")
    monkeypatch.setenv(settings.STORAGE_CONNECTION, azurite.connection_string)
    for agent in REGISTRY.http_agents:
        monkeypatch.setenv(settings.remote_url_setting(agent), "http://127.0.0.1:9")
    monkeypatch.setattr(bootstrap, "workflows", lambda: REGISTRY)
    bootstrap.reset()
    provision(bootstrap.settings())
    yield TableServiceClient.from_connection_string(azurite.connection_string)
    bootstrap.reset()


def context(order_id: str, key: str, action: str = "create") -> ActionContext:
    return ActionContext(
        order_id=order_id,
        agent="cloud",
        step=action,
        action=action,
        mode="do",
        attempt=1,
        idempotency_key=key,
        deadline=datetime.now(UTC) + timedelta(seconds=15),
        clock=SystemClock(),
    )


def test_provisioning_creates_the_declared_table(declared: TableServiceClient) -> None:
    names = {table.name for table in declared.list_tables()}
    assert "workspaces" in names
    assert app_table("workspaces").table_name == "workspaces"
    with pytest.raises(ConfigurationError, match="no Python agent declares it"):
        app_table("sasorders")


def test_an_effect_is_applied_once_per_key_and_replayed_after(
    declared: TableServiceClient,
) -> None:
    effects = workspace.TableEffects(workspace.TABLE)
    data = {"team": "Blue", "order_id": "w-once"}
    first = effects.once(context("w-once", "w-once:create"), data, {"workspace_id": "ws-1"})
    again = effects.once(context("w-once", "w-once:create"), data, {"workspace_id": "ws-2"})
    step = context("w-once", "w-once:configure", "configure")
    other = effects.once(step, data, {"plan": "free"})
    assert first == again == {"workspace_id": "ws-1"}
    assert other == {"plan": "free"}
    with pytest.raises(Refused, match="used for another request"):
        effects.once(context("w-once", "w-once:create"), {**data, "team": "Red"}, {})
    with pytest.raises(ValueError, match="bytes > 8192"):  # never stored: no reply carries it
        effects.once(context("w-big", "w-big:create"), data, {"blob": "x" * 9000})
    assert list(app_table("workspaces").query_entities("PartitionKey eq 'w-big'")) == []
    rows = list(app_table("workspaces").query_entities("PartitionKey eq 'w-once'"))
    assert sorted((row["RowKey"], row["Agent"], row["Action"]) for row in rows) == [
        ("w-once:configure", "cloud", "configure"),
        ("w-once:create", "cloud", "create"),
    ]


def test_concurrent_attempts_of_one_step_agree_on_one_effect(
    declared: TableServiceClient,
) -> None:
    effects = workspace.TableEffects(workspace.TABLE)
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda n: effects.once(context("w-race", "w-race:create"), {}, {"n": n}), range(8)
            )
        )
    assert len({answer["n"] for answer in answers}) == 1
    rows = list(app_table("workspaces").query_entities("PartitionKey eq 'w-race'"))
    assert len(rows) == 1


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_table_storage_answers_as_the_harness_tables_do(name: str, table: TableClient) -> None:
    CHECKS[name](table)

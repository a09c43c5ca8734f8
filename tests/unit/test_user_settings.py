"""The settings a user gives `make run` (sas_local/user_settings.py): a local.settings.json,
then the environment; the stack keeps what it runs on, and an agent given a URL of its own is
not played by the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sas import settings
from sas.declared import registry
from sas_local import user_settings
from sas_local.devhost.config import DevHostError

pytestmark = [pytest.mark.unit, pytest.mark.fast]

AGENTS = registry().http_agents
MINE, OTHER = AGENTS[0], AGENTS[1]


def write(path: Path, values: dict[str, str]) -> Path:
    path.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    return path


def test_the_file_then_the_environments_app_settings(tmp_path: Path) -> None:
    declared = next(iter(registry().settings))
    local = write(
        tmp_path / "local.settings.json",
        {"SAS_MAX_FAILURES": "5", declared: "from-file", "SAS_TABLE_NAME": "mine"},
    )
    environ = {"SAS_MAX_FAILURES": "7", declared: "from-env", "HOME": "/home/x", "PATH": "/bin"}
    found = user_settings.read(local, environ)
    assert found == {"SAS_MAX_FAILURES": "7", declared: "from-env", "SAS_TABLE_NAME": "mine"}
    assert user_settings.read(tmp_path / "absent.json", {}) == {}
    with pytest.raises(DevHostError, match=r"absent\.json does not exist"):
        user_settings.read(tmp_path / "absent.json", {}, explicit=True)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DevHostError, match=r"bad\.json"):
        user_settings.read(tmp_path / "bad.json", {})


def test_the_stack_keeps_what_it_runs_on_and_the_simulators_urls() -> None:
    user = {
        settings.TRANSPORT: "servicebus",
        settings.STORAGE_CONNECTION: "UseDevelopmentStorage=true",
        "SasStorage__tableServiceUri": "https://x.table.core.windows.net",
        "SasServiceBus__fullyQualifiedNamespace": "x.servicebus.windows.net",
        "AzureWebJobsStorage": "UseDevelopmentStorage=true",
        settings.INSTANCE_ID: "one-for-all",
        settings.remote_url_setting(MINE): "http://127.0.0.1:8000/mine",
        settings.remote_url_setting(OTHER): "http://127.0.0.1:7081/" + OTHER,  # the example's
        "SAS_MAX_FAILURES": "5",
    }
    assert user_settings.given(user) == {
        settings.remote_url_setting(MINE): "http://127.0.0.1:8000/mine",
        "SAS_MAX_FAILURES": "5",
    }
    assert user_settings.own_services(user, AGENTS) == {MINE: settings.remote_url_setting(MINE)}


def test_endpoints_of_ones_own_count_as_a_service_of_ones_own() -> None:
    key = settings.remote_endpoints_setting(OTHER)
    user = {key: json.dumps([{"name": "a", "url": "http://127.0.0.1:8001"}])}
    assert user_settings.own_services(user, AGENTS) == {OTHER: key}
    assert user_settings.own_services({settings.remote_url_setting(MINE): " "}, AGENTS) == {}

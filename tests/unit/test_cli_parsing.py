"""The CLI's own inputs: durations, JSON inline or @file, where the app's settings come from,
and the `cli` extra pinned as the app is."""

from __future__ import annotations

import json
import re
import tomllib
from datetime import timedelta
from pathlib import Path

import pytest

from sas import settings as app_settings
from sas_cli import appsettings
from sas_cli.parsing import UsageError, duration, json_object

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("0s", timedelta(0)),
        (" 30d ", timedelta(days=30)),
    ],
)
def test_durations(text, expected):
    assert duration(text) == expected


@pytest.mark.parametrize(
    "text", ["", "7", "d", "7x", "-5m", "1.5h", "7 d", "7D", "1h30m", "9" * 10]
)
def test_what_is_not_a_duration(text):
    with pytest.raises(UsageError, match="not a duration"):
        duration(text)


def test_a_duration_over_ten_years_is_refused():
    assert duration("3660d") == timedelta(days=3660)
    for text in ("3661d", "999999999d", "999999999h"):
        with pytest.raises(UsageError, match="too long"):
            duration(text)


def test_json_inline_or_from_a_file(tmp_path):
    assert json_object('{"a": 1}', "details") == {"a": 1}
    path = tmp_path / "d.json"
    path.write_text('{"b": [2]}')
    assert json_object(f"@{path}", "details") == {"b": [2]}
    for bad, said in (("{", "not valid JSON"), ("[]", "a JSON object"), ("@/nope", "cannot")):
        with pytest.raises(UsageError, match=said):
            json_object(bad, "details")


def test_the_environment_wins_when_it_names_the_apps_storage(tmp_path):
    (tmp_path / ".sas-run").mkdir()
    (tmp_path / ".sas-run" / "local.settings.json").write_text('{"Values": {"SasStorage": "x"}}')
    for env in ({"SasStorage": "y"}, {"SasStorage__tableServiceUri": "https://t"}):
        assert appsettings.choose(None, env, tmp_path).values == {}


def test_else_the_local_runs_settings_else_azurite(tmp_path):
    source = appsettings.choose(None, {}, tmp_path)
    assert source.values[app_settings.TRANSPORT] == "storage"
    assert "TableEndpoint=http://127.0.0.1:10002/" in source.values["SasStorage"]
    (tmp_path / ".sas-run").mkdir()
    (tmp_path / ".sas-run" / "local.settings.json").write_text('{"Values": {"SasStorage": "x"}}')
    assert appsettings.choose(None, {}, tmp_path).values == {"SasStorage": "x"}


def test_a_settings_file_from_azure_signs_in_as_the_operator(tmp_path):
    listed = [
        {"name": "SasStorage__tableServiceUri", "value": "https://a.table.core.windows.net"},
        {"name": "SasStorage__queueServiceUri", "value": "https://a.queue.core.windows.net"},
        {"name": "SasStorage__credential", "value": "managedidentity", "slotSetting": False},
        {"name": "SasStorage__clientId", "value": "0000"},
        {"name": "SasServiceBus__fullyQualifiedNamespace", "value": "ns.servicebus.windows.net"},
        {"name": "SasServiceBus__credential", "value": "managedidentity"},
        {"name": "SAS_MAX_FAILURES", "value": 3},
    ]
    path = tmp_path / "appsettings.json"
    path.write_text(json.dumps(listed))
    source = appsettings.choose(path, {"SasStorage": "ignored"}, tmp_path)
    assert source.values == {
        "SasStorage__tableServiceUri": "https://a.table.core.windows.net",
        "SasStorage__queueServiceUri": "https://a.queue.core.windows.net",
        "SasServiceBus__fullyQualifiedNamespace": "ns.servicebus.windows.net",
        "SAS_MAX_FAILURES": "3",
    }
    env: dict[str, str] = {}
    appsettings.apply(source, env)
    settings = app_settings.load(env)
    assert settings.storage.credential is None  # DefaultAzureCredential: az login
    assert settings.servicebus is not None and settings.servicebus.credential is None
    assert env[app_settings.remote_url_setting("payment")] == appsettings.UNUSED_REMOTE_URL


def test_the_cli_extra_is_pinned_as_the_app_is():
    pinned: dict[str, str] = {}
    for lock in ("requirements.in", "requirements-dev.txt"):  # the app's, then local tooling's
        for line in (ROOT / lock).read_text().splitlines():
            found = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
            if found:
                pinned.setdefault(found.group(1).lower(), found.group(2))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = dict(spec.split("==") for spec in project["optional-dependencies"]["cli"])
    assert "rich" in extra and "azure-data-tables" in extra
    assert {name: pinned.get(name) for name in extra} == extra


def test_parked_messages_are_one_noun_list_replay_and_discard():
    from sas_cli import commands

    args = commands.parser().parse_args(["parked", "list", "--limit", "5"])
    assert (args.command, args.verb, args.limit) == ("parked", "list", 5)
    assert args.handler is commands._parked_list
    for verb, handler in (
        ("replay", commands._parked_replay),
        ("discard", commands._parked_discard),
    ):
        args = commands.parser().parse_args(["parked", verb, "p1.abc", "--actor", "al", "--json"])
        assert (args.message_id, args.actor, args.json) == ("p1.abc", "al", True)
        assert args.handler is handler
    for wrong in (
        ["rejected", "list"],  # the two nouns it replaced
        ["poison", "list"],
        ["parked"],
        ["parked", "list", "--limit", "0"],
        ["parked", "discard", "--all", "--by", "someone"],
    ):
        with pytest.raises(UsageError):
            commands.parser().parse_args(wrong)

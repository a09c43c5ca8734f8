"""Where the `sas` CLI takes the app's settings from, decided before it reaches anything: a
settings file wins over a storage connection left in the environment, and a settings file it
cannot read is one line and exit code 2. A settings file (or the local run's) pointing the CLI
at a real table: tests/integration/test_cli.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sas import settings as app_settings
from sas_cli import appsettings
from tests.unit.test_cli_refusals import environment, on_memory, sas

pytestmark = [pytest.mark.unit, pytest.mark.fast]


@pytest.fixture
def bare_environment(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[None]:
    """None of the app's settings in the environment, and nothing the CLI could reach."""
    request.getfixturevalue(environment.__name__)
    for key in list(os.environ):
        if key.startswith(("SAS_", app_settings.STORAGE_CONNECTION)):
            monkeypatch.delenv(key)
    on_memory(monkeypatch, None)
    yield


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "is not JSON"),
        ('{"Settings": {}}', 'expected {"Values"'),
        ('[{"name": "SasStorage"}]', 'expected {"Values"'),
        ('{"Values": {"SasStorage": {"nested": 1}}}', "not a name with a plain value"),
    ],
)
def test_a_bad_settings_file_is_exit_code_2(bare_environment, capsys, tmp_path, content, said):
    path = tmp_path / "settings.json"
    path.write_text(content)
    code, out, err = sas(capsys, "--settings", str(path), "list")
    assert code == 2 and out == "" and said in err
    code, _, err = sas(capsys, "--settings", str(tmp_path / "missing.json"), "list")
    assert code == 2 and "cannot read" in err


def test_a_settings_file_wins_over_a_storage_connection_left_in_the_environment(
    tmp_path: Path,
) -> None:
    """README: "In order: --settings FILE ... else the environment". A deployed app's settings
    (az functionapp config appsettings list) name its storage by endpoint and identity; an
    operator whose shell still holds a SasStorage connection string (a local run's) must reach
    the app of the file, not the one of the environment."""
    from_azure = tmp_path / "appsettings.json"
    from_azure.write_text(
        json.dumps(
            [
                {"name": "SAS_TRANSPORT", "value": "storage"},
                {
                    "name": "SasStorage__tableServiceUri",
                    "value": "https://prodapp.table.core.windows.net",
                },
                {
                    "name": "SasStorage__queueServiceUri",
                    "value": "https://prodapp.queue.core.windows.net",
                },
                {"name": "SasStorage__credential", "value": "managedidentity"},
            ]
        )
    )
    env = {app_settings.STORAGE_CONNECTION: appsettings.AZURITE_DEVELOPMENT}
    source = appsettings.choose(from_azure, env, tmp_path)
    appsettings.apply(source, env)
    storage = app_settings.load(env).storage
    assert (storage.connection_string, storage.table_uri) == (
        None,
        "https://prodapp.table.core.windows.net",
    )

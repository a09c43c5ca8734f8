"""The operator CLI as a user installs it: `pip install '.[cli]'` into a clean venv gives a
working `sas` console script that reaches the app's store and queues (here on Azurite) with
only what the `cli` extra brings: not the Functions worker, nor the local tooling."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.data.tables import TableServiceClient

from sas import settings as app_settings
from sas.adapters.clients import queue_service_client
from sas.settings import AGENTS
from sas_local.azurite import Azurite
from sas_local.provision import provision
from tests.deploy.packaging import ROOT, pip_install, python311
from tests.integration.test_bad_input import VALID_ORDER

pytestmark = pytest.mark.deploy


@pytest.fixture(scope="module")
def cli_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "sas"
    # A copy of the working tree as git sees it (tracked, and new files not ignored), so the
    # build never writes into the working tree and never picks up caches or local settings.
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        relative = Path(name.decode())
        if not (ROOT / relative).is_file():
            continue  # deleted in the working tree, not yet committed
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, source / relative)
    venv = tmp_path_factory.mktemp("cli") / "venv"
    subprocess.run([python311(), "-m", "venv", str(venv)], check=True, timeout=300)
    pip_install(venv / "bin" / "python", f"{source}[cli]", what="the operator CLI")
    return venv


def sas(venv: Path, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "sas"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd or venv)},  # no app settings inherited
    )


def test_the_console_script_installs_with_only_its_own_dependencies(cli_venv: Path) -> None:
    done = sas(cli_venv, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: sas" in done.stdout
    for command in ("submit", "status", "history", "list", "resubmit", "parked", "purge", "watch"):
        assert command in done.stdout
    installed = subprocess.run(
        [str(cli_venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    assert "rich==" in installed and "azure-data-tables==" in installed
    for not_needed in ("azure-functions==", "uvicorn==", "pytest=="):
        assert not_needed not in installed
    local = subprocess.run(
        [str(cli_venv / "bin" / "python"), "-c", "import sas_local"],
        capture_output=True,
        cwd=cli_venv,  # not the checkout, whose sas_local the current directory would offer
    )
    assert local.returncode != 0  # the local tooling is never part of the CLI's package


@pytest.fixture
def settings_file(azurite: Azurite, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A local.settings.json for Azurite with a table and orders queues of this test's own."""
    values = {
        app_settings.TRANSPORT: "storage",
        app_settings.STORAGE_CONNECTION: azurite.connection_string,
        app_settings.TABLE_NAME: f"cli{uuid.uuid4().hex[:12]}",
        app_settings.QUEUE_ORDERS: f"cli-orders-{uuid.uuid4().hex[:8]}",
        **{app_settings.remote_url_setting(a): "http://127.0.0.1:9" for a in AGENTS},
    }
    settings = app_settings.load(values)
    provision(settings)
    path = tmp_path / "local.settings.json"
    path.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    yield path, values
    tables = TableServiceClient.from_connection_string(azurite.connection_string)
    for table in settings.tables:
        tables.delete_table(table)
    queues = queue_service_client(settings.storage)
    for lane in settings.lanes(app_settings.QUEUE_ORDERS).values():
        queues.delete_queue(lane)


def test_the_installed_cli_works_against_the_apps_storage(
    cli_venv: Path, settings_file: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    path, values = settings_file
    details = json.dumps(VALID_ORDER["details"])

    submitted = sas(cli_venv, "--settings", str(path), "submit", "order", details, "--json")
    assert submitted.returncode == 0, submitted.stderr
    order_id = json.loads(submitted.stdout)["order_id"]
    queue = queue_service_client(app_settings.load(values).storage).get_queue_client(
        values[app_settings.QUEUE_ORDERS]
    )
    assert queue.get_queue_properties().approximate_message_count == 1

    listed = sas(cli_venv, "--settings", str(path), "--json", "list")
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    parked = sas(cli_venv, "--settings", str(path), "--json", "parked", "list")
    assert parked.returncode == 0, parked.stderr  # the app's table and the host's poison queues
    assert [m for m in json.loads(parked.stdout) if m["parked_by"] == "app"] == []
    missing = sas(cli_venv, "--settings", str(path), "status", order_id)
    assert missing.returncode == 1 and "not found" in missing.stderr  # queued, not yet taken
    watched = sas(cli_venv, "--settings", str(path), "watch", "--iterations", "1", "--json")
    assert watched.returncode == 0, watched.stderr
    assert json.loads(watched.stdout)["counts"]["Processed"] == 0

    # With no --settings and no settings in the environment: the local run's file.
    (tmp_path / ".sas-run").mkdir()
    shutil.copy(path, tmp_path / ".sas-run" / "local.settings.json")
    local = sas(cli_venv, "--json", "list", cwd=tmp_path)
    assert local.returncode == 0 and json.loads(local.stdout) == [], local.stderr

    # The Service Bus transport's adapters import too (nothing is sent to reach this).
    servicebus = tmp_path / "servicebus.json"
    servicebus.write_text(
        json.dumps(
            {
                "Values": {
                    **values,
                    app_settings.TRANSPORT: "servicebus",
                    app_settings.SERVICEBUS_CONNECTION: (
                        "Endpoint=sb://127.0.0.1:9/;SharedAccessKeyName=k;SharedAccessKey=a2V5"
                    ),
                }
            }
        )
    )
    on_servicebus = sas(cli_venv, "--settings", str(servicebus), "status", order_id)
    assert on_servicebus.returncode == 1 and "not found" in on_servicebus.stderr


def test_unreachable_storage_is_reported_without_a_traceback(
    cli_venv: Path, tmp_path: Path
) -> None:
    path = tmp_path / "dead.json"
    dead = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        "QueueEndpoint=http://127.0.0.1:9/devstoreaccount1;"
        "TableEndpoint=http://127.0.0.1:9/devstoreaccount1;"
    )
    path.write_text(json.dumps({"Values": {"SAS_TRANSPORT": "storage", "SasStorage": dead}}))
    done = sas(cli_venv, "--settings", str(path), "list", "--state", "Error")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("sas: error: ServiceRequestError from settings file")
    assert "Traceback" not in done.stderr and done.stdout == ""

"""The operator CLI as a user installs it: `pip install '.[cli]'` into a clean venv gives a
working `sas` console script, with its own dependencies and none of the function app's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.packaging import ROOT, pip_install, python311

pytestmark = pytest.mark.deploy


@pytest.fixture(scope="module")
def cli_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "sas"
    # A copy of the tracked tree, so the build never writes into the working tree.
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        relative = Path(name.decode())
        if not (ROOT / relative).is_file():
            continue  # deleted in the working tree, not yet committed
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, source / relative)
    venv = tmp_path_factory.mktemp("cli") / "venv"
    subprocess.run([python311(), "-m", "venv", str(venv)], check=True, timeout=300)
    pip_install(venv / "bin" / "python", f"{source}[cli]", what="the operator CLI")
    return venv


def test_the_console_script_runs_with_only_its_own_dependencies(cli_venv: Path) -> None:
    done = subprocess.run(
        [str(cli_venv / "bin" / "sas"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "usage: sas" in done.stdout
    for command in ("orders", "rejected", "poison"):
        assert command in done.stdout
    installed = subprocess.run(
        [str(cli_venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    assert "httpx==" in installed and "rich==" in installed
    for app_only in ("azure-functions==", "azure-data-tables==", "azure-servicebus=="):
        assert app_only not in installed


def test_the_cli_reports_an_unreachable_api_without_a_traceback(cli_venv: Path) -> None:
    done = subprocess.run(
        [
            str(cli_venv / "bin" / "sas"),
            "--url",
            "http://127.0.0.1:9",
            "orders",
            "list",
            "--state",
            "Error",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "cannot reach http://127.0.0.1:9" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr

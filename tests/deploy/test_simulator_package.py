"""The simulator's function app (SAS_DEPLOY_SIMULATOR): bundled as azd's prepackage hook does,
zipped as azd zips its `dist`, indexed by the worker's registry and serving requests, in the
requirements-only venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.packaging import ROOT, build_package, run_in_package

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(900)]

SIMULATOR = ROOT / "sas_local" / "simulator"
SIMULATOR_MODULES = {
    f"sas_local/simulator/{name}"
    for name in ("__init__.py", "__main__.py", "app.py", "azure_app.py", "books.py", "faults.py")
}

SERVE = r"""
import asyncio, json, os, socket, sys

def refuse(*args, **kwargs):
    raise OSError("network use while serving")
socket.socket.connect = socket.socket.connect_ex = refuse

import azure.functions as func
import function_app
from types import SimpleNamespace
from azure_functions_runtime import functions, loader
from azure_functions_runtime.bindings import meta

protos = SimpleNamespace(BindingInfo=SimpleNamespace(in_=0, out=1, inout=2, undefined=0))
meta.load_binding_registry()
registry = functions.Registry()
registered = {}
indexed = loader.index_function_app(os.path.join(os.getcwd(), "function_app.py"))
for f in indexed:
    info = registry.add_indexed_function(f, protos)
    registered[f.get_function_name()] = {
        "http": info.is_http_func,
        "route": f.get_trigger().route,
        "auth": str(f.get_trigger().auth_level),
    }

[function] = indexed  # get_functions() builds them once only
handle = function.get_user_function()

async def calls():
    answers = []
    for method, path, body, headers in json.loads(sys.argv[1]):
        request = func.HttpRequest(
            method=method, url="https://simulator.example" + path, headers=headers,
            body=json.dumps(body).encode() if body is not None else b"",
        )
        response = await handle(request, None)
        answers.append([response.status_code, json.loads(response.get_body())])
    return answers

print("SAS-SIM " + json.dumps({"registered": registered, "answers": asyncio.run(calls())}))
"""

JSON = {"content-type": "application/json"}
RESERVE = ["POST", "/inventory/reserve", {"order_id": "o-1"}, {**JSON, "Idempotency-Key": "k-1"}]
CALLS = [
    ["GET", "/health", None, {}],
    RESERVE,
    RESERVE,  # the same key: the same effect, applied once
    ["PUT", "/faults", {"transient_rate": 1.0}, JSON],
    ["GET", "/faults", None, {}],
    ["GET", "/ledger", None, {}],
    ["GET", "/openapi.json", None, {}],  # no schema or reference pages in Azure
]


@pytest.fixture(scope="module")
def simulator_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as `azd deploy` uploads it: the hook's output, zipped and unzipped."""
    bundled = tmp_path_factory.mktemp("simulator") / "build"
    done = bundle(bundled)
    assert done.returncode == 0, done.stderr
    again = bundle(bundled)  # azd deploy again: the earlier package is replaced
    assert again.returncode == 0, again.stderr
    zip_path = bundled.parent / "simulator.zip"
    build_package(bundled, zip_path, funcignore="")
    target = bundled.parent / "wwwroot"
    with zipfile.ZipFile(zip_path) as package:
        package.extractall(target)
    return target


def bundle(out: Path) -> subprocess.CompletedProcess[str]:
    """bundle.py as azd's hook runs it: from the service's directory, with the deployer's
    python3; -I -S: nothing but the standard library is importable."""
    python3 = shutil.which("python3")
    assert python3 is not None
    return subprocess.run(
        [python3, "-I", "-S", "bundle.py", str(out)],
        cwd=SIMULATOR,
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=120,
    )


def serve(python: Path, app_dir: Path, runtime: Path, settings: dict[str, str]) -> dict[str, Any]:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], **settings}
    env["PYTHONPATH"] = str(runtime)
    return run_in_package(python, app_dir, SERVE, [json.dumps(CALLS)], env, "SAS-SIM")


def test_the_package_holds_the_simulator_and_sas_only(simulator_dir: Path) -> None:
    files = {p.relative_to(simulator_dir).as_posix() for p in simulator_dir.rglob("*.py")}
    sas_modules = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "sas").rglob("*.py")
        if "testing" not in p.relative_to(ROOT).parts
    }
    assert files == {"function_app.py", *sas_modules, "sas_local/__init__.py", *SIMULATOR_MODULES}
    others = {p.name for p in simulator_dir.iterdir() if p.is_file()} - {"function_app.py"}
    assert others == {"host.json", "requirements.txt"}
    assert (simulator_dir / "requirements.txt").read_text() == (
        ROOT / "requirements.txt"
    ).read_text()
    host = json.loads((simulator_dir / "host.json").read_text())
    assert host["extensions"]["http"]["routePrefix"] == ""  # /inventory/..., as locally


def test_the_deployed_simulator_serves_idempotently_and_refuses_fault_changes(
    app_python: Path, runtime_dir: Path, simulator_dir: Path
) -> None:
    result = serve(app_python, simulator_dir, runtime_dir, {})
    assert result["registered"] == {
        "http_app_func": {"http": True, "route": "/{*route}", "auth": "ANONYMOUS"}
    }
    health, first, again, put, faults, ledger, schema = result["answers"]
    assert health == [200, {"status": "ok"}]
    assert first[0] == again[0] == 200 and first[1] == again[1]
    assert put[0] == 403 and "SAS_SIMULATOR_FAULTS" in put[1]["detail"]
    assert faults[1]["transient_rate"] == 0.0
    assert [e["idempotency_key"] for e in ledger[1]["effects"]] == ["k-1"]
    assert schema[0] == 404


def test_the_deployed_simulator_takes_its_faults_from_the_app_setting(
    app_python: Path, runtime_dir: Path, simulator_dir: Path
) -> None:
    setting = {"SAS_SIMULATOR_FAULTS": json.dumps({"transient_rate": 1.0, "throttle_share": 0})}
    result = serve(app_python, simulator_dir, runtime_dir, setting)
    _, first, _, _, faults, ledger, _ = result["answers"]
    assert first[0] == 503
    assert faults[1]["transient_rate"] == 1.0
    assert ledger[1]["effects"] == []


def test_invalid_faults_in_the_app_setting_stop_the_app_with_the_reason(
    app_python: Path, runtime_dir: Path, simulator_dir: Path
) -> None:
    env = {"PATH": os.environ["PATH"], "SAS_SIMULATOR_FAULTS": '{"transient_rate": 2}'}
    done = subprocess.run(
        [str(app_python), "-B", "-c", "import function_app"],
        cwd=simulator_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert re.search(r"transient_rate\s+Input should be less than or equal to 1", done.stderr)


def test_bundling_into_a_directory_holding_anything_else_deletes_nothing(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")

    done = bundle(tmp_path)

    assert done.returncode == 2
    assert "not a simulator package; nothing written" in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_bundling_onto_a_file_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    target = tmp_path / "build"
    target.write_text("mine")

    done = bundle(target)

    assert done.returncode == 2
    assert "a file, not a directory; nothing written" in done.stderr
    assert target.read_text() == "mine"

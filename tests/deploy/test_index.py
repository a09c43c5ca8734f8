"""The packaged app indexes in a venv holding only requirements.txt, for both transports.

Twice: with azure.functions' own app.get_functions(), and through the Python worker's
function registry (azure-functions-runtime), which checks each parameter's annotation against
its binding the way the worker does when the host loads the app. Each run is a fresh
interpreter in the unzipped package, with no settings in its environment and the network shut.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sas import settings
from sas.settings import AGENTS
from tests.deploy.packaging import run_in_package

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(900)]

INDEX = r"""
import importlib.util, json, os, socket, sys

attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args[:2]))
    raise OSError("network use while indexing")
socket.socket.connect = socket.socket.connect_ex = refuse
socket.create_connection = socket.getaddrinfo = refuse

result = {"importable": [m for m in ("sas_local", "sas_cli", "pytest", "uvicorn", "tests")
                         if importlib.util.find_spec(m) is not None]}
if sys.argv[1] == "app":
    import function_app
    result["functions"] = [
        {
            "name": f.get_function_name(),
            "type": f.get_trigger().get_binding_name(),
            "queue": getattr(f.get_trigger(), "queue_name", None),
            "connection": getattr(f.get_trigger(), "connection", None),
            "schedule": getattr(f.get_trigger(), "schedule", None),
            "bindings": [[b.name, b.type] for b in f.get_bindings()],
        }
        for f in function_app.app.get_functions()
    ]
else:
    sys.path.append(sys.argv[2])
    from types import SimpleNamespace
    from azure_functions_runtime import functions, loader
    from azure_functions_runtime.bindings import meta

    # What Registry.add_indexed_function reads of the worker's protobuf module.
    protos = SimpleNamespace(BindingInfo=SimpleNamespace(in_=0, out=1, inout=2, undefined=0))
    meta.load_binding_registry()
    registry = functions.Registry()
    result["registered"] = {}
    for f in loader.index_function_app(os.path.join(os.getcwd(), "function_app.py")):
        try:
            info = registry.add_indexed_function(f, protos)
        except Exception as exc:
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        else:
            inputs = {k: v.binding_name for k, v in info.input_types.items()}
            outcome = {"ok": True, "inputs": inputs, "http": info.is_http_func}
        result["registered"][f.get_function_name()] = outcome
result["network"] = attempts
print("SAS-INDEX " + json.dumps(result))
"""

TRANSPORTS = {
    "servicebus": ("serviceBusTrigger", settings.SERVICEBUS_CONNECTION),
    "storage": ("queueTrigger", settings.STORAGE_CONNECTION),
}

NORMAL_LANES = {
    "submit": settings.QUEUE_ORDERS,
    "schedule": settings.QUEUE_SCHEDULER,
    "on_reply": settings.QUEUE_REPLIES,
    **{f"agent_{agent}": settings.agent_queue_setting(agent) for agent in AGENTS},
}
# Every lane of every queue: its own function on its own queue setting.
QUEUE_FUNCTIONS = {
    **NORMAL_LANES,
    **{f"{name}_high": f"{key}_HIGH" for name, key in NORMAL_LANES.items()},
    **{f"{name}_low": f"{key}_LOW" for name, key in NORMAL_LANES.items()},
}
HTTP_FUNCTION = "http_app_func"  # the one function of func.AsgiFunctionApp
EXPECTED = {*QUEUE_FUNCTIONS, "supervise", HTTP_FUNCTION}


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def index(
    python: Path,
    app_dir: Path,
    mode: str,
    runtime: Path | None = None,
    transport: str = "",
    app_settings: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run INDEX in `app_dir` with a clean environment: PATH, HOME, SAS_TRANSPORT and
    ``app_settings`` only."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], **(app_settings or {})}
    if transport:
        env["SAS_TRANSPORT"] = transport
    before = files_under(app_dir)
    result = run_in_package(python, app_dir, INDEX, [mode, str(runtime or "")], env, "SAS-INDEX")
    assert files_under(app_dir) == before, "indexing wrote files"
    assert result["importable"] == [], "the venv or the package holds more than the app"
    assert result["network"] == [], "importing the app touched the network"
    return result


def test_the_packaged_app_binds_the_queues_its_settings_name(
    app_python: Path, package_dir: Path
) -> None:
    named = {"SAS_QUEUE_PREFIX": "shop", settings.QUEUE_ORDERS: "incoming"}
    found = {
        f["name"]: f["queue"]
        for f in index(app_python, package_dir, "app", None, "storage", named)["functions"]
    }
    expected = settings.queue_names(named)
    assert {name: found[name] for name in QUEUE_FUNCTIONS} == {
        name: expected[key] for name, key in QUEUE_FUNCTIONS.items()
    }
    assert (found["submit"], found["submit_high"]) == ("incoming", "incoming-high")
    assert found["schedule"].startswith("shop-")


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_packaged_app_indexes_every_function_without_settings(
    app_python: Path, package_dir: Path, transport: str
):
    trigger, connection = TRANSPORTS[transport]
    found = {
        f["name"]: f
        for f in index(app_python, package_dir, "app", transport=transport)["functions"]
    }
    assert set(found) == EXPECTED
    for name, queue_setting in QUEUE_FUNCTIONS.items():
        f = found[name]
        assert (f["type"], f["queue"], f["connection"]) == (
            trigger,
            settings.DEFAULT_QUEUES[queue_setting],
            connection,
        ), name
        assert f["bindings"] == [["msg", trigger]], name
    supervise = found["supervise"]
    assert (supervise["type"], supervise["schedule"]) == (
        "timerTrigger",
        f"%{settings.SUPERVISOR_SCHEDULE}%",
    )
    assert found[HTTP_FUNCTION]["bindings"] == [["req", "httpTrigger"], ["$return", "http"]]


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_worker_registry_accepts_every_packaged_function(
    app_python: Path, package_dir: Path, runtime_dir: Path, transport: str
):
    trigger, _ = TRANSPORTS[transport]
    registered = index(app_python, package_dir, "registry", runtime_dir, transport)["registered"]
    refused = {name: r["error"] for name, r in registered.items() if not r["ok"]}
    assert refused == {}
    assert set(registered) == EXPECTED
    for name in QUEUE_FUNCTIONS:
        assert registered[name]["inputs"] == {"msg": trigger}, name
    assert registered["supervise"]["inputs"] == {"timer": "timerTrigger"}
    assert registered[HTTP_FUNCTION]["http"] is True


PROBE_APP = """
import azure.functions as func

app = func.FunctionApp()


@app.function_name("probe")
@app.{decorator}(arg_name="msg", queue_name="q", connection="C")
def probe(msg: func.{annotation}) -> None:
    pass
"""


@pytest.mark.parametrize(
    ("decorator", "annotation", "accepted"),
    [
        ("queue_trigger", "QueueMessage", True),
        ("queue_trigger", "HttpRequest", False),
        ("service_bus_queue_trigger", "ServiceBusMessage", True),
        ("service_bus_queue_trigger", "HttpRequest", False),
        # The transport mismatch the registry exists to catch for this app.
        ("service_bus_queue_trigger", "QueueMessage", False),
        ("queue_trigger", "ServiceBusMessage", False),
    ],
)
def test_the_worker_registry_refuses_a_trigger_annotated_with_the_wrong_type(
    app_python: Path,
    runtime_dir: Path,
    tmp_path: Path,
    decorator: str,
    annotation: str,
    accepted: bool,
):
    (tmp_path / "function_app.py").write_text(
        PROBE_APP.format(decorator=decorator, annotation=annotation)
    )
    probe = index(app_python, tmp_path, "registry", runtime_dir)["registered"]["probe"]
    assert probe["ok"] is accepted, probe
    if not accepted:
        assert probe["error"].startswith("FunctionLoadError"), probe
        assert annotation in probe["error"]

"""Every function of function_app.py: name, trigger type, queue setting and connection.

Trigger registration is decided at import time from SAS_TRANSPORT, and get_functions() may
be called once per import, so each transport is indexed in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sas.declared import registry

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

INDEX = """
import json, function_app
out = []
for f in function_app.app.get_functions():
    t = f.get_trigger()
    out.append({
        "name": f.get_function_name(),
        "type": t.get_binding_name(),
        "queue": getattr(t, "queue_name", None),
        "connection": getattr(t, "connection", None),
        "route": getattr(t, "route", None),
        "schedule": getattr(t, "schedule", None),
        "params": list(__import__("inspect").signature(f.get_user_function()).parameters),
        "annotation": getattr(
            next(iter(__import__("inspect").signature(f.get_user_function()).parameters.values())).annotation,
            "__name__", None),
    })
print(json.dumps(out))
"""

NORMAL_LANES = {
    "submit": "sas-orders",
    "schedule": "sas-scheduler",
    "on_reply": "sas-replies",
    # One agent function per agent the app's workflows name (workflows/: the order's three).
    **{f"agent_{agent}": f"sas-agent-{agent}" for agent in registry().agents},
}
# One function per priority lane, each on its own queue (the naming written out, not derived).
QUEUE_FUNCTIONS = {
    **NORMAL_LANES,
    **{f"{name}_high": f"{queue}-high" for name, queue in NORMAL_LANES.items()},
    **{f"{name}_low": f"{queue}-low" for name, queue in NORMAL_LANES.items()},
}


def index(transport: str | None, **settings: str) -> dict[str, dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAS_", "Sas"))}
    env.update(settings)
    if transport is not None:
        env["SAS_TRANSPORT"] = transport
    done = subprocess.run(
        [sys.executable, "-c", INDEX], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return {f["name"]: f for f in json.loads(done.stdout)}


@pytest.mark.parametrize(
    ("transport", "trigger", "connection", "message_class"),
    [
        ("storage", "queueTrigger", "SasStorage", "QueueMessage"),
        ("servicebus", "serviceBusTrigger", "SasServiceBus", "ServiceBusMessage"),
        (None, "serviceBusTrigger", "SasServiceBus", "ServiceBusMessage"),  # the Azure default
    ],
)
def test_every_queue_function_is_wired_to_its_queue(transport, trigger, connection, message_class):
    functions = index(transport)
    assert set(functions) == {*QUEUE_FUNCTIONS, "http_app_func", "supervise"}
    for name, queue in QUEUE_FUNCTIONS.items():
        wired = functions[name]
        assert (wired["type"], wired["queue"], wired["connection"]) == (
            trigger,
            queue,
            connection,
        ), name
        assert wired["params"] == ["msg"]
        assert wired["annotation"] == message_class
    timer = functions["supervise"]
    assert (timer["type"], timer["schedule"]) == ("timerTrigger", "%SAS_SUPERVISOR_SCHEDULE%")
    assert timer["params"] == ["timer", "context"]  # its invocation, for threads it runs
    http = functions["http_app_func"]
    assert http["type"] == "httpTrigger"
    assert http["params"] == ["req", "context"]


def test_the_queues_follow_the_prefix_and_their_own_settings():
    functions = index("storage", SAS_QUEUE_PREFIX="shop", SAS_QUEUE_REPLIES_LOW="late-replies")
    assert functions["submit_high"]["queue"] == "shop-orders-high"
    assert functions["on_reply_low"]["queue"] == "late-replies"


def test_importing_the_app_needs_no_settings_and_does_no_io():
    # No connection settings at all: indexing must still succeed (settings are read lazily).
    functions = index("storage")
    assert "submit" in functions


@pytest.mark.parametrize(
    ("key", "value"), [("SAS_TRANSPORT", "carrier-pigeon"), ("SAS_QUEUE_PREFIX", "Shop")]
)
def test_an_invalid_setting_fails_indexing_with_the_key_named(key, value):
    env = {**os.environ, key: value}
    done = subprocess.run(
        [sys.executable, "-c", "import function_app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert key in done.stderr

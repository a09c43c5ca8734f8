"""A workflow an application declares for itself, with Python agents, runs through the app's
own queue functions on Azurite: its agents' queues, functions and settings derive from the
declaration, a transient fault is retried, a refusal is compensated, bad details are parked,
and no effect is applied twice (tests/integration/declared_app.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sas_local.azurite import Azurite
from sas_local.processes import REPO_ROOT
from sas_local.stack import app_env

pytestmark = pytest.mark.integration


def test_a_declared_python_workflow_runs_on_azurite(azurite: Azurite) -> None:
    env = {
        **app_env(azurite.connection_string, "http://127.0.0.1:9"),
        "SAS_WORKFLOWS_MODULE": "tests.integration.declared_app",
        "SAS_QUEUE_PREFIX": "declared",
        "SAS_TABLE_NAME": "declaredorders",
        "PATH": "/usr/bin:/bin",
    }
    env = {k: v for k, v in env.items() if not k.startswith("SAS_REMOTE_")}  # no HTTP agents
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.declared_app"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["states"] == {"a1": "Processed", "a2": "Compensated"}
    assert report["effects"] == {
        "provision:a1": 1,
        "configure:a1": 1,
        "notify:a1": 1,
        "provision:a2": 1,
        "deprovision:a2": 1,
    }
    (reason,) = report["parked"]
    assert reason.startswith("invalid details: plan")
    assert report["agents"] == []  # Python agents need no remote URL
    assert {"declared-agent-cloud", "declared-agent-mailer-high"} <= set(report["queues"])

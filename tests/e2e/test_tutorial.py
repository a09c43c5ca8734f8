"""docs/your-workflow.md, followed word for word in a copy of the repository: its files written,
its commands run, then its workflow on Azurite through the dev host (as `make run` would run
it), with the post's transient faults retried and its refusal compensated."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from azure.storage.queue import QueueClient

from sas.adapters.table_store import TableStateStore
from sas.domain.model import ProcessState
from sas.domain.wire import PRIORITIES, lane_queue_name
from sas_local.ledger import configure_faults, fetch_ledger
from sas_local.processes import REPO_ROOT, wait_until
from sas_local.stack import LocalStack

pytestmark = pytest.mark.e2e

TUTORIAL = REPO_ROOT / "docs" / "your-workflow.md"
_BLOCK = re.compile(r"<!-- (file: (?P<path>\S+)|run) -->\n```\w+\n(?P<body>.*?)```", re.DOTALL)


def copy_of_the_repository(target: Path) -> Path:
    """Every file git tracks, times kept, so make sees the shared venv and node_modules (set
    up by `make setup`) as up to date and never installs into them from the copy."""
    listed = subprocess.run(
        ["git", "ls-files"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    for shared in (".venv", "node_modules"):
        (target / shared).symlink_to(REPO_ROOT / shared)
    planned = subprocess.run(
        ["make", "-n", "infra"], cwd=target, capture_output=True, text=True, check=True
    ).stdout
    assert "pip install" not in planned and "npm ci" not in planned, "run `make setup` first"
    return target


def follow(tutorial: str, root: Path) -> list[str]:
    """Write each file and run each command of the tutorial, in order; the commands run."""
    ran = []
    for block in _BLOCK.finditer(tutorial):
        if block["path"] is not None:
            (root / block["path"]).write_text(block["body"], encoding="utf-8")
            continue
        for command in block["body"].strip().splitlines():
            done = subprocess.run(  # noqa: S602 - the tutorial's own shell line, as a reader types it
                command, shell=True, cwd=root, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, f"{command}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            ran.append(command)
    return ran


def greeting(order_id: str, text: str) -> str:
    document = {
        "type": "OrderSubmitted",
        "order_id": order_id,
        "workflow": "greeting",
        "details": {"to": "Ada", "text": text},
    }
    return base64.b64encode(json.dumps(document).encode()).decode()


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    root = copy_of_the_repository(tmp_path / "repo")
    ran = follow(TUTORIAL.read_text(encoding="utf-8"), root)
    assert ran == ["make infra", ".venv/bin/python -m pytest tests/unit/test_greeting.py"]
    bicep = (root / "infra" / "main.bicep").read_text(encoding="utf-8")
    assert "'agent-cards'" in bicep and "param remotePostUrl string" in bicep
    assert "remoteCardsUrl" not in bicep  # a Python agent calls no remote service

    lanes = tuple(
        lane_queue_name(f"sas-agent-{agent}", priority)
        for agent in ("cards", "post")
        for priority in PRIORITIES
    )
    with LocalStack.start(
        workers=2,
        log_dir=tmp_path / "logs",
        app_root=root,
        extra_queues=lanes,
        remote_agents=("post",),
    ) as stack:
        store = TableStateStore.connect(stack.settings.storage, stack.settings.table_name)
        orders = QueueClient.from_connection_string(
            stack.azurite.connection_string, stack.settings.queues["SAS_QUEUE_ORDERS"]
        )

        def state_of(order_id: str) -> ProcessState | None:
            found = store.get_state(order_id)
            return (
                None if found is None or not found.value.is_terminal else found.value.process_state
            )

        # Seeded: the first post of kind-1 fails (503 or 429), the next goes through.
        configure_faults(stack.simulator_url, {"seed": 2, "transient_rate": 0.5})
        orders.send_message(greeting("kind-1", "happy birthday"))
        wait_until(lambda: state_of("kind-1"), timeout=120, what="the greeting posted")
        configure_faults(stack.simulator_url, {"permanent_rate": 1.0})  # the post refuses
        orders.send_message(greeting("kind-2", "hello"))
        wait_until(lambda: state_of("kind-2"), timeout=120, what="the refused greeting")
        ledger = fetch_ledger(stack.simulator_url)
        stats = ledger["stats"]
        assert isinstance(stats, dict) and stats["post"]["transient_failures"] >= 1  # retried
        assert state_of("kind-1") is ProcessState.PROCESSED
        assert state_of("kind-2") is ProcessState.COMPENSATED
        first = store.get_state("kind-1")
        assert first is not None
        assert first.value.results["write"] == {"card": "Dear Ada, happy birthday"}
        kinds = [entry.kind for entry in store.get_history("kind-2")]
        assert "refused" in kinds and "undone" in kinds  # post refused, then the card shredded
    effects = ledger["effects"]
    assert isinstance(effects, list)
    posted = [e for e in effects if e["service"] == "post"]
    assert [(e["order_id"], e["kind"]) for e in posted] == [("kind-1", "do")]  # once, only

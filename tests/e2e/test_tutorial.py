"""docs/your-workflow.md, followed word for word in a copy of the repository: its files written,
its commands run, its services started (``serve``) and stopped (``stop``) as a reader would in
other terminals; its workflow, one step of each failure policy, run on Azurite against the
reader's own post office in both local layouts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from sas_local.processes import REPO_ROOT, ManagedProcess, start_process, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

TUTORIAL = REPO_ROOT / "docs" / "your-workflow.md"
_BLOCK = re.compile(
    r"<!-- (?:file: (?P<path>\S+)|(?P<run>run)|serve: (?P<ready>[^\n]*?)) -->\n```\w+\n"
    r"(?P<body>.*?)```|<!-- (?P<stop>stop) -->",
    re.DOTALL,
)
POST_OFFICE = "http://127.0.0.1:8071"
ENDS = {
    "ada": ("Processed", True),
    "cy": ("Processed", False),
    "nobody": ("Compensated", False),
    "di": ("Error", False),
}
"""How each card the tutorial submits ends, and whether its sender was told."""


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


def follow(
    tutorial: str, root: Path, logs: Path, at_stop: Callable[[list[str]], None]
) -> list[str]:
    """Write each file, run each command, start each service (until its ready line) and stop
    the last one still running at each ``stop``, in order; ``at_stop`` first checks what the
    commands since the last stop did. Returns the commands run; every service is stopped."""
    # The shared venv's editable install points at the repository the copy was made from: the
    # copy's own packages (its workflows/) must come first, as in a reader's clone.
    env = {**os.environ, "PYTHONPATH": str(root)}
    ran: list[str] = []
    since: list[str] = []
    serving: list[ManagedProcess] = []
    try:
        for block in _BLOCK.finditer(tutorial):
            if block["path"] is not None:
                (root / block["path"]).parent.mkdir(parents=True, exist_ok=True)
                (root / block["path"]).write_text(block["body"], encoding="utf-8")
            elif block["stop"] is not None:
                at_stop(since)
                since = []
                serving.pop().stop(grace=60)
            elif block["ready"] is not None:
                command = block["body"].strip()
                service = start_process(
                    ["bash", "-c", command], env=env, cwd=root, log_dir=logs / f"serve-{len(ran)}"
                )
                serving.append(service)
                service.wait_for_line(block["ready"], timeout=600)
                ran.append(command)
            else:
                for command in block["body"].strip().splitlines():
                    done = subprocess.run(  # noqa: S602 - the tutorial's own shell line
                        command, shell=True, cwd=root, env=env, capture_output=True, text=True,
                        timeout=600,
                    )  # fmt: skip
                    assert done.returncode == 0, (
                        f"{command}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
                    )
                    ran.append(command)
                    since.append(command)
    finally:
        for service in reversed(serving):
            service.stop(grace=60)
    return ran


def sas(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, as the tutorial's reader runs it in the copy."""
    return subprocess.run(
        [".venv/bin/sas", *args], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def status(root: Path, order_id: str) -> dict[str, object]:
    """``sas status --json`` of the order; empty while there is none yet."""
    done = sas(root, "status", order_id, "--json")
    found: dict[str, object] = json.loads(done.stdout) if done.returncode == 0 else {}
    return found


def test_the_tutorial_runs_as_written_in_both_layouts(tmp_path: Path) -> None:
    root = copy_of_the_repository(tmp_path / "repo")
    checked: list[list[str]] = []

    def cards_ended_as_the_tutorial_says(commands: list[str]) -> None:
        submitted = [re.search(r"--order-id (\S+)", c) for c in commands if " submit " in c]
        ids = [found[1] for found in submitted if found is not None]
        assert len(ids) == len(ENDS)

        def ended() -> bool:
            return all(status(root, i).get("finished_at") for i in ids)

        wait_until(ended, timeout=300, interval=2, what="the tutorial's cards to end")
        sent = httpx.get(POST_OFFICE, timeout=10).json()
        for order_id in ids:
            state, told = ENDS[order_id.split("-")[0]]
            found = status(root, order_id)
            assert found["process_state"] == state, (order_id, found)
            history = sas(root, "history", order_id, "--json").stdout
            steps = {step["name"] for step in json.loads(history)["steps"]}
            assert ("tell_sender" in steps) is told, (order_id, steps)
        posted = [key for key in sent if key.split(":")[0] in ids]
        assert sorted(k.split(":")[0] for k in posted) == sorted(
            i for i in ids if not i.startswith("nobody")
        )  # each card posted once; the refused one never
        checked.append(ids)

    ran = follow(
        TUTORIAL.read_text(encoding="utf-8"), root, tmp_path / "logs",
        cards_ended_as_the_tutorial_says,
    )  # fmt: skip
    assert ran[:2] == ["make infra", ".venv/bin/python -m pytest tests/unit/test_greeting.py"]
    assert len(checked) == 2  # the shared layout, then Flex
    bicep = (root / "infra" / "main.bicep").read_text(encoding="utf-8")
    assert "'agent-cards'" in bicep and "param remotePostUrl string" in bicep
    assert "remoteCardsUrl" not in bicep  # a Python agent calls no remote service

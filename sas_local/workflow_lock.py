"""The lock of every workflow version the app has declared (infra/workflows.lock.json).

Orders are bound to their workflow's version and run on its definition (``Workflow.definition``)
to their end; a host whose definition of that version differs keeps them waiting. So a version,
once declared, must not change: a change of steps is a new version beside it. ``make infra``
adds each new version to the lock and never rewrites one; it refuses, naming what changed, when
a declared version differs from its locked definition (tests/unit/test_workflow_lock.py fails
the same way). A version removed from the app stays locked: declaring it again means the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sas.domain.workflow import Registry

LOCK = Path(__file__).resolve().parents[1] / "infra" / "workflows.lock.json"

Lock = dict[str, dict[str, Any]]
"""``"<workflow> v<version>"`` -> that version's definition and fingerprint."""


def read(path: Path = LOCK) -> Lock:
    if not path.exists():
        return {}
    found: Lock = json.loads(path.read_text(encoding="utf-8"))
    return found


def render(lock: Mapping[str, Any]) -> str:
    return json.dumps(dict(sorted(lock.items())), indent=2) + "\n"


def changes(registry: Registry, lock: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each declared version whose definition differs from its locked one, and how."""
    found = []
    for workflow in registry.workflows:
        locked = lock.get(workflow.label)
        if locked is None or locked["fingerprint"] == workflow.fingerprint:
            continue
        what = "; ".join(differences(locked["definition"], workflow.definition))
        found.append(
            f"{workflow.label} changed since it was locked ({what}): orders bound to it would "
            f"wait; declare the change as version {max(registry.versions(workflow.name)) + 1} "
            "beside it (docs/your-workflow.md, 'Changing a workflow')"
        )
    return found


def locked(registry: Registry, lock: Mapping[str, Mapping[str, Any]]) -> Lock:
    """``lock`` with every declared version not in it yet; no entry ever changes."""
    updated: Lock = {label: dict(entry) for label, entry in lock.items()}
    for workflow in registry.workflows:
        updated.setdefault(
            workflow.label,
            {"fingerprint": workflow.fingerprint, "definition": workflow.definition},
        )
    return updated


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two definitions, step by step, in words."""
    found = []
    if old["on_failure"] != new["on_failure"]:
        found.append(f"on_failure {old['on_failure']} -> {new['on_failure']}")
    before = [step["name"] for step in old["steps"]]
    after = [step["name"] for step in new["steps"]]
    for index in range(max(len(before), len(after))):
        was = old["steps"][index] if index < len(before) else None
        now = new["steps"][index] if index < len(after) else None
        if was == now:
            continue
        if was is None:
            found.append(f"step {index} {now['name']!r} added")  # type: ignore[index]
        elif now is None:
            found.append(f"step {index} {was['name']!r} removed")
        elif was["name"] != now["name"]:
            moved = now["name"] in before
            verb = "now" if moved else "renamed"
            found.append(f"step {index} {was['name']!r} {verb} {now['name']!r}")
        else:
            fields = [k for k in ("agent", "action", "undo") if was[k] != now[k]]
            found.append(f"step {index} {was['name']!r}: {', '.join(fields)} changed")
    return found or ["definition changed"]

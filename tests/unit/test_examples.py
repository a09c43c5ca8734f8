"""Every failure mode at every step of both example workflows (workflows/), in memory: each run
ends as the workflow's failure policy says, with each effect applied once, every compensated
effect undone and one alert per Error. The app's own examples, so this file imports them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sas.domain.model import ProcessState
from sas.domain.workflow import StepDefinition, Workflow
from sas.testing import Harness, Outcome, crash_before_reply, fault, refuse, too_slow
from tests.unit.test_workspace import MemoryEffects
from workflows import REGISTRY, workspace

pytestmark = [pytest.mark.unit, pytest.mark.fast]

DETAILS: dict[str, dict[str, Any]] = {
    "order": {
        "customer_id": "c1",
        "currency": "EUR",
        "address": "1 Main St",
        "lines": [{"sku": "s1", "quantity": 2, "unit_price_cents": 100}],
    },
    "workspace": {"team": "Blue", "owner": "ada@example.com", "plan": "team", "region": "eastus"},
}
MAX_FAILURES = 3


def _slow(step: StepDefinition) -> Outcome:
    return too_slow(step.budget.total_seconds() + 5)


MODES: dict[str, Callable[[StepDefinition], tuple[Outcome, ...]]] = {
    "transient fault": lambda step: (fault("HTTP 503"), fault("timeout", retry_after=1)),
    "too slow once": lambda step: (_slow(step),),
    "crash before the reply": lambda step: (crash_before_reply(),),
    "refused": lambda step: (refuse("no"),),
    "too slow every time": lambda step: (_slow(step),) * 10,
}
RECOVERED = {"transient fault", "too slow once", "crash before the reply"}


EXAMPLES = tuple(map(REGISTRY.named, DETAILS))
"""The examples (an application may declare more beside them)."""


def _cases() -> Iterator[Any]:
    for workflow in EXAMPLES:
        for step in workflow.steps:
            for mode in MODES:
                yield pytest.param(workflow, step, mode, id=f"{workflow.name}-{step.name}-{mode}")


@pytest.fixture(autouse=True)
def effects(monkeypatch: pytest.MonkeyPatch) -> MemoryEffects:
    """The workspace agents' table, in memory."""
    found = MemoryEffects()
    monkeypatch.setattr(workspace, "EFFECTS", found)
    return found


def run(workflow: Workflow, *scripts: tuple[StepDefinition, str, tuple[Outcome, ...]]) -> Harness:
    harness = Harness(REGISTRY, max_failures=MAX_FAILURES)
    for step, action, outcomes in scripts:
        harness.script(step.agent, action, *outcomes)
    harness.submit(workflow.name, DETAILS[workflow.name], order_id="o1")
    harness.run()
    assert not harness.unused() or any(len(o) > MAX_FAILURES for _, _, o in scripts)
    return harness


def check_promises(harness: Harness, workflow: Workflow, effects: MemoryEffects) -> ProcessState:
    """What holds however a run ended: one effect per step at most, undone if compensated."""
    state = harness.state("o1")
    assert state.is_terminal and not state.alert_pending
    done_keys = {c.key for c in harness.calls if not c.key.endswith(":undo")}
    for step in workflow.steps:
        keys = {c.key for c in harness.calls if c.action == step.action}
        assert keys <= {harness.key("o1", step.name)}, keys  # every attempt under the one key
    alerts = [a for a in harness.alerts if a.order_id == "o1"]
    assert len(alerts) == (1 if state.process_state is ProcessState.ERROR else 0)
    if state.process_state is ProcessState.COMPENSATED:
        applied = harness.remote.applied("o1")
        assert all(applied.values()), applied  # every effect applied was undone
    if state.process_state is ProcessState.PROCESSED:
        assert {harness.key("o1", step.name) for step in workflow.steps} <= done_keys
        assert state.results.keys() == {step.name for step in workflow.steps}
    if workflow.name == "workspace":  # the agents' own record: each action applied once
        actions = effects.actions("o1")
        assert len(actions) == len(set(actions)), actions
    return state.process_state


@pytest.mark.parametrize(("workflow", "step", "mode"), list(_cases()))
def test_each_failure_mode_at_each_step_ends_as_the_workflow_says(
    workflow: Workflow, step: StepDefinition, mode: str, effects: MemoryEffects
) -> None:
    harness = run(workflow, (step, step.action, MODES[mode](step)))
    ended = check_promises(harness, workflow, effects)
    if mode in RECOVERED:
        assert ended is ProcessState.PROCESSED
    elif workflow.on_failure == "error":
        assert ended is ProcessState.ERROR
    else:
        assert ended is ProcessState.COMPENSATED
    if mode.startswith("too slow"):
        assert f"expired_retry:{step.name}" in harness.history("o1")


@pytest.mark.parametrize("workflow", EXAMPLES, ids=lambda w: w.name)
def test_every_message_delivered_twice_changes_nothing(
    workflow: Workflow, effects: MemoryEffects
) -> None:
    harness = Harness(REGISTRY, duplicate_deliveries=True)
    harness.submit(workflow.name, DETAILS[workflow.name], order_id="o1")
    harness.run()
    assert check_promises(harness, workflow, effects) is ProcessState.PROCESSED
    assert harness.statuses("o1").count("completed") == 1
    steps = workflow.steps
    assert f"reply_dropped:{steps[0].name}" in harness.history("o1")  # the copy, fenced
    assert [c.action for c in harness.calls].count(steps[0].action) >= 2  # the copies ran
    if workflow.name == "workspace":
        assert effects.actions("o1") == sorted(step.action for step in steps)
    else:
        assert harness.effects == {f"o1:{step.name}" for step in steps}


def _undo_cases() -> Iterator[Any]:
    for workflow in EXAMPLES:
        undone = [s for s in workflow.steps[:-1] if s.undo is not None]
        for step in undone:
            yield pytest.param(workflow, step, id=f"{workflow.name}-{step.name}")


@pytest.mark.parametrize(("workflow", "step"), list(_undo_cases()))
def test_an_undo_refused_ends_in_error_with_one_alert(
    workflow: Workflow, step: StepDefinition, effects: MemoryEffects
) -> None:
    last = workflow.steps[-1]
    assert step.undo is not None
    harness = run(workflow, (last, last.action, (refuse("no"),)), (step, step.undo, (refuse(),)))
    assert check_promises(harness, workflow, effects) is ProcessState.ERROR
    assert harness.history("o1")[-1] == f"refused:{step.name}"  # the undo's refusal ended it

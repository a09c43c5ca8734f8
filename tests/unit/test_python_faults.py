"""The local runs' faults in front of Python actions (sas_local/python_faults.py): where each
fault falls relative to the action's effect, fixed by the seed, and counted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sas.actions import ActionContext, PythonAgent, Refused, Transient
from sas.domain.workflow import Registry, StepDefinition, Workflow
from sas.services.store_time import SystemClock
from sas_local.chaos.inject import count_events
from sas_local.python_faults import PythonFaults, faulty

pytestmark = [pytest.mark.unit, pytest.mark.fast]

STEP = StepDefinition("make", "maker", "make", timedelta(seconds=5))
FLOW = Workflow("flow", (STEP,))


def registry(applied: list[str]) -> Registry:
    def make(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
        applied.append(context.idempotency_key)
        return {"made": True}

    maker = PythonAgent("maker", {"make": make}, ("makes",), settings={"MAKER_URL": "x"})
    return Registry((FLOW,), python_agents=(maker,))


def call(found: Registry, key: str, attempt: int = 1) -> Any:
    context = ActionContext(
        order_id="o1",
        agent="maker",
        step="make",
        action="make",
        mode="do",
        attempt=attempt,
        idempotency_key=key,
        deadline=datetime.now(UTC) + timedelta(seconds=5),
        clock=SystemClock(),
    )
    return found.python_agents[0].actions["make"](context, {})


def outcomes(found: Registry, keys: list[str], attempt: int = 1) -> list[str]:
    seen = []
    for key in keys:
        try:
            call(found, key, attempt)
            seen.append("ok")
        except Transient as exc:
            seen.append(exc.reason.rsplit(" ", 2)[-2])  # "transient" or "lost"
        except Refused:
            seen.append("refused")
    return seen


def test_a_transient_fault_comes_before_the_effect_a_lost_reply_after_it() -> None:
    applied: list[str] = []
    before = faulty(registry(applied), PythonFaults(transient_rate=1.0))
    assert outcomes(before, ["k1"]) == ["transient"] and applied == []
    after = faulty(registry(applied), PythonFaults(lost_reply_rate=1.0))
    assert outcomes(after, ["k1"]) == ["lost"] and applied == ["k1"]


def test_a_refusal_is_fixed_per_key_and_applies_nothing() -> None:
    applied: list[str] = []
    found = faulty(registry(applied), PythonFaults(seed=3, permanent_rate=0.5))
    keys = [f"o{n}:make" for n in range(40)]
    first = outcomes(found, keys)
    assert outcomes(found, keys) == first  # every retry of a key gets the same answer
    assert 5 < first.count("refused") < 35
    assert len(applied) == 2 * first.count("ok")


def test_the_same_seed_gives_the_same_faults_and_each_is_counted(tmp_path: Path) -> None:
    keys = [f"o{n}:make" for n in range(60)]
    config = PythonFaults(seed=9, transient_rate=0.3, lost_reply_rate=0.3, events=str(tmp_path))
    one, two = faulty(registry([]), config), faulty(registry([]), config)
    seen = outcomes(one, keys)
    assert outcomes(two, keys) == seen
    counts = count_events(tmp_path)
    assert counts == {
        "python_transient": 2 * seen.count("transient"),
        "python_lost_reply": 2 * seen.count("lost"),
    }
    assert counts["python_transient"] and counts["python_lost_reply"]


def test_a_retry_rolls_again_on_whichever_host_runs_it() -> None:
    """Each attempt in a fresh host, as retries land after kills and restarts."""
    keys = [f"o{n}:make" for n in range(200)]
    config = PythonFaults(seed=5, lost_reply_rate=0.5)

    def lost(attempt: int) -> set[str]:
        seen = outcomes(faulty(registry([]), config), keys, attempt)
        return {key for key, outcome in zip(keys, seen, strict=True) if outcome == "lost"}

    first, second, third = lost(1), lost(2), lost(3)
    assert 60 < len(first) < 140
    assert 5 < len(first & second & third) < 50  # about 1 in 8: not every key hit first
    assert lost(2) == second  # the same attempt on another host: the same answer


def test_the_wrapped_registry_keeps_its_agents_tables_settings_and_steps() -> None:
    found = faulty(registry([]), PythonFaults())
    assert found.tables == ("makes",)
    assert found.settings == {"MAKER_URL": "x"}
    assert found.workflows == (FLOW,)
    assert call(found, "k") == {"made": True}

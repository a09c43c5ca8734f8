"""Reads the simulated remote service's ledger and checks effects against order outcomes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import httpx

from sas.domain.model import ProcessState
from sas.domain.workflow import Workflow


@dataclass(frozen=True)
class LedgerReport:
    effects: int
    by_service: Mapping[str, int]
    replays: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def fetch_ledger(simulator_url: str) -> dict[str, object]:
    response = httpx.get(f"{simulator_url}/ledger", timeout=10)
    response.raise_for_status()
    ledger: dict[str, object] = response.json()
    return ledger


def check_effects(
    ledger: Mapping[str, object],
    outcomes: Mapping[str, ProcessState],
    workflow: Workflow,
) -> LedgerReport:
    """Every Processed order has exactly one effect per step; no effect belongs to no order."""
    raw_effects = ledger.get("effects", [])
    effects: list[Mapping[str, object]] = (
        list(raw_effects) if isinstance(raw_effects, Iterable) else []
    )
    per_order_step = Counter(
        (str(e.get("order_id")), str(e.get("service")), str(e.get("action"))) for e in effects
    )
    problems = [
        f"{order}: {service}.{action} applied {count} times"
        for (order, service, action), count in per_order_step.items()
        if count > 1
    ]
    for order_id, state in outcomes.items():
        if state is not ProcessState.PROCESSED:
            continue
        for step in workflow.steps:
            if per_order_step[(order_id, step.agent, step.action)] != 1:
                problems.append(f"{order_id}: {step.agent}.{step.action} not applied exactly once")
    strangers = {str(e.get("order_id")) for e in effects} - set(outcomes)
    problems.extend(f"effect for unknown order {order}" for order in sorted(strangers))
    replays = ledger.get("replays", 0)
    return LedgerReport(
        effects=len(effects),
        by_service=dict(Counter(str(e.get("service")) for e in effects)),
        replays=replays if isinstance(replays, int) else 0,
        problems=problems,
    )

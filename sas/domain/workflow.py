"""Workflows are data: an ordered list of steps, each naming its agent and its budget.

The Scheduler drives a workflow definition; it knows nothing of the business operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from sas.domain.wire import STEP_NAME


@dataclass(frozen=True)
class StepDefinition:
    name: str
    agent: str
    action: str
    budget: timedelta
    """Complete-by budget: how long one attempt of this step may take, end to end."""
    undo: str | None = None
    """The compensating action (same agent), or None if the step needs no undoing."""

    def __post_init__(self) -> None:
        labelled = [("step name", self.name), ("agent", self.agent), ("action", self.action)]
        if self.undo is not None:
            labelled.append(("undo action", self.undo))
        for label, value in labelled:
            if not STEP_NAME.matches(value):
                raise ValueError(f"{label} {value!r} must match {STEP_NAME.body}")
        if self.budget <= timedelta(0):
            raise ValueError(f"step {self.name!r}: budget must be positive")


@dataclass(frozen=True)
class Workflow:
    name: str
    steps: tuple[StepDefinition, ...]
    pickup_budget: timedelta = timedelta(minutes=2)
    """How long a Pending record may wait for a Scheduler before the Supervisor acts."""
    on_failure: Literal["compensate", "error"] = "compensate"
    """When a step fails for good: undo the completed steps, or stop in Error for an operator."""

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError(f"workflow {self.name!r} has no steps")
        names = [step.name for step in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"workflow {self.name!r} repeats a step name")

    def step(self, index: int) -> StepDefinition:
        if not 0 <= index < len(self.steps):
            raise IndexError(f"workflow {self.name!r} has no step {index}")
        return self.steps[index]

    def next_undo(self, index: int) -> int | None:
        """The highest step at or below ``index`` that has an undo action."""
        for candidate in range(min(index, len(self.steps) - 1), -1, -1):
            if self.steps[candidate].undo is not None:
                return candidate
        return None

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(step.agent for step in self.steps))

    @property
    def longest_budget(self) -> timedelta:
        return max(step.budget for step in self.steps)

    @property
    def shortest_budget(self) -> timedelta:
        """No transition sets a deadline nearer than this to its own time."""
        return min(self.pickup_budget, *(step.budget for step in self.steps))


_BUDGET = timedelta(seconds=15)

ORDER_WORKFLOW = Workflow(
    name="order",
    steps=(
        StepDefinition("reserve", "inventory", action="reserve", budget=_BUDGET, undo="release"),
        StepDefinition("charge", "payment", action="charge", budget=_BUDGET, undo="refund"),
        StepDefinition("ship", "shipping", action="ship", budget=_BUDGET, undo="cancel"),
    ),
    pickup_budget=timedelta(seconds=60),
)

WORKFLOWS: dict[str, Workflow] = {ORDER_WORKFLOW.name: ORDER_WORKFLOW}
AGENTS: tuple[str, ...] = tuple(
    dict.fromkeys(agent for workflow in WORKFLOWS.values() for agent in workflow.agents)
)


def longest_step_budget() -> timedelta:
    """No attempt of any step may take longer: an agent never works past it, whatever
    deadline a (forged or corrupted) request names."""
    return max(workflow.longest_budget for workflow in WORKFLOWS.values())


def shortest_budget() -> timedelta:
    """No transition of any workflow sets a deadline nearer than this to its own time."""
    return min(workflow.shortest_budget for workflow in WORKFLOWS.values())


def workflow_named(name: str) -> Workflow:
    try:
        return WORKFLOWS[name]
    except KeyError:
        raise ValueError(f"unknown workflow {name!r}") from None

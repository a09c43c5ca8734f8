"""A workflow version, once declared, keeps its definition (sas_local/workflow_lock.py): the
app's versions match infra/workflows.lock.json, and a change made in place is named."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sas.declared import registry
from sas.domain.workflow import Registry, StepDefinition, Workflow
from sas_local import workflow_lock

pytestmark = [pytest.mark.unit, pytest.mark.fast]

BUDGET = timedelta(seconds=15)
FLIGHT = StepDefinition("flight", "flights", "book", BUDGET, undo="cancel")
HOTEL = StepDefinition("hotel", "hotels", "book", BUDGET, undo="cancel")
TRIP = Workflow("trip", (FLIGHT, HOTEL))


@pytest.mark.parametrize("workflow", registry().workflows, ids=lambda w: w.label)
def test_every_declared_version_is_locked_as_it_is(workflow: Workflow) -> None:
    lock = workflow_lock.read()
    assert workflow.label in lock, "a new version: run `make infra` to lock it"
    assert workflow_lock.changes(Registry((workflow,)), lock) == []


def test_a_step_renamed_in_place_is_named_and_a_new_version_is_not() -> None:
    lock = workflow_lock.locked(Registry((TRIP,)), {})
    airfare = StepDefinition("airfare", "flights", "book", BUDGET, undo="cancel")
    in_place = Workflow("trip", (airfare, HOTEL))
    (problem,) = workflow_lock.changes(Registry((in_place,)), lock)
    assert "trip v1 changed since it was locked" in problem
    assert "step 0 'flight' renamed 'airfare'" in problem
    assert "declare the change as version 2" in problem
    as_version = Workflow("trip", (airfare, HOTEL), version=2)
    both = Registry((TRIP, as_version))
    assert workflow_lock.changes(both, lock) == []
    assert set(workflow_lock.locked(both, lock)) == {"trip v1", "trip v2"}


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        ((HOTEL, FLIGHT), "step 0 'flight' now 'hotel'"),
        ((FLIGHT,), "step 1 'hotel' removed"),
        ((FLIGHT, HOTEL, StepDefinition("pay", "payment", "charge", BUDGET)), "'pay' added"),
        ((FLIGHT, StepDefinition("hotel", "hotels", "book", BUDGET)), "'hotel': undo changed"),
    ],
    ids=["swap", "remove", "append", "undo"],
)
def test_each_kind_of_change_is_named(steps: tuple[StepDefinition, ...], said: str) -> None:
    lock = workflow_lock.locked(Registry((TRIP,)), {})
    (problem,) = workflow_lock.changes(Registry((Workflow("trip", steps),)), lock)
    assert said in problem


def test_a_budget_may_change_under_running_orders() -> None:
    lock = workflow_lock.locked(Registry((TRIP,)), {})
    slower = StepDefinition("flight", "flights", "book", BUDGET * 4, undo="cancel")
    assert workflow_lock.changes(Registry((Workflow("trip", (slower, HOTEL)),)), lock) == []


def test_a_removed_version_stays_locked() -> None:
    lock = workflow_lock.locked(Registry((TRIP,)), {})
    later = Workflow("trip", (FLIGHT,), version=2)
    assert set(workflow_lock.locked(Registry((later,)), lock)) == {"trip v1", "trip v2"}

"""Fixtures for integration tests: a World on this test's Azurite table, a strict workflow."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sas.domain.workflow import StepDefinition, Workflow
from tests.harness import BUDGET, World
from tests.instances import WORKFLOWS


@pytest.fixture
def world(table) -> World:
    return World(table)


@pytest.fixture
def strict(monkeypatch) -> str:
    """A workflow that stops in Error for an operator instead of compensating."""
    workflow = Workflow(
        "strict",
        (
            StepDefinition("reserve", "inventory", "reserve", timedelta(seconds=BUDGET), "release"),
            StepDefinition("charge", "payment", "charge", timedelta(seconds=BUDGET), "refund"),
        ),
        pickup_budget=timedelta(seconds=60),
        on_failure="error",
    )
    monkeypatch.setitem(WORKFLOWS, workflow.name, workflow)
    return workflow.name

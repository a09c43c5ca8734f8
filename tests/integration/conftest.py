"""Fixtures for integration tests: a World on this test's Azurite table."""

from __future__ import annotations

import pytest

from tests.harness import World
from tests.workflows import STRICT


@pytest.fixture
def world(table) -> World:
    return World(table)


@pytest.fixture
def strict() -> str:
    """A workflow that stops in Error for an operator instead of compensating."""
    return STRICT.name

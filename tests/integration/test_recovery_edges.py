"""Edges found in review that need the real table or the app's bootstrap: a row the adapter
reads back broken, and the HTTP API's answer to a lost race. The rest of the recovery edges,
decided by the domain, run in memory (tests/unit/test_recovery_edges.py)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from sas.domain.errors import ConcurrencyConflict
from sas.domain.transitions import initial_state
from tests.unit.test_failure_modes import order
from tests.workflows import SHOP

pytestmark = pytest.mark.integration


def test_one_broken_order_does_not_stop_the_sweep(world, table):
    broken = initial_state("a-broken", SHOP, reply_to=None, now=world.clock.now())
    table.create_entity(
        {"PartitionKey": "a-broken", "RowKey": "state", "Workflow": "renamed-by-a-deploy",
         "ProcessState": "Processing", "FailureCount": 0, "Attempt": 1, "StepIndex": 0,
         "SubmittedAt": broken.submitted_at, "UpdatedAt": broken.updated_at,
         "CompleteBy": world.clock.now()}
    )  # fmt: skip
    world.store.touch_live("a-broken", world.clock.now(), world.clock.now())
    oid = order(world, "b-healthy")  # listed after the broken one
    world.drop("agent-inventory")
    report = world.tick(61)
    assert report["failed"] == 1
    assert world.state(oid).failure_count == 1  # still examined and recovered


def test_two_operators_resubmitting_at_once_get_one_success_and_a_conflict(app_env, monkeypatch):
    from sas import bootstrap
    from sas.entrypoints.http_api import api

    def conflict(order_id, *, actor):
        raise ConcurrencyConflict("state changed since read")

    monkeypatch.setattr(bootstrap.operator(), "resubmit", conflict)
    assert TestClient(api).post("/api/orders/o1/resubmit").status_code == 409

"""The workspace workflow (workflows/workspace.py) in memory through sas.testing: its Python
agents' real functions, their effects kept by an in-memory stand-in for the table."""

from __future__ import annotations

from typing import Any

import pytest

from sas.actions import ActionContext, Refused
from sas.testing import Harness, ProcessState, crash_before_reply, fault, refuse, too_slow
from workflows import REGISTRY, workspace

pytestmark = [pytest.mark.unit, pytest.mark.fast]

REQUEST = {"team": "Blue", "owner": "ada@example.com", "plan": "team", "region": "eastus"}
STEPS = ("create", "configure", "notify")


class MemoryEffects:
    """The table's rule in memory: the first effect per idempotency key stands."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], tuple[str, str, str, dict[str, Any]]] = {}
        self.tries = 0

    def once(
        self, context: ActionContext, data: dict[str, Any], result: dict[str, Any]
    ) -> dict[str, Any]:
        self.tries += 1
        key = (context.order_id, context.idempotency_key)
        row = self.rows.setdefault(
            key, (context.agent, context.action, workspace.digest(data), result)
        )
        if row[2] != workspace.digest(data):
            raise Refused("this idempotency key was used for another request")
        return row[3]

    def actions(self, order_id: str) -> list[str]:
        return sorted(row[1] for (order, _), row in self.rows.items() if order == order_id)


@pytest.fixture
def effects(monkeypatch: pytest.MonkeyPatch) -> MemoryEffects:
    found = MemoryEffects()
    monkeypatch.setattr(workspace, "EFFECTS", found)
    return found


def test_a_workspace_is_created_configured_and_announced(effects: MemoryEffects) -> None:
    harness = Harness(REGISTRY)
    order_id = harness.submit("workspace", REQUEST)
    harness.run()
    state = harness.state(order_id)
    assert state.process_state is ProcessState.PROCESSED
    created = state.results["create"]
    assert state.results["configure"] == {
        "workspace_id": created["workspace_id"],
        "plan": "team",
        "seats": 50,
    }
    notify = next(call for call in harness.calls if call.action == "notify")
    assert notify.data["url"] == created["url"] == "https://blue.eastus.example.net"
    assert effects.actions(order_id) == ["configure", "create", "notify"]


def test_a_refused_step_stops_in_error_with_an_alert_and_nothing_undone(
    effects: MemoryEffects,
) -> None:
    harness = Harness(REGISTRY)
    order_id = harness.submit(
        "workspace", {**REQUEST, "plan": "enterprise", "region": "australiaeast"}
    )
    harness.run()
    assert harness.state(order_id).process_state is ProcessState.ERROR
    assert [alert.order_id for alert in harness.alerts] == [order_id]
    assert [call.action for call in harness.calls] == ["create", "configure"]
    assert effects.actions(order_id) == ["create"]  # left for the operator


def test_a_lost_reply_is_retried_and_the_effect_stands_once(effects: MemoryEffects) -> None:
    harness = Harness(REGISTRY)
    harness.script("cloud", "create", crash_before_reply())  # create runs, its reply is lost
    order_id = harness.submit("workspace", REQUEST)
    harness.run()
    assert harness.state(order_id).process_state is ProcessState.PROCESSED
    assert [c.action for c in harness.calls].count("create") == 2
    assert effects.actions(order_id) == ["configure", "create", "notify"]


@pytest.mark.parametrize(
    ("outcome", "expiries", "notified"),
    [(fault(), 5, False), (too_slow(30), 5, True), (refuse("mailbox full"), 0, False)],
    ids=["fault", "slow", "refused"],
)
def test_notify_failing_for_good_stops_in_error(
    effects: MemoryEffects, outcome: Any, expiries: int, notified: bool
) -> None:
    harness = Harness(REGISTRY)
    harness.script("mailer", "notify", *[outcome] * 40)
    order_id = harness.submit("workspace", REQUEST)
    harness.run()
    state = harness.state(order_id)
    assert state.process_state is ProcessState.ERROR
    expired = [line for line in harness.history(order_id) if line.startswith("expired_")]
    assert len(expired) == expiries  # notify's own threshold (5), not the app's 3
    # A slow notify ran (its effect applied once, under its one key), its answers too late.
    assert effects.actions(order_id) == ["configure", "create", *(["notify"] * notified)]
    assert len(harness.alerts) == 1


def test_duplicate_deliveries_apply_each_effect_once(effects: MemoryEffects) -> None:
    harness = Harness(REGISTRY, duplicate_deliveries=True)
    order_id = harness.submit("workspace", REQUEST)
    harness.run()
    assert harness.state(order_id).process_state is ProcessState.PROCESSED
    assert effects.tries > len(STEPS)
    assert effects.actions(order_id) == ["configure", "create", "notify"]


def test_a_request_the_schema_refuses_is_parked_unapplied(effects: MemoryEffects) -> None:
    harness = Harness(REGISTRY)
    harness.submit("workspace", {**REQUEST, "owner": "not an address"}, order_id="w1")
    harness.run()
    with pytest.raises(LookupError):
        harness.state("w1")
    assert harness.calls == [] and effects.rows == {}


def test_an_order_id_used_again_after_a_purge_gets_new_keys_and_new_effects(
    effects: MemoryEffects,
) -> None:
    """An order id purged and submitted again is another incarnation: its steps are called
    with keys of their own, so the first order's effects are neither replayed to it nor
    taken for its own."""
    first = Harness(REGISTRY)
    first.submit("workspace", REQUEST, order_id="w1")
    first.run()
    again = Harness(REGISTRY)  # the first one's records are gone, its effects are not
    again.submit("workspace", {**REQUEST, "team": "Red", "plan": "free"}, order_id="w1")
    again.run()
    assert again.state("w1").process_state is ProcessState.PROCESSED
    assert again.state("w1").incarnation != first.state("w1").incarnation
    assert effects.tries == 6 and len(effects.rows) == 6
    assert again.key("w1", "create") != first.key("w1", "create")

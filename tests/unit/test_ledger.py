"""The ledger checks: a clean run reports nothing; each class of problem is found.

Ledgers come from the simulator itself where that is natural (so the checks and the ledger
they read cannot drift apart), and are written by hand for states the simulator refuses to
produce (an effect applied twice, an undo applied twice).
"""

from __future__ import annotations

from enum import StrEnum

import httpx
import pytest

from sas.domain.model import ProcessState
from sas_local.ledger import check_effects, configure_faults, fetch_ledger
from tests.unit.test_simulator import Sim, make_sim
from tests.workflows import SHOP

pytestmark = pytest.mark.unit

STEPS = [(s.agent, s.action) for s in SHOP.steps]
UNDO = {"inventory": "release", "payment": "refund", "shipping": "cancel"}


class Later(StrEnum):
    """Stand-ins by value for states ProcessState gains with compensation."""

    COMPENSATED = "Compensated"
    COMPENSATING = "Compensating"


PROCESSED = ProcessState.PROCESSED
ERROR = ProcessState.ERROR
COMPENSATED = ProcessState.COMPENSATED
COMPENSATING = ProcessState.COMPENSATING


def run_steps(sim: Sim, order: str, steps: list[tuple[str, str]] = STEPS) -> None:
    for service, action in steps:
        assert sim.do(service, action, order=order).status_code == 200


def undo_steps(sim: Sim, order: str, steps: list[tuple[str, str]]) -> None:
    for service, action in reversed(steps):
        assert sim.undo(service, UNDO[service], action, order=order).status_code == 200


def do_entry(order: str, service: str, action: str, undone: bool = False) -> dict[str, object]:
    return {
        "kind": "do",
        "order_id": order,
        "service": service,
        "action": action,
        "idempotency_key": f"{order}:{action}",
        "applied_at": "2026-01-01T00:00:00Z",
        "undone_at": "2026-01-01T00:01:00Z" if undone else None,
        "undone_by": f"{order}:{action}:undo" if undone else None,
    }


def undo_entry(order: str, service: str, action: str, key: str) -> dict[str, object]:
    return {
        "kind": "undo",
        "order_id": order,
        "service": service,
        "action": UNDO[service],
        "idempotency_key": key,
        "original_action": action,
        "original_key": f"{order}:{action}",
        "outcome": "undone",
    }


def full_order(order: str, undone: bool = False) -> list[dict[str, object]]:
    return [do_entry(order, service, action, undone) for service, action in STEPS]


def test_a_clean_run_with_every_outcome_reports_no_problem_and_counts_everything():
    sim = make_sim()
    run_steps(sim, "ok1")
    run_steps(sim, "ok2")
    run_steps(sim, "ok2")  # retries replay, they apply nothing
    run_steps(sim, "comp", STEPS[:2])
    undo_steps(sim, "comp", STEPS)  # ship never ran: its undo is a no-op
    run_steps(sim, "err", STEPS[:1])
    run_steps(sim, "busy", STEPS[:1])
    outcomes = {
        "ok1": PROCESSED,
        "ok2": PROCESSED,
        "comp": COMPENSATED,
        "err": ERROR,
        "busy": COMPENSATING,
    }
    report = check_effects(sim.ledger(), outcomes, SHOP)
    assert report.problems == [] and report.ok
    assert report.effects == 3 + 3 + 2 + 1 + 1
    assert report.by_service == {"inventory": 5, "payment": 3, "shipping": 2}
    assert (report.replays, report.undone, report.undos_noop) == (3, 2, 1)
    assert report.error_orders == {"err": 1} and report.outstanding_in_error == 1


def test_an_error_order_whose_effects_were_undone_has_nothing_outstanding():
    sim = make_sim()
    run_steps(sim, "err", STEPS[:2])
    undo_steps(sim, "err", STEPS[:1])
    report = check_effects(sim.ledger(), {"err": ERROR}, SHOP)
    assert report.ok and report.error_orders == {"err": 1}


def test_injected_faults_are_counted_in_the_report():
    sim = make_sim(transient_rate=1.0, throttle_share=1.0)
    sim.do("payment", "charge")
    sim.client.put("/faults", json={"transient_rate": 1.0, "throttle_share": 0.0})
    sim.do("payment", "charge")
    sim.client.put("/faults", json={"permanent_rate": 1.0})
    sim.do("payment", "charge", order="o2")
    sim.client.put("/faults", json={"slow_rate": 1.0})
    sim.do("inventory", "reserve")
    sim.client.put("/faults", json={"outage_service": "shipping", "outage_seconds": 9})
    sim.do("shipping", "ship")
    sim.undo("shipping", "cancel", "ship")
    sim.do("shipping", "ship", order="o3")
    sim.clock.advance(10)  # the outage is over
    assert sim.undo("shipping", "cancel", "ship").json()["outcome"] == "noop"
    assert sim.do("shipping", "ship").status_code == 409  # its key was undone before it ran
    report = check_effects(sim.ledger(), {"o1": ERROR, "o2": ERROR, "o3": ERROR}, SHOP)
    assert (report.transient_failures, report.throttled) == (2, 1)
    assert report.permanent_failures == 1
    assert report.slow_responses == 1
    assert report.outage_rejections == 3
    assert report.refused_after_undo == 1
    assert (report.effects, report.undos_noop) == (1, 1)


def test_an_effect_applied_twice_is_a_problem():
    ledger = {"effects": [*full_order("o1"), do_entry("o1", "payment", "charge")], "replays": 0}
    report = check_effects(ledger, {"o1": PROCESSED}, SHOP)
    assert "o1: payment.charge applied 2 times" in report.problems
    assert not report.ok


def test_an_effect_undone_twice_is_a_problem():
    effects = [
        do_entry("o1", "payment", "charge", undone=True),
        undo_entry("o1", "payment", "charge", "o1:charge:undo"),
        undo_entry("o1", "payment", "charge", "another"),
    ]
    report = check_effects({"effects": effects}, {"o1": COMPENSATED}, SHOP)
    assert report.problems == ["o1: payment effect o1:charge undone 2 times"]


def test_a_processed_order_missing_a_step_is_a_problem():
    sim = make_sim()
    run_steps(sim, "o1", STEPS[:2])
    report = check_effects(sim.ledger(), {"o1": PROCESSED}, SHOP)
    assert report.problems == ["o1: shipping.ship not applied exactly once"]


def test_a_processed_order_with_an_undone_effect_is_a_problem():
    sim = make_sim()
    run_steps(sim, "o1")
    undo_steps(sim, "o1", STEPS[1:2])
    report = check_effects(sim.ledger(), {"o1": PROCESSED}, SHOP)
    assert report.problems == ["o1: payment.charge undone but order Processed"]


def test_a_compensated_order_with_an_effect_left_applied_is_a_problem():
    sim = make_sim()
    run_steps(sim, "o1", STEPS[:2])
    undo_steps(sim, "o1", STEPS[1:2])  # the reserve was never released
    report = check_effects(sim.ledger(), {"o1": COMPENSATED}, SHOP)
    assert report.problems == ["o1: inventory.reserve applied but not undone (order Compensated)"]


def test_a_compensated_order_is_recognised_by_value():
    ledger = {"effects": [do_entry("o1", "payment", "charge")]}
    for state in (Later.COMPENSATED, "Compensated"):
        report = check_effects(ledger, {"o1": state}, SHOP)  # type: ignore[dict-item]
        assert len(report.problems) == 1


def test_an_error_order_is_reported_but_not_a_problem():
    sim = make_sim()
    run_steps(sim, "o1", STEPS[:2])
    report = check_effects(sim.ledger(), {"o1": ERROR}, SHOP)
    assert report.ok and report.error_orders == {"o1": 2}


def test_effects_and_undos_for_unknown_orders_are_problems():
    sim = make_sim()
    run_steps(sim, "known")
    sim.do("payment", "charge", order="stranger")
    sim.undo("shipping", "cancel", "ship", order="ghost")
    report = check_effects(sim.ledger(), {"known": PROCESSED}, SHOP)
    assert report.problems == [
        "effect for unknown order ghost",
        "effect for unknown order stranger",
    ]


def test_a_ledger_from_before_undo_support_still_checks():
    old = [
        {k: v for k, v in e.items() if k not in ("kind", "undone_at", "undone_by")}
        for e in full_order("o1")
    ]
    report = check_effects({"effects": old, "replays": 4}, {"o1": PROCESSED}, SHOP)
    assert report.ok and report.effects == 3 and report.replays == 4
    assert report.transient_failures == 0


def test_fetch_ledger_and_configure_faults_talk_to_the_simulator(monkeypatch):
    sim = make_sim()
    monkeypatch.setattr("sas_local.ledger.httpx.get", lambda url, **_: _local(sim, "GET", url))
    monkeypatch.setattr(
        "sas_local.ledger.httpx.put", lambda url, json, **_: _local(sim, "PUT", url, json)
    )
    assert configure_faults("http://sim", {"permanent_rate": 1.0})["permanent_rate"] == 1.0
    assert sim.do("payment", "charge").status_code == 402
    stats = fetch_ledger("http://sim")["stats"]
    assert isinstance(stats, dict)
    assert stats["payment"]["permanent_failures"] == 1


def _local(sim: Sim, method: str, url: str, body: object = None) -> httpx.Response:
    path = url.removeprefix("http://sim")
    response = sim.client.request(method, path, json=body) if body else sim.client.get(path)
    response.raise_for_status()
    return response

"""Per-step failure policy: what a step's final failure does (compensate, error, continue),
in memory through the real handlers, on refusals and on running out of attempts."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from sas.domain.workflow import Registry, StepDefinition, Workflow
from sas.testing import Harness, Outcome, ProcessState, ok, refuse, too_slow

pytestmark = pytest.mark.unit

BUDGET = timedelta(seconds=15)
BOOK = StepDefinition("book", "hotel", "book", BUDGET, undo="cancel")
PAY = StepDefinition("pay", "bank", "charge", BUDGET, undo="refund")
TELL = StepDefinition("tell", "mail", "send", BUDGET, on_failure="continue")
RECORD = StepDefinition("record", "ledger", "write", BUDGET, on_failure="error")
TRIP = Workflow("trip", (BOOK, PAY, TELL, RECORD))
REGISTRY = Registry((TRIP,))


def run(*scripts: tuple[str, str, *tuple[Outcome, ...]]) -> tuple[Harness, str]:
    harness = Harness(REGISTRY)
    for agent, action, *outcomes in scripts:
        harness.script(agent, action, *outcomes)
    order = harness.submit("trip", {"who": "Ada"})
    harness.run()
    return harness, order


def test_a_refused_step_of_the_workflow_s_policy_undoes_what_was_done() -> None:
    harness, order = run(("bank", "charge", refuse("card declined")))
    assert harness.state(order).process_state is ProcessState.COMPENSATED
    assert ("hotel", "cancel") in {(c.agent, c.action) for c in harness.calls}


def test_a_step_that_may_be_skipped_is_skipped_on_refusal_and_the_order_goes_on() -> None:
    harness, order = run(("mail", "send", refuse("address bounced")))
    state = harness.state(order)
    assert state.process_state is ProcessState.PROCESSED
    assert "tell" not in state.results and "record" in state.results
    actions = [(c.agent, c.action) for c in harness.calls]
    assert ("ledger", "write") in actions and ("hotel", "cancel") not in actions
    assert "step_skipped" in harness.statuses(order)


def test_a_step_that_may_be_skipped_is_skipped_once_out_of_attempts() -> None:
    harness, order = run(("mail", "send", *[too_slow(60)] * 3))
    state = harness.state(order)
    assert state.process_state is ProcessState.PROCESSED
    assert state.failure_count == 0 and "record" in state.results
    assert any("expired_skipped" in line for line in harness.history(order))


def test_a_step_of_policy_error_stops_for_a_person_and_undoes_nothing() -> None:
    harness, order = run(("ledger", "write", refuse("ledger closed")))
    state = harness.state(order)
    assert state.process_state is ProcessState.ERROR
    assert "ledger closed" in (state.last_error or "")
    undo = {("hotel", "cancel"), ("bank", "refund")}
    assert not undo & {(c.agent, c.action) for c in harness.calls}
    assert [alert.order_id for alert in harness.alerts] == [order]


def test_a_step_of_policy_error_out_of_attempts_stops_in_error() -> None:
    harness, order = run(("ledger", "write", *[too_slow(60)] * 3))
    assert harness.state(order).process_state is ProcessState.ERROR
    assert any("expired_error" in line for line in harness.history(order))


def test_a_skipped_last_step_ends_the_order_processed() -> None:
    last = Workflow("note", (BOOK, TELL))
    harness = Harness(Registry((last,)))
    harness.script("mail", "send", refuse("no"))
    order = harness.submit("note", {})
    harness.run()
    assert harness.state(order).process_state is ProcessState.PROCESSED


def test_a_step_overrides_a_workflow_that_stops_in_error() -> None:
    strict = Workflow(
        "strict", (BOOK, StepDefinition("pay", "bank", "charge", BUDGET, on_failure="compensate")),
        on_failure="error",
    )  # fmt: skip
    harness = Harness(Registry((strict,)))
    harness.script("bank", "charge", refuse("no"))
    order = harness.submit("strict", {})
    harness.run()
    assert harness.state(order).process_state is ProcessState.COMPENSATED


def test_the_next_step_after_a_skip_gets_the_results_there_are() -> None:
    def needs_booking(
        details: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, Any]:
        return {"booking": results["book"]["ref"], "told": "tell" in results}

    record = StepDefinition("record", "ledger", "write", BUDGET, input=needs_booking)
    harness = Harness(Registry((Workflow("trip", (BOOK, TELL, record)),)))
    harness.script("hotel", "book", ok({"ref": "H1"}))
    harness.script("mail", "send", refuse("bounced"))
    harness.submit("trip", {})
    harness.run()
    write = [c for c in harness.calls if c.action == "write"]
    assert write and write[0].data["booking"] == "H1" and write[0].data["told"] is False


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: StepDefinition("go", "app", "go", BUDGET, on_failure="retry"),  # type: ignore[arg-type]
            "on_failure must",
        ),
        (
            lambda: StepDefinition("go", "app", "go", BUDGET, undo="back", on_failure="continue"),
            "no undo",
        ),
    ],
)
def test_a_policy_sas_cannot_follow_is_refused_at_declaration(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_a_step_s_policy_is_part_of_the_definition_orders_are_bound_to() -> None:
    plain = Workflow("wf", (StepDefinition("go", "app", "go", BUDGET),))
    skippable = Workflow("wf", (StepDefinition("go", "app", "go", BUDGET, on_failure="continue"),))
    assert "on_failure" not in plain.definition["steps"][0]  # older fingerprints unchanged
    assert skippable.definition["steps"][0]["on_failure"] == "continue"
    assert plain.fingerprint != skippable.fingerprint

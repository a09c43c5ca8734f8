"""Hostile review of the per-step failure policy (compensate, error, continue) and of input
builder failures, in memory: each test states the guarantee it tries to break."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from sas.domain.errors import InvalidMessage
from sas.domain.messages import OperatorAlert, OrderSubmitted, StatusEvent, StepReply, StepRequest
from sas.domain.model import ProcessState
from sas.domain.recovery import ExpiryAction, expire
from sas.domain.wire import step_row_key
from sas.domain.workflow import Registry, StepDefinition, Workflow
from sas.services.scheduler import ReplyOutcome
from sas.testing import refuse
from sas_local.chaos.checker import COMMITTED, Design, Evidence, FlowSpec, StepSpec, check
from tests.chaos.test_checker import World as Rows
from tests.harness import BUDGET, ReadThenYield, World
from tests.workflows import RESERVE

pytestmark = [pytest.mark.unit]

STEP = timedelta(seconds=BUDGET)
NOTE = StepDefinition("note", "payment", "note", STEP, on_failure="continue")
SHIP = StepDefinition("ship", "shipping", "ship", STEP, undo="cancel")
LEDGER = StepDefinition("ledger", "payment", "write", STEP, on_failure="error")
SKIPPY = Workflow("skippy", (RESERVE, NOTE, SHIP), pickup_budget=timedelta(seconds=60))
TAIL = Workflow("tail", (RESERVE, NOTE), pickup_budget=timedelta(seconds=60))
STRICT_MID = Workflow("strict_mid", (RESERVE, LEDGER, SHIP), pickup_budget=timedelta(seconds=60))


class Broken:
    """An input builder that raises until it is fixed (a new deploy of the same definition)."""

    def __init__(self) -> None:
        self.fixed = False

    def __call__(self, details: Any, results: Any) -> dict[str, Any]:
        if not self.fixed:
            raise KeyError("missing")
        return dict(details)


FIRST_BUILDER = Broken()
FIRST_BROKEN = Workflow(
    "first_broken",
    (StepDefinition("reserve", "inventory", "reserve", STEP, undo="release", input=FIRST_BUILDER),
     SHIP),
    pickup_budget=timedelta(seconds=60),
)  # fmt: skip
SHIP_BUILDER = Broken()
AFTER_SKIP_BROKEN = Workflow(
    "after_skip_broken",
    (RESERVE, NOTE,
     StepDefinition("ship", "shipping", "ship", STEP, undo="cancel", input=SHIP_BUILDER)),
    pickup_budget=timedelta(seconds=60),
)  # fmt: skip
FIRST_NOT_JSON = Workflow(
    "first_not_json",
    (StepDefinition("note", "payment", "note", STEP, on_failure="continue",
                    input=lambda details, results: {"score": float("nan")}),
     SHIP),
    pickup_budget=timedelta(seconds=60),
)  # fmt: skip
TELL = StepDefinition("tell", "shipping", "tell", STEP, on_failure="continue")
TWO_SKIPS = Workflow("two_skips", (NOTE, TELL, RESERVE, SHIP), pickup_budget=timedelta(seconds=60))
LIMITED_TAIL = Workflow(
    "limited_tail", (RESERVE, NOTE), pickup_budget=timedelta(seconds=60), max_in_flight=5
)
REGISTRY = Registry(
    (SKIPPY, TAIL, STRICT_MID, FIRST_BROKEN, AFTER_SKIP_BROKEN, FIRST_NOT_JSON, TWO_SKIPS,
     LIMITED_TAIL)
)  # fmt: skip

NOTE_ = ("payment", "note")
RESERVE_ = ("inventory", "reserve")
SHIP_ = ("shipping", "ship")


@pytest.fixture(autouse=True)
def broken_builders() -> None:
    """Every test starts with the builders broken (a test may fix them: a new deploy)."""
    FIRST_BUILDER.fixed = SHIP_BUILDER.fixed = False


def world(max_failures: int = 3) -> World:
    return World(workflows=REGISTRY, max_failures=max_failures)


def submit(w: World, workflow: str, order_id: str = "o1") -> str:
    w.submit(
        OrderSubmitted(
            order_id=order_id, workflow=workflow, details={"who": "ada"}, reply_to="status-q",
        )
    )  # fmt: skip
    return order_id


def noting(w: World, workflow: str = "skippy") -> str:
    """reserve done; note claimed, its request waiting for the payment agent."""
    oid = submit(w, workflow)
    w.deliver("orders")
    w.deliver("agent-inventory"), w.deliver("replies")
    state = w.state(oid)
    assert state.process_state is ProcessState.PROCESSING and state.step == "note"
    return oid


def statuses(w: World, oid: str) -> list[str]:
    return [
        m.status for m in w.bus.to("status-q") if isinstance(m, StatusEvent) and m.order_id == oid
    ]


def ok_of(request: StepRequest) -> StepReply:
    """The ``ok`` its agent would have sent for ``request``."""
    return StepReply(
        order_id=request.order_id, step=request.step, step_index=request.step_index,
        attempt=request.attempt, mode=request.mode, outcome="ok", incarnation=request.incarnation,
    )  # fmt: skip


def design(max_failures: int = 3) -> Design:
    """The chaos checker's design with this module's workflows."""
    flows = {
        (flow.name, flow.version): FlowSpec(
            tuple(StepSpec(s.name, s.agent, s.action, s.undo, s.max_failures, s.on_failure)
                  for s in flow.steps),
            flow.on_failure, flow.version,
        )
        for flow in REGISTRY.workflows
    }  # fmt: skip
    return replace(Design.load(), workflows=flows, max_failures=max_failures)


def judged(w: World, *order_ids: str) -> list[str]:
    """The chaos checker's violations for what the product did: the orders' rows (history in
    commit order), the provider's ledger and the alerts, as a campaign would collect them."""
    entities: list[dict[str, Any]] = []
    for commit, entry in enumerate(w.store.history, start=1):  # type: ignore[attr-defined]
        entities.append({
            COMMITTED: float(commit), "PartitionKey": entry.order_id,
            "RowKey": f"hist:{entry.at:%Y%m%dT%H%M%S.%f}:{entry.attempt:05d}:{commit}",
            "At": entry.at, "Kind": entry.kind, "Attempt": entry.attempt, "Step": entry.step,
            "Mode": entry.mode, "Detail": entry.detail,
        })  # fmt: skip
    for oid in order_ids:
        state = w.state(oid)
        entities.append({
            "PartitionKey": oid, "RowKey": "state", "Workflow": state.workflow,
            "Version": state.version, "ProcessState": state.process_state.value,
            "Attempt": state.attempt, "StepIndex": state.step_index, "Mode": state.mode,
            "FailureCount": state.failure_count, "Incarnation": state.incarnation,
            "AlertPending": state.alert_pending,
        })  # fmt: skip
        for record in w.store.get_steps(oid):
            key = step_row_key(record.index, record.name)
            entities.append({"PartitionKey": oid, "RowKey": key, "Name": record.name})
    entities += [{"PartitionKey": "~live", "RowKey": m.order_id} for m in w.store.list_live()]
    ledger = []
    for (agent, action, key), effect in w.remote.effects.items():
        entry = {"service": agent, "action": action, "idempotency_key": key,
                 "order_id": effect.order_id}  # fmt: skip
        if effect.undoes is None:
            ledger.append({**entry, "kind": "do", "undone_at": effect.undone_by})
        else:
            original = w.remote.effects.get(effect.undoes)
            done = original is not None and original.undone_by == key
            ledger.append({**entry, "kind": "undo", "original_key": effect.undoes[2],
                           "outcome": "undone" if done else "nothing"})  # fmt: skip
    alerts = [
        json.dumps({"alert_id": a.alert_id, "order_id": a.order_id})
        for a in w.alerts() if isinstance(a, OperatorAlert)
    ]  # fmt: skip
    evidence = Evidence(entities, alerts, {}, {"effects": ledger}, list(order_ids))
    verdict = check(evidence, design(w.policy.max_failures))
    return [f"{v.kind}: {v.detail}" for v in verdict.violations]


# --- cancel: the order is undone, never skipped on ---------------------------------------


def test_a_cancelled_order_whose_skippable_step_is_refused_is_undone_not_skipped() -> None:
    w = world()
    w.remote.script(*NOTE_, refuse("mailbox full"))
    oid = noting(w)
    w.operator.cancel(oid, actor="dana", reason="customer asked")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.CANCELLED
    assert w.remote.applied(oid) == {RESERVE_: True}
    assert "step_skipped" not in statuses(w, oid)
    assert judged(w, oid) == []


def test_a_cancelled_order_whose_skippable_step_expires_is_undone_not_skipped() -> None:
    w = world(max_failures=1)
    oid = noting(w)
    w.drop("agent-payment")
    w.operator.cancel(oid, actor="dana", reason="customer asked")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.CANCELLED
    assert "expired_skipped" not in w.history(oid)
    assert w.remote.applied(oid) == {RESERVE_: True}
    assert judged(w, oid) == []


def test_a_cancel_after_the_skip_undoes_what_was_done_before_it() -> None:
    w = world()
    w.remote.script(*NOTE_, refuse("mailbox full"))
    oid = noting(w)
    w.deliver("agent-payment"), w.deliver("replies")  # skipped: ship Pending
    assert w.state(oid).process_state is ProcessState.PENDING
    w.operator.cancel(oid, actor="dana", reason="customer asked")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.CANCELLED
    assert w.remote.applied(oid) == {RESERVE_: True}
    assert judged(w, oid) == []


def test_a_cancelled_order_whose_undo_stopped_in_error_resubmitted_is_judged_cancelled() -> None:
    """The cancel outlives the Error its undo stopped in: resubmitted, the undo finishes and
    the order ends Cancelled (not Compensated), which the checker must accept."""
    w = world()
    w.remote.script("inventory", "release", refuse("HTTP 500 for good"))
    oid = noting(w)
    w.operator.cancel(oid, actor="dana", reason="customer asked")
    w.settle_with_supervision()
    state = w.state(oid)
    assert state.process_state is ProcessState.ERROR and state.mode == "undo"
    w.operator.resubmit(oid, actor="eve")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.CANCELLED
    assert w.remote.applied(oid) == {RESERVE_: True, NOTE_: False}
    assert judged(w, oid) == []


def test_a_cancelled_order_s_last_undo_answering_while_held_is_judged_cancelled() -> None:
    """Cancelled, then suspended while its undo ran: the undo's expiry is held, its late
    ``ok`` then ends the order Cancelled (not Compensated), which the checker must accept."""
    w = world()
    oid = noting(w)
    w.operator.cancel(oid, actor="dana", reason="customer asked")
    w.deliver("agent-payment"), w.deliver("replies"), w.deliver("scheduler")  # release claimed
    assert w.state(oid).process_state is ProcessState.COMPENSATING
    w.operator.suspend(oid, actor="dana")
    w.deliver("agent-inventory")  # released; the reply waits
    w.clock.advance(BUDGET + 3 + w.policy.queue_wait_limit.total_seconds())
    w.tick(0)
    assert w.history(oid)[-1] == "expired_held"
    w.deliver("replies")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.CANCELLED
    assert judged(w, oid) == []


def test_an_effect_of_a_step_with_no_undo_left_by_a_stopped_undo_is_judged_not_orphaned() -> None:
    """Cancelled while ledger (no undo) ran; its ok waited past the queue-wait limit, so the
    expiry undid the order from there, and reserve's undo stopped in Error. ledger's effect
    stays, as in a Cancelled order (nothing undoes a step declared with no undo): the checker
    must not call it orphaned."""
    w = world()
    w.remote.script("inventory", "release", refuse("HTTP 500 for good"))
    oid = submit(w, "strict_mid")
    w.deliver("orders"), w.deliver("agent-inventory"), w.deliver("replies")  # ledger claimed
    w.operator.cancel(oid, actor="dana", reason="customer asked")
    w.deliver("agent-payment")  # ledger written; its ok waits
    w.clock.advance(BUDGET + 3 + w.policy.queue_wait_limit.total_seconds())
    w.tick(0)
    assert "expired_compensate" in w.history(oid)
    w.settle_with_supervision()
    state = w.state(oid)
    assert state.process_state is ProcessState.ERROR and state.mode == "undo"
    assert w.remote.applied(oid) == {RESERVE_: False, ("payment", "write"): False}
    assert "reply_dropped" in w.history(oid)
    assert judged(w, oid) == []


# --- suspend: a skip while suspended holds the next step -------------------------------


def test_a_skip_while_suspended_holds_the_next_step_until_resumed() -> None:
    w = world()
    w.remote.script(*NOTE_, refuse("mailbox full"))
    oid = noting(w)
    w.operator.suspend(oid, actor="dana")
    w.deliver("agent-payment")
    assert w.deliver("replies") == [ReplyOutcome.SUSPENDED]
    for _ in range(5):
        w.tick(3600)
        w.run()
    held = w.state(oid)
    assert held.process_state is ProcessState.PENDING and held.step == "ship"
    assert SHIP_ not in w.remote.applied(oid)
    w.operator.resume(oid, actor="dana")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.PROCESSED
    assert w.remote.applied(oid) == {RESERVE_: False, SHIP_: False}
    assert judged(w, oid) == []


def test_the_submitter_is_told_of_a_skip_made_while_the_order_was_suspended() -> None:
    w = world()
    w.remote.script(*NOTE_, refuse("mailbox full"))
    oid = noting(w)
    w.operator.suspend(oid, actor="dana")
    w.deliver("agent-payment"), w.deliver("replies")
    w.operator.resume(oid, actor="dana")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.PROCESSED
    assert "step_skipped" in statuses(w, oid)
    assert judged(w, oid) == []


# --- the last step ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["refused", "expired"])
def test_the_submitter_is_told_of_a_skipped_last_step(how: str) -> None:
    w = world(max_failures=1)
    oid = noting(w, "tail")
    if how == "refused":
        w.remote.script(*NOTE_, refuse("mailbox full"))
    else:
        w.drop("agent-payment")
    w.settle_with_supervision()
    state = w.state(oid)
    assert state.process_state is ProcessState.PROCESSED
    assert statuses(w, oid)[-2:] == ["step_skipped", "completed"]
    assert w.store.list_due(w.clock.now() + timedelta(days=1)) == []  # unindexed
    assert judged(w, oid) == []


def test_a_last_step_skipped_by_the_supervisor_frees_its_place_in_flight_at_once() -> None:
    """Processed by the expiry's skip: ``finished`` flags the marker (a workflow with a
    ``max_in_flight`` must not wait a sweep for the place), as a reply that finishes does."""
    w = world(max_failures=1)
    oid = noting(w, "limited_tail")
    assert w.store.count_live("limited_tail", 10) == 1
    w.drop("agent-payment")
    w.tick(BUDGET + 3)
    assert w.history(oid)[-1] == "expired_skipped"
    assert w.state(oid).process_state is ProcessState.PROCESSED
    assert w.store.count_live("limited_tail", 10) == 0
    w.tick(1)
    assert w.store.list_live() == []
    assert judged(w, oid) == []


# --- late and duplicate replies ---------------------------------------------------------


def test_a_late_ok_of_the_skipped_step_is_dropped_and_its_effect_is_no_result() -> None:
    w = world()
    oid = noting(w)
    (first,) = w.drop("agent-payment")  # attempt 1 lost before the call
    assert isinstance(first, StepRequest)
    w.tick(BUDGET + 3)  # counted expiry: retry
    w.clock.advance(5)
    w.remote.script(*NOTE_, refuse("mailbox full"))
    w.run()  # attempt 2 refused: skipped, ship done
    assert w.state(oid).process_state is ProcessState.PROCESSED
    late = ok_of(first)
    assert w.app.on_reply(late) is ReplyOutcome.STALE
    assert "note" not in w.state(oid).results
    assert "reply_dropped" in w.history(oid)
    w.settle_with_supervision()
    assert judged(w, oid) == []


def test_duplicate_refusals_of_a_skippable_step_skip_it_once() -> None:
    w = world()
    w.remote.script(*NOTE_, refuse("mailbox full"))
    oid = noting(w)
    w.deliver("agent-payment")
    outcomes = w.deliver("replies", twice=True)
    assert outcomes == [ReplyOutcome.SKIPPED, ReplyOutcome.STALE]
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.PROCESSED
    assert statuses(w, oid).count("step_skipped") == 1
    assert judged(w, oid) == []


def test_an_expiry_racing_a_refusal_skips_once() -> None:
    w = world(max_failures=1)
    w.remote.script(*NOTE_, refuse("mailbox full"))
    oid = noting(w)
    w.deliver("agent-payment")  # refusal queued
    racing = ReadThenYield(w.store, lambda: w.deliver("replies"))
    supervisor = w.new_supervisor("supervisor-2", store=racing)
    w.clock.advance(BUDGET * 3 + 15 * 60)
    supervisor.sweep()
    assert racing.meanwhile == [ReplyOutcome.SKIPPED]
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.PROCESSED
    history = w.history(oid)
    assert history.count("refused") + history.count("expired_skipped") == 1
    assert judged(w, oid) == []


# --- input builders ----------------------------------------------------------------------


@pytest.mark.parametrize("workflow", ["first_broken", "first_not_json"])
def test_a_first_step_whose_input_does_not_build_is_refused_at_submission(workflow: str) -> None:
    """Its builder raised, or built no JSON object (a NaN): the submission is refused with
    nothing written, as the Scheduler would stop it in Error. Accepted, the first step would
    send nothing and expire, then retry, skip or be compensated by its policy instead."""
    w = world(max_failures=1)
    with pytest.raises(InvalidMessage, match="first step's input"):
        w.app.submit(OrderSubmitted(order_id="o1", workflow=workflow, details={"who": "ada"}))
    assert w.store.get_state("o1") is None


def test_an_input_failure_after_a_skip_resubmitted_once_fixed_ends_processed() -> None:
    w = world()
    w.remote.script(*NOTE_, refuse("mailbox full"))
    oid = noting(w, "after_skip_broken")
    w.settle_with_supervision()
    state = w.state(oid)
    assert state.process_state is ProcessState.ERROR and state.step == "ship"
    assert "input_failed" in w.history(oid)
    assert len(w.alerts()) == 1
    SHIP_BUILDER.fixed = True
    w.operator.resubmit(oid, actor="eve")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.PROCESSED
    assert w.remote.applied(oid) == {RESERVE_: False, SHIP_: False}
    assert judged(w, oid) == []


def test_a_cancel_of_an_order_its_input_builder_stopped_after_a_skip_is_judged_legal() -> None:
    """ship's data did not build when it was claimed (after note was skipped): Error at the
    attempt that claim took. A cancel then undoes from ship (claimed at that attempt, as the
    product counts it), which the checker must accept."""
    w = world()
    w.remote.script(*NOTE_, refuse("mailbox full"))
    oid = noting(w, "after_skip_broken")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.ERROR
    w.operator.cancel(oid, actor="dana", reason="customer asked")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.CANCELLED
    assert w.remote.applied(oid) == {RESERVE_: True}
    assert judged(w, oid) == []


def test_an_error_policy_step_alerts_once_and_a_resubmit_runs_it_again() -> None:
    w = world()
    w.remote.script("payment", "write", refuse("ledger closed"))
    oid = submit(w, "strict_mid")
    w.settle_with_supervision()
    state = w.state(oid)
    assert state.process_state is ProcessState.ERROR and state.step == "ledger"
    assert len(w.alerts()) == 1
    assert w.remote.applied(oid) == {RESERVE_: False}
    w.operator.resubmit(oid, actor="eve")
    w.settle_with_supervision()
    assert w.state(oid).process_state is ProcessState.PROCESSED
    assert judged(w, oid) == []


# --- the checker: what the product would never do is reported ----------------------------


def noted(rows: Rows, order: str) -> None:
    """reserve done (applied) and note claimed with its reply."""
    rows.submitted.append(order)
    rows.history(order, "submitted", 0, None)
    rows.history(order, "claimed", 1, "reserve")
    rows.history(order, "completed", 1, "reserve")
    rows.do(order, 0, steps=[("reserve", "inventory", "reserve", "release")])


def violations(rows: Rows, max_failures: int = 3) -> list[str]:
    return sorted({v.kind for v in check(rows.evidence(), design(max_failures)).violations})


def test_the_checker_reports_a_cancelled_order_ending_processed_by_a_skip() -> None:
    """The product undoes a cancelled order whatever the step's policy: its expiry is the
    operator's (``expired_compensate``, not counted), never a skip."""
    rows = Rows()
    noted(rows, "x1")
    rows.history("x1", "cancelled", 2, "note", detail="customer asked")
    rows.history("x1", "expired_skipped", 2, "note", detail="Processing past x, failure 1 of 1")
    rows.state("x1", "Processed", 2, 1, Workflow="tail")
    assert "illegal_transition" in violations(rows, max_failures=1)


def test_the_checker_reports_a_suspended_order_s_step_expiring_into_a_skip() -> None:
    """The product holds a suspended order's expired step (``expired_held``, not counted)."""
    rows = Rows()
    noted(rows, "s1")
    rows.history("s1", "suspended", 2, "note")
    rows.history("s1", "expired_skipped", 2, "note", detail="Processing past x, failure 1 of 1")
    rows.state("s1", "Processed", 2, 1, Workflow="tail")
    assert "illegal_transition" in violations(rows, max_failures=1)


def test_the_checker_reports_a_completed_skippable_step_without_its_effect() -> None:
    """Only a step that was skipped may have no effect: one recorded completed was applied."""
    rows = Rows()
    noted(rows, "p1")
    rows.history("p1", "completed", 2, "note")
    rows.state("p1", "Processed", 2, 1, Workflow="tail")
    assert violations(rows) == ["processed_effect_missing"]


# --- the load's expiries ----------------------------------------------------------------


def test_a_skippable_step_s_expiry_spared_by_the_load_is_retried_not_skipped() -> None:
    """At its threshold, an expiry the Supervisor takes as the load's retries the step
    uncounted; once the load's allowance is spent, the next skips it."""
    w = world(max_failures=1)
    oid = noting(w)
    state = w.state(oid)
    assert state.complete_by is not None
    late = state.complete_by + timedelta(seconds=1)
    workflow = SKIPPY
    spared = expire(state, now=late, workflow=workflow, policy=w.policy, saturated=True)
    assert spared.action is ExpiryAction.RETRY and not spared.counted
    assert spared.state.step == "note" and spared.state.failure_count == 0
    spent = replace(state, load_expiries=w.policy.max_load_expiries)
    skipped = expire(spent, now=late, workflow=workflow, policy=w.policy, saturated=True)
    assert skipped.action is ExpiryAction.SKIPPED and skipped.state.step == "ship"

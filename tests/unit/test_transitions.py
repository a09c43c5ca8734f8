from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from sas.domain.errors import IllegalTransition, StaleReply
from sas.domain.model import ProcessState
from sas.domain.transitions import claim, complete_step, fail_step, initial_state
from sas.domain.workflow import ORDER_WORKFLOW, StepDefinition, Workflow

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
WF = ORDER_WORKFLOW


def test_initial_state_is_pending_unlocked_with_a_pickup_deadline():
    state = initial_state("o1", WF, reply_to="status-q", now=NOW)
    assert state.process_state is ProcessState.PENDING
    assert state.locked_by is None
    assert state.failure_count == 0
    assert state.attempt == 0
    assert state.step_index == 0
    assert state.complete_by == NOW + WF.pickup_budget
    assert state.reply_to == "status-q"


def test_claim_locks_increments_attempt_and_sets_deadline_of_the_step():
    state = claim(
        initial_state("o1", WF, reply_to=None, now=NOW), instance_id="s1", now=NOW, workflow=WF
    )
    assert state.process_state is ProcessState.PROCESSING
    assert state.locked_by == "s1"
    assert state.attempt == 1
    assert state.complete_by == NOW + WF.steps[0].budget


@pytest.mark.parametrize(
    "change",
    [
        {"locked_by": "other"},
        {"process_state": ProcessState.PROCESSING},
        {"process_state": ProcessState.PROCESSED},
        {"process_state": ProcessState.ERROR},
    ],
)
def test_claim_refuses_anything_but_pending_and_unlocked(change):
    state = replace(initial_state("o1", WF, reply_to=None, now=NOW), **change)
    with pytest.raises(IllegalTransition):
        claim(state, instance_id="s1", now=NOW, workflow=WF)


def test_complete_step_claims_the_next_step_with_a_new_attempt():
    running = claim(
        initial_state("o1", WF, reply_to=None, now=NOW), instance_id="s1", now=NOW, workflow=WF
    )
    later = NOW + timedelta(seconds=3)
    nxt = complete_step(running, attempt=1, step_index=0, instance_id="s2", now=later, workflow=WF)
    assert nxt.process_state is ProcessState.PROCESSING
    assert (nxt.step_index, nxt.attempt, nxt.locked_by) == (1, 2, "s2")
    assert nxt.complete_by == later + WF.steps[1].budget


def test_completing_the_last_step_makes_the_order_processed_and_unlocked():
    wf = Workflow("one", (StepDefinition("only", "payment", "charge", timedelta(seconds=5)),))
    running = claim(
        initial_state("o1", wf, reply_to=None, now=NOW), instance_id="s1", now=NOW, workflow=wf
    )
    done = complete_step(running, attempt=1, step_index=0, instance_id="s1", now=NOW, workflow=wf)
    assert done.process_state is ProcessState.PROCESSED
    assert done.locked_by is None and done.complete_by is None
    assert done.finished_at == NOW


@pytest.mark.parametrize(("attempt", "step_index"), [(0, 0), (2, 0), (1, 1)])
def test_a_reply_for_another_attempt_or_step_is_stale(attempt, step_index):
    running = claim(
        initial_state("o1", WF, reply_to=None, now=NOW), instance_id="s1", now=NOW, workflow=WF
    )
    with pytest.raises(StaleReply):
        complete_step(
            running, attempt=attempt, step_index=step_index, instance_id="s", now=NOW, workflow=WF
        )
    with pytest.raises(StaleReply):
        fail_step(running, attempt=attempt, step_index=step_index, now=NOW, reason="x")


def test_a_reply_to_a_pending_order_is_stale_even_with_matching_numbers():
    pending = initial_state("o1", WF, reply_to=None, now=NOW)
    with pytest.raises(StaleReply):
        complete_step(pending, attempt=0, step_index=0, instance_id="s", now=NOW, workflow=WF)


def test_fail_step_sets_error_with_a_bounded_reason():
    running = claim(
        initial_state("o1", WF, reply_to=None, now=NOW), instance_id="s1", now=NOW, workflow=WF
    )
    failed = fail_step(running, attempt=1, step_index=0, now=NOW, reason="x" * 5000)
    assert failed.process_state is ProcessState.ERROR
    assert failed.locked_by is None
    assert failed.last_error is not None and len(failed.last_error) == 1000


def test_workflow_definitions_are_validated():
    with pytest.raises(ValueError, match="no steps"):
        Workflow("empty", ())
    step = StepDefinition("a1", "payment", "charge", timedelta(seconds=1))
    with pytest.raises(ValueError, match="repeats"):
        Workflow("dup", (step, step))
    with pytest.raises(ValueError, match="budget"):
        StepDefinition("a1", "payment", "charge", timedelta(0))
    with pytest.raises(ValueError, match="must match"):
        StepDefinition("Bad Name", "payment", "charge", timedelta(seconds=1))

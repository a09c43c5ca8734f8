from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from sas.domain.errors import IllegalTransition, StaleReply
from sas.domain.messages import StepReply
from sas.domain.model import TERMINAL_STATES, ProcessState
from sas.domain.recovery import RetryPolicy, alert_sent, claim_alert, close, expire, resubmit
from sas.domain.transitions import (
    Fence,
    NotYet,
    Then,
    begin_compensation,
    claim,
    complete_step,
    decide_reply,
    fence,
    initial_state,
    look_again_at,
    refuse_step,
    to_error,
)
from sas.domain.wire import Mode
from sas.domain.workflow import START_SLACK, StepDefinition, Workflow
from tests.workflows import SHOP

pytestmark = [pytest.mark.unit, pytest.mark.fast]

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
WF = SHOP


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
    assert state.complete_by == NOW + WF.steps[0].budget + START_SLACK


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
    assert nxt.complete_by == later + WF.steps[1].budget + START_SLACK


def test_completing_the_last_step_makes_the_order_processed_and_unlocked():
    wf = Workflow("one", (StepDefinition("only", "payment", "charge", timedelta(seconds=5)),))
    running = claim(
        initial_state("o1", wf, reply_to=None, now=NOW), instance_id="s1", now=NOW, workflow=wf
    )
    done = complete_step(running, attempt=1, step_index=0, instance_id="s1", now=NOW, workflow=wf)
    assert done.process_state is ProcessState.PROCESSED
    assert done.locked_by is None and done.complete_by is None
    assert done.finished_at == NOW


@pytest.mark.parametrize(("attempt", "step_index"), [(2, 0), (1, 1)])
def test_a_reply_for_an_attempt_nobody_claimed_or_another_step_is_stale(attempt, step_index):
    running = claim(
        initial_state("o1", WF, reply_to=None, now=NOW), instance_id="s1", now=NOW, workflow=WF
    )
    with pytest.raises(StaleReply):
        complete_step(
            running, attempt=attempt, step_index=step_index, instance_id="s", now=NOW, workflow=WF
        )
    with pytest.raises(StaleReply):
        refuse_step(
            running, attempt=attempt, step_index=step_index, now=NOW, reason="x", workflow=WF
        )


def test_an_ok_of_an_earlier_attempt_completes_the_step_a_refusal_does_not():
    """Every attempt of a step calls with one idempotency key: the remote applied the step's
    effect once, whichever attempt did it, so its ok completes the step; a refusal applied
    nothing and speaks only for its own attempt (a later one may succeed)."""
    retried = _running(attempt=3, step_index=1)
    done = complete_step(retried, attempt=2, step_index=1, instance_id="s", now=NOW, workflow=WF)
    assert (done.step_index, done.attempt, done.process_state) == (2, 4, ProcessState.PROCESSING)
    with pytest.raises(StaleReply):
        refuse_step(retried, attempt=2, step_index=1, now=NOW, reason="x", workflow=WF)


def test_an_ok_reaching_an_order_that_waits_for_its_steps_retry_completes_the_step():
    late = NOW + timedelta(minutes=1)
    expired = expire(_running(attempt=3, step_index=1), now=late, workflow=WF, policy=POLICY)
    pending = expired.state
    assert pending.process_state is ProcessState.PENDING
    done = complete_step(pending, attempt=3, step_index=1, instance_id="s", now=late, workflow=WF)
    assert (done.step_index, done.attempt, done.locked_by) == (2, 4, "s")
    assert done.not_before is None and done.complete_by == late + WF.steps[2].budget + START_SLACK


def test_a_refusal_after_an_earlier_attempt_expired_compensates_from_the_step_itself():
    """The refusing attempt applied nothing, but the expired one may have (a refusal can
    answer a retry that overlapped it): the undo starts at the step, a no-op if it was not."""
    late = NOW + timedelta(minutes=1)
    pending = expire(_running(attempt=3, step_index=1), now=late, workflow=WF, policy=POLICY).state
    retried = claim(pending, instance_id="s", now=late + timedelta(minutes=1), workflow=WF)
    refused = refuse_step(retried, attempt=4, step_index=1, now=late, reason="x", workflow=WF)
    assert (refused.mode, refused.step_index) == ("undo", 1)
    first = replace(_running(attempt=3, step_index=1), first_attempt=3)  # charge's first try
    refused = refuse_step(first, attempt=3, step_index=1, now=late, reason="x", workflow=WF)
    assert (refused.mode, refused.step_index) == ("undo", 0)


def test_a_reply_to_a_pending_order_before_any_attempt_is_stale():
    pending = initial_state("o1", WF, reply_to=None, now=NOW)
    with pytest.raises(StaleReply):
        complete_step(pending, attempt=1, step_index=0, instance_id="s", now=NOW, workflow=WF)


def test_workflow_definitions_are_validated():
    with pytest.raises(ValueError, match="steps must be a non-empty tuple"):
        Workflow("empty", ())
    step = StepDefinition("a1", "payment", "charge", timedelta(seconds=1))
    with pytest.raises(ValueError, match="repeats"):
        Workflow("dup", (step, step))
    with pytest.raises(ValueError, match="budget"):
        StepDefinition("a1", "payment", "charge", timedelta(0))
    with pytest.raises(ValueError, match="must be snake_case"):
        StepDefinition("Bad Name", "payment", "charge", timedelta(seconds=1))


ERROR_WF = Workflow(
    "strict",
    (StepDefinition("charge", "payment", "charge", timedelta(seconds=5), undo="refund"),),
    on_failure="error",
)
POLICY = RetryPolicy(
    max_failures=3, base_backoff=timedelta(seconds=2), max_backoff=timedelta(seconds=5)
)


def running_at(step_index: int, wf: Workflow = WF):
    """Claim and complete steps until ``step_index`` is the running one."""
    state = claim(
        initial_state("o1", wf, reply_to=None, now=NOW), instance_id="s", now=NOW, workflow=wf
    )
    while state.step_index < step_index:
        state = complete_step(
            state,
            attempt=state.attempt,
            step_index=state.step_index,
            instance_id="s",
            now=NOW,
            workflow=wf,
        )
    return state


def test_a_refused_step_starts_compensation_below_it():
    running = running_at(2)  # reserve and charge done, ship refused
    state = refuse_step(
        running, attempt=running.attempt, step_index=2, now=NOW, reason="no courier", workflow=WF
    )
    assert (state.process_state, state.mode, state.step_index) == (ProcessState.PENDING, "undo", 1)
    assert state.locked_by is None and state.failure_count == 0
    assert state.complete_by == NOW + WF.pickup_budget
    assert state.last_error == "no courier"


def test_compensation_and_resubmit_start_the_step_with_no_deferrals_or_load_expiries():
    """The forward step's counts bound that step: the undo (or the operator's second run)
    starts with its own."""
    worn = replace(running_at(2), deferrals=20, load_expiries=5)
    undo = refuse_step(
        worn, attempt=worn.attempt, step_index=2, now=NOW, reason="no courier", workflow=WF
    )
    claimed = claim(undo, instance_id="s1", now=NOW, workflow=WF)
    assert (claimed.mode, claimed.deferrals, claimed.load_expiries) == ("undo", 0, 0)
    failed = replace(to_error(worn, now=NOW, reason="stuck"), alert_pending=False)
    again = claim(resubmit(failed, now=NOW, workflow=WF), instance_id="s1", now=NOW, workflow=WF)
    assert (again.step_index, again.deferrals, again.load_expiries) == (2, 0, 0)


def test_a_refused_first_step_has_nothing_to_undo_and_is_compensated_at_once():
    running = running_at(0)
    state = refuse_step(
        running, attempt=1, step_index=0, now=NOW, reason="out of stock", workflow=WF
    )
    assert state.process_state is ProcessState.COMPENSATED
    assert state.finished_at == NOW and state.complete_by is None


def test_a_refusal_in_a_workflow_without_compensation_is_an_error_owing_an_alert():
    running = running_at(0, ERROR_WF)
    state = refuse_step(
        running, attempt=1, step_index=0, now=NOW, reason="x" * 5000, workflow=ERROR_WF
    )
    assert state.process_state is ProcessState.ERROR
    assert state.alert_pending is True
    assert state.locked_by is None
    assert state.last_error is not None and len(state.last_error) == 1000
    assert alert_sent(state).alert_pending is False
    with pytest.raises(IllegalTransition):
        alert_sent(alert_sent(state))


def test_undo_steps_walk_backwards_with_new_attempts_then_compensated():
    running = running_at(2)
    pending = refuse_step(
        running, attempt=running.attempt, step_index=2, now=NOW, reason="r", workflow=WF
    )
    undoing = claim(pending, instance_id="s", now=NOW, workflow=WF)
    assert (undoing.process_state, undoing.mode, undoing.step_index) == (
        ProcessState.COMPENSATING,
        "undo",
        1,
    )
    with pytest.raises(StaleReply):  # a forward reply does not apply to an undo attempt
        complete_step(
            undoing, attempt=undoing.attempt, step_index=1, instance_id="s", now=NOW, workflow=WF
        )
    nxt = complete_step(
        undoing,
        attempt=undoing.attempt,
        step_index=1,
        mode="undo",
        instance_id="s",
        now=NOW,
        workflow=WF,
    )
    assert (nxt.step_index, nxt.attempt, nxt.mode) == (0, undoing.attempt + 1, "undo")
    done = complete_step(
        nxt, attempt=nxt.attempt, step_index=0, mode="undo", instance_id="s", now=NOW, workflow=WF
    )
    assert done.process_state is ProcessState.COMPENSATED and done.is_terminal


def test_a_refused_undo_is_an_error():
    running = running_at(1)
    pending = refuse_step(
        running, attempt=running.attempt, step_index=1, now=NOW, reason="r", workflow=WF
    )
    undoing = claim(pending, instance_id="s", now=NOW, workflow=WF)
    failed = refuse_step(
        undoing,
        attempt=undoing.attempt,
        step_index=0,
        mode="undo",
        now=NOW,
        reason="refund refused",
        workflow=WF,
    )
    assert failed.process_state is ProcessState.ERROR and failed.alert_pending


def test_expiry_below_the_threshold_retries_with_a_growing_backoff():
    state = running_at(1)
    later = state.complete_by
    first = expire(state, now=later, workflow=WF, policy=POLICY)
    assert first.action == "retry" and first.delay == timedelta(seconds=2)
    s1 = first.state
    assert (s1.process_state, s1.locked_by, s1.failure_count, s1.step_index) == (
        ProcessState.PENDING,
        None,
        1,
        1,
    )
    assert s1.not_before == later + timedelta(seconds=2)
    assert s1.complete_by == s1.not_before + WF.pickup_budget
    with pytest.raises(NotYet):
        claim(s1, instance_id="s", now=later, workflow=WF)
    again = claim(s1, instance_id="s", now=s1.not_before, workflow=WF)
    assert again.failure_count == 1 and again.attempt == state.attempt + 1
    assert again.complete_by is not None
    second = expire(again, now=again.complete_by, workflow=WF, policy=POLICY)
    assert second.action == "retry" and second.delay == timedelta(seconds=4)


def test_backoff_is_capped():
    assert POLICY.backoff(10) == timedelta(seconds=5)
    assert POLICY.backoff(100) == timedelta(seconds=5)  # no overflow on the way to the cap


def test_expiry_at_the_threshold_compensates_including_the_step_that_may_have_run():
    state = replace(running_at(1), failure_count=POLICY.max_failures - 1)
    assert state.complete_by is not None
    decided = expire(state, now=state.complete_by, workflow=WF, policy=POLICY)
    assert decided.action == "compensate"
    assert (decided.state.mode, decided.state.step_index) == ("undo", 1)
    assert decided.state.last_error is not None
    assert "expired 3 times" in decided.state.last_error


def test_a_step_may_declare_its_own_failure_threshold():
    steps = list(WF.steps)
    steps[1] = replace(steps[1], max_failures=1)  # charge: fail for good at its first expiry
    own = Workflow("own", tuple(steps), pickup_budget=WF.pickup_budget)
    state = running_at(1, own)
    assert state.complete_by is not None
    assert expire(state, now=state.complete_by, workflow=own, policy=POLICY).action == "compensate"
    first = running_at(0, own)  # reserve keeps the policy's three
    assert first.complete_by is not None
    assert expire(first, now=first.complete_by, workflow=own, policy=POLICY).action == "retry"
    with pytest.raises(ValueError, match="max_failures must be an int from 1 to 100"):
        replace(steps[0], max_failures=0)


def test_expiry_at_the_threshold_of_an_undo_is_an_error():
    running = running_at(1)
    pending = refuse_step(
        running, attempt=running.attempt, step_index=1, now=NOW, reason="r", workflow=WF
    )
    undoing = replace(claim(pending, instance_id="s", now=NOW, workflow=WF), failure_count=2)
    assert undoing.complete_by is not None
    decided = expire(undoing, now=undoing.complete_by, workflow=WF, policy=POLICY)
    assert decided.action == "error"
    assert decided.state.process_state is ProcessState.ERROR and decided.state.alert_pending


def test_expiry_at_the_threshold_without_compensation_is_an_error():
    state = replace(running_at(0, ERROR_WF), failure_count=2)
    decided = expire(state, now=state.complete_by, workflow=ERROR_WF, policy=POLICY)
    assert decided.action == "error" and decided.state.failure_count == 3


def test_a_pending_order_past_its_pickup_deadline_expires_too():
    pending = initial_state("o1", WF, reply_to=None, now=NOW)
    assert pending.complete_by is not None
    decided = expire(pending, now=pending.complete_by, workflow=WF, policy=POLICY)
    assert decided.action == "retry" and decided.state.failure_count == 1


@pytest.mark.parametrize("offset", [-1, 0])
def test_nothing_expires_before_its_deadline_or_after_it_finished(offset):
    state = running_at(0)
    if offset < 0:
        with pytest.raises(IllegalTransition):
            expire(state, now=state.complete_by - timedelta(seconds=1), workflow=WF, policy=POLICY)
    done = replace(state, process_state=ProcessState.PROCESSED, complete_by=None)
    with pytest.raises(IllegalTransition):
        expire(done, now=NOW + timedelta(days=1), workflow=WF, policy=POLICY)


def test_resubmit_takes_an_error_back_to_pending_with_a_clean_count():
    error = refuse_step(
        running_at(0, ERROR_WF), attempt=1, step_index=0, now=NOW, reason="r", workflow=ERROR_WF
    )
    again = resubmit(alert_sent(error), now=NOW, workflow=ERROR_WF)
    assert (again.process_state, again.failure_count, again.locked_by, again.step_index) == (
        ProcessState.PENDING,
        0,
        None,
        0,
    )
    assert again.alert_pending is False and again.finished_at is None
    assert again.complete_by == NOW + ERROR_WF.pickup_budget
    assert claim(again, instance_id="s", now=NOW, workflow=ERROR_WF).attempt == 2


@pytest.mark.parametrize(
    "state", [ProcessState.PENDING, ProcessState.PROCESSED, ProcessState.COMPENSATED]
)
def test_only_an_error_can_be_resubmitted(state):
    with pytest.raises(IllegalTransition):
        resubmit(replace(running_at(0), process_state=state), now=NOW, workflow=WF)


def test_close_ends_an_error_order_for_good():
    error = alert_sent(error_owing_an_alert())
    later = NOW + timedelta(hours=1)
    closed = close(error, now=later)
    assert closed.process_state is ProcessState.CLOSED and closed.is_terminal
    assert (closed.finished_at, closed.updated_at, closed.locked_by) == (later, later, None)
    assert closed.last_error == error.last_error  # what went wrong stays on record
    with pytest.raises(IllegalTransition):
        resubmit(closed, now=later, workflow=ERROR_WF)  # closed means no more work
    with pytest.raises(IllegalTransition):
        close(closed, now=later)


@pytest.mark.parametrize(
    "state", [ProcessState.PENDING, ProcessState.PROCESSED, ProcessState.COMPENSATED]
)
def test_only_an_error_can_be_closed(state):
    with pytest.raises(IllegalTransition):
        close(replace(running_at(0), process_state=state), now=NOW)


def test_a_close_while_the_alert_is_owed_is_refused():
    with pytest.raises(IllegalTransition, match="alert"):
        close(error_owing_an_alert(), now=NOW)


# --- fencing: one decision, explicit outcomes ---------------------------------------------


def _running(attempt: int = 3, step_index: int = 1, mode: Mode = "do"):
    state = claim(
        initial_state("o1", WF, reply_to=None, now=NOW), instance_id="s1", now=NOW, workflow=WF
    )
    process = ProcessState.PROCESSING if mode == "do" else ProcessState.COMPENSATING
    return replace(state, attempt=attempt, step_index=step_index, mode=mode, process_state=process)


def _fence(state, *, step_index=1, step="charge", attempt=3, mode="do", outcome="ok"):
    return fence(
        state, WF, step_index=step_index, step=step, attempt=attempt, mode=mode, outcome=outcome
    )


@pytest.mark.parametrize("outcome", ["ok", "error", "deferred"])
def test_fence_applies_every_reply_of_the_running_attempt(outcome):
    assert _fence(_running(), outcome=outcome) is Fence.CURRENT


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ({"attempt": 2}, Fence.EARLIER_ATTEMPT),  # an expired attempt's ok: the step is done
        ({"attempt": 2, "outcome": "error"}, Fence.OTHER_ATTEMPT),  # its refusal: not applied
        ({"attempt": 2, "outcome": "deferred"}, Fence.OTHER_ATTEMPT),
        ({"attempt": 4}, Fence.OTHER_ATTEMPT),  # forged: an attempt nobody claimed
        ({"step_index": 0, "step": "reserve"}, Fence.OTHER_STEP),
        ({"mode": "undo"}, Fence.OTHER_STEP),
        ({"step": "ship"}, Fence.UNKNOWN_STEP),  # name not at that index
        ({"step_index": 7, "step": "charge"}, Fence.UNKNOWN_STEP),  # no such index
        ({"step_index": -1, "step": "ship"}, Fence.UNKNOWN_STEP),
    ],
)
def test_fence_names_why_a_reply_applies_or_not(reply, verdict):
    assert _fence(_running(), **reply) is verdict
    assert verdict.applies is (verdict in (Fence.CURRENT, Fence.EARLIER_ATTEMPT))


@pytest.mark.parametrize("process_state", sorted(TERMINAL_STATES))
@pytest.mark.parametrize("outcome", ["ok", "error", "deferred"])
def test_fence_refuses_every_reply_once_the_order_is_finished(process_state, outcome):
    finished = replace(_running(), process_state=process_state)
    assert _fence(finished, outcome=outcome) is Fence.NOT_RUNNING


@pytest.mark.parametrize("attempt", [2, 3])
def test_an_order_waiting_for_a_retry_takes_only_an_ok_of_its_step(attempt):
    waiting = replace(_running(), process_state=ProcessState.PENDING, locked_by=None)
    assert _fence(waiting, attempt=attempt) is Fence.EARLIER_ATTEMPT
    assert _fence(waiting, attempt=attempt, outcome="error") is Fence.NOT_RUNNING
    assert _fence(waiting, attempt=attempt, outcome="deferred") is Fence.NOT_RUNNING
    assert _fence(waiting, attempt=4) is Fence.OTHER_ATTEMPT
    assert _fence(replace(waiting, mode="undo"), attempt=attempt) is Fence.OTHER_STEP


def _reply(state, outcome="ok", **change):
    fields = {
        "order_id": state.order_id,
        "step": WF.steps[state.step_index].name,
        "step_index": state.step_index,
        "attempt": state.attempt,
        "mode": state.mode,
        "outcome": outcome,
        "error": "refused" if outcome == "error" else None,
        "incarnation": state.incarnation or None,
    }
    return StepReply(**(fields | change))


def test_decide_reply_says_what_follows_each_transition():
    first = _running(attempt=1, step_index=0)
    advanced = decide_reply(first, _reply(first), instance_id="s", now=NOW, workflow=WF)
    assert (advanced.then, advanced.history_kind) == (Then.DISPATCH, "completed")
    assert advanced.state.step_index == 1

    last = _running(attempt=5, step_index=2)
    done = decide_reply(last, _reply(last), instance_id="s", now=NOW, workflow=WF)
    assert (done.then, done.state.process_state) == (Then.FINISH, ProcessState.PROCESSED)

    refused = decide_reply(last, _reply(last, "error"), instance_id="s", now=NOW, workflow=WF)
    assert (refused.then, refused.history_kind) == (Then.COMPENSATE, "refused")
    assert (refused.state.process_state, refused.state.mode) == (ProcessState.PENDING, "undo")

    undo = _running(attempt=9, step_index=0, mode="undo")
    compensated = decide_reply(undo, _reply(undo), instance_id="s", now=NOW, workflow=WF)
    assert (compensated.then, compensated.history_kind) == (Then.FINISH, "undone")
    assert compensated.state.process_state is ProcessState.COMPENSATED

    failed_undo = decide_reply(undo, _reply(undo, "error"), instance_id="s", now=NOW, workflow=WF)
    assert (failed_undo.then, failed_undo.state.process_state) == (Then.FINISH, ProcessState.ERROR)


def test_decide_reply_refuses_a_reply_the_fence_would_drop():
    state = _running()
    with pytest.raises(StaleReply):
        decide_reply(state, _reply(state, attempt=4), instance_id="s", now=NOW, workflow=WF)
    with pytest.raises(StaleReply):
        refusal = _reply(state, "error", attempt=2)
        decide_reply(state, refusal, instance_id="s", now=NOW, workflow=WF)


# --- clock skew allowance ----------------------------------------------------------------


def test_a_deadline_counts_as_passed_only_after_the_skew_allowance():
    policy = RetryPolicy(clock_skew=timedelta(seconds=2))
    running = _running()
    deadline = running.complete_by
    assert deadline is not None
    # A Supervisor whose clock runs 1.9 s ahead of the agent's must not expire the step.
    assert not policy.expired(running, deadline + timedelta(seconds=1.9))
    with pytest.raises(IllegalTransition):
        expire(running, now=deadline + timedelta(seconds=1.9), workflow=WF, policy=policy)
    assert policy.expired(running, deadline + timedelta(seconds=2))
    decided = expire(running, now=deadline + timedelta(seconds=2), workflow=WF, policy=policy)
    assert decided.action == "retry"


def test_without_an_allowance_the_deadline_itself_expires_and_a_negative_one_is_refused():
    running = _running()
    assert RetryPolicy().expired(running, running.complete_by)
    with pytest.raises(ValueError, match="clock_skew"):
        RetryPolicy(clock_skew=timedelta(seconds=-1))


def error_owing_an_alert():
    return refuse_step(
        running_at(0, ERROR_WF), attempt=1, step_index=0, now=NOW, reason="r", workflow=ERROR_WF
    )


def test_a_resubmit_while_the_alert_is_owed_is_refused():
    """It would cancel the episode's only alert before it went out."""
    error = error_owing_an_alert()
    with pytest.raises(IllegalTransition, match="alert"):
        resubmit(error, now=NOW, workflow=ERROR_WF)
    assert resubmit(alert_sent(error), now=NOW, workflow=ERROR_WF).alert_pending is False


LEASE = timedelta(seconds=60)
SKEW = timedelta(seconds=2)


def test_a_live_alert_claim_excludes_every_caller_its_own_instance_included():
    claimed = claim_alert(error_owing_an_alert(), instance_id="host-1", now=NOW, lease=LEASE)
    assert (claimed.alert_claimed_by, claimed.alert_claimed_until) == ("host-1", NOW + LEASE)
    for instance in ("host-1", "host-2"):
        with pytest.raises(IllegalTransition):
            claim_alert(claimed, instance_id=instance, now=NOW + LEASE / 2, lease=LEASE)


def test_a_lapsed_alert_claim_is_taken_over_only_after_the_skew_allowance():
    claimed = claim_alert(error_owing_an_alert(), instance_id="host-1", now=NOW, lease=LEASE)
    lapsed = NOW + LEASE
    with pytest.raises(IllegalTransition):
        claim_alert(claimed, instance_id="host-2", now=lapsed, lease=LEASE, clock_skew=SKEW)
    taken = claim_alert(
        claimed, instance_id="host-2", now=lapsed + SKEW, lease=LEASE, clock_skew=SKEW
    )
    assert taken.alert_claimed_by == "host-2"
    assert taken.alert_claimed_until == lapsed + SKEW + LEASE


# --- the in-flight marker's due time ---------------------------------------------------------

_SHORT = Workflow(
    name="mixed",
    steps=(
        StepDefinition("slow", "agent", action="slow", budget=timedelta(seconds=90), undo="unslow"),
        StepDefinition("fast", "agent", action="fast", budget=timedelta(seconds=5), undo="unfast"),
    ),
    pickup_budget=timedelta(seconds=30),
)


def _every_next_deadline(state, workflow, at):
    """The deadline of every transition that can follow ``state`` at time ``at``."""
    policy = RetryPolicy(max_failures=2)
    found = []
    if state.process_state is ProcessState.PENDING and state.locked_by is None:
        found.append(
            claim(replace(state, not_before=None), instance_id="s", now=at, workflow=workflow)
        )
    if state.is_running:
        found.append(
            complete_step(
                state,
                attempt=state.attempt,
                step_index=state.step_index,
                mode=state.mode,
                instance_id="s",
                now=at,
                workflow=workflow,
            )
        )
        found.append(
            begin_compensation(
                state, from_index=state.step_index, now=at, workflow=workflow, reason="x"
            )
        )
    if not state.is_terminal and state.complete_by is not None and state.complete_by <= at:
        found.append(expire(state, now=at, workflow=workflow, policy=policy).state)
    return [s.complete_by for s in found if s.complete_by is not None]


@pytest.mark.parametrize("step_index", [0, 1])
@pytest.mark.parametrize("later", [0.0, 1.0, 4.9, 5.0, 29.0, 89.0, 500.0])
def test_a_marker_is_due_no_later_than_any_deadline_the_order_can_get(step_index, later):
    """The Supervisor lists only due markers: one armed at ``now`` must come due before the
    order's current deadline and before any deadline a transition after ``now`` sets."""
    pending = initial_state("o1", _SHORT, reply_to=None, now=NOW)
    running = replace(
        claim(pending, instance_id="s", now=NOW, workflow=_SHORT),
        step_index=step_index,
        complete_by=NOW + _SHORT.steps[step_index].budget,
    )
    for state in (pending, running):
        due = look_again_at(state, now=NOW, workflow=_SHORT)
        assert state.complete_by is not None and due <= state.complete_by
        at = NOW + timedelta(seconds=later)
        for deadline in _every_next_deadline(state, _SHORT, at):
            assert due <= deadline


def test_a_finished_order_is_due_at_once():
    done = replace(
        initial_state("o1", WF, reply_to=None, now=NOW), process_state=ProcessState.PROCESSED
    )
    assert look_again_at(done, now=NOW, workflow=WF) == NOW

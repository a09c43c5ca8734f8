"""The chaos checker on synthetic evidence: a clean run reports nothing, and each run that
holds exactly one violation is reported with exactly that class."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sas_local.chaos.checker import COMMITTED, KINDS, Design, Evidence, check

pytestmark = [pytest.mark.unit, pytest.mark.chaos]

DESIGN = Design.load()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
STEPS = [(s.name, s.agent, s.action, s.undo) for s in DESIGN.steps]
V2 = [(s.name, s.agent, s.action, s.undo) for s in DESIGN.workflows[("order", 2)].steps]
INCARNATION = "0123456789ab"
"""Every synthetic order's incarnation (its state row's ``Incarnation``), in its keys."""


@dataclass
class World:
    """Synthetic table rows, ledger entries, alerts and poison queues."""

    entities: list[dict[str, Any]] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)
    poison: dict[str, list[str]] = field(default_factory=dict)
    submitted: list[str] = field(default_factory=list)
    clock: float = 0.0
    commits: int = 0
    """Rows are committed in the order they are written (the service's Timestamp)."""

    def at(self, seconds: float = 1.0) -> datetime:
        self.clock += seconds
        return T0 + timedelta(seconds=self.clock)

    def begin(self, order: str) -> None:
        """An order submitted and its first step (reserve) claimed at attempt 1."""
        self.submitted.append(order)
        self.history(order, "submitted", 0, None)
        self.history(order, "claimed", 1, "reserve")

    def step_row(self, order: str, name: str) -> None:
        """A completed step's record, as the reply that completed it writes it."""
        rows = [e for e in self.entities if e["PartitionKey"] == order and "Name" in e]
        if all(row["Name"] != name for row in rows):
            row_key = f"{DESIGN.step_row_prefix}{len(rows):02d}:{name}"
            self.entities.append({"PartitionKey": order, "RowKey": row_key, "Name": name})

    def history(self, order: str, kind: str, attempt: int, step: str | None, mode: str = "do",
                detail: str | None = None, at: datetime | None = None) -> datetime:  # fmt: skip
        when = at or self.at()
        self.commits += 1
        self.entities.append(
            {
                COMMITTED: float(self.commits),
                "PartitionKey": order,
                "RowKey": f"{DESIGN.history_row_prefix}{when:%Y%m%dT%H%M%S.%f}:{attempt:05d}:x",
                "At": when,
                "Kind": kind,
                "Attempt": attempt,
                "Step": step,
                "Mode": mode,
                "Detail": detail,
            }
        )
        if kind == "completed" and mode == "do" and step is not None:
            self.step_row(order, step)
        return when

    def state(self, order: str, ps: str, attempt: int, step: int, mode: str = "do",
              **more: Any) -> None:  # fmt: skip
        self.entities.append(
            {
                "PartitionKey": order,
                "RowKey": DESIGN.state_row,
                "Workflow": "order",
                "ProcessState": ps,
                "Attempt": attempt,
                "StepIndex": step,
                "Mode": mode,
                "FailureCount": 0,
                "Incarnation": INCARNATION,
                **more,
            }
        )

    def do(self, order: str, index: int, *, undone: bool = False, key: str | None = None,
           steps: list[tuple[str, str, str, str | None]] = STEPS) -> None:  # fmt: skip
        name, agent, action, undo = steps[index]
        do_key = key or f"{order}:{INCARNATION}:{name}"
        self.effects.append(
            {
                "kind": "do",
                "service": agent,
                "action": action,
                "idempotency_key": do_key,
                "order_id": order,
                "undone_at": "2026-01-01T00:00:09Z" if undone else None,
            }
        )
        if undone:
            self.effects.append(
                {
                    "kind": "undo",
                    "service": agent,
                    "action": undo,
                    "idempotency_key": f"{do_key}-u",
                    "order_id": order,
                    "original_key": do_key,
                    "outcome": "undone",
                }
            )

    def alert(self, order: str, attempt: int, error_at: datetime) -> None:
        alert_id = f"{order}:alert:{attempt}:{error_at.timestamp():.6f}"
        self.alerts.append(json.dumps({"alert_id": alert_id, "order_id": order}))

    def evidence(self) -> Evidence:
        return Evidence(self.entities, self.alerts, self.poison, {"effects": self.effects},
                        self.submitted)  # fmt: skip

    # --- whole orders, each a legal run ---------------------------------------------------

    def processed(self, order: str) -> None:
        self.submitted.append(order)
        self.history(order, "submitted", 0, None)
        self.history(order, "claimed", 1, "reserve")
        for attempt, (name, *_rest) in enumerate(STEPS, start=1):
            self.history(order, "completed", attempt, name)
            self.do(order, attempt - 1)
        self.state(order, "Processed", 3, 2)

    def compensated(self, order: str) -> None:
        """reserve done, charge refused, reserve undone; with an expiry and a retry on the
        undo, and a late reply dropped."""
        self.submitted.append(order)
        self.history(order, "submitted", 0, None)
        self.history(order, "claimed", 1, "reserve")
        self.history(order, "completed", 1, "reserve")
        self.do(order, 0, undone=True)
        self.history(order, "refused", 2, "charge")
        self.history(order, "claimed", 3, "reserve", "undo")
        self.history(order, "expired_retry", 3, "reserve", "undo", "failure 1 of 3")
        self.history(order, "claimed", 4, "reserve", "undo")
        self.history(order, "reply_dropped", 3, "reserve", "undo")
        self.history(order, "undone", 4, "reserve", "undo")
        self.state(order, "Compensated", 4, 0, "undo")

    def error(self, order: str, *, alert: bool = True, resubmitted: bool = True) -> datetime:
        """ship refused, charge's undo refused: Error, alerted, resubmitted, Error again."""
        self.submitted.append(order)
        self.history(order, "submitted", 0, None)
        self.history(order, "claimed", 1, "reserve")
        self.history(order, "completed", 1, "reserve")
        self.history(order, "completed", 2, "charge")
        self.do(order, 0)
        self.do(order, 1)
        self.history(order, "refused", 3, "ship")
        self.history(order, "claimed", 4, "charge", "undo")
        first = self.history(order, "refused", 4, "charge", "undo")
        if alert:
            self.alert(order, 4, first)
        if not resubmitted:
            self.state(order, "Error", 4, 1, "undo", FinishedAt=first)
            return first
        self.history(order, "alert_claimed", 4, None, "undo", at=self.at(70))
        self.alert(order, 4, first)  # the re-claimer's copy: same id, allowed by its claim
        self.history(order, "resubmitted", 4, "charge", "undo")
        self.history(order, "claimed", 5, "charge", "undo")
        second = self.history(order, "refused", 5, "charge", "undo")
        self.alert(order, 5, second)
        self.state(order, "Error", 5, 1, "undo", FinishedAt=second)
        return second


def clean() -> World:
    world = World()
    world.processed("p1")
    world.compensated("c1")
    world.error("e1")
    return world


def kinds(world: World) -> list[str]:
    return sorted({v.kind for v in check(world.evidence(), DESIGN).violations})


def test_a_clean_run_has_no_violation_and_counts_outcomes_and_recoveries() -> None:
    verdict = check(clean().evidence(), DESIGN)
    assert verdict.violations == []
    assert verdict.outcomes == {"Processed": 1, "Compensated": 1, "Error": 1}
    assert verdict.recoveries["expired_retry"] == 1
    assert verdict.recoveries["reply_dropped"] == 1
    assert verdict.recoveries["alert_claimed"] == 1
    assert verdict.recoveries["resubmitted"] == 1
    assert verdict.error_episodes == 2


def retried_once(
    detail: str,
    kind: str = "expired_retry",
    *,
    world: World | None = None,
    expired_after_claim: timedelta | None = None,
) -> World:
    """Order s1 (into ``world``): reserve claimed, expired once as ``kind`` with ``detail``
    (``expired_after_claim`` after the claim by its row's time), claimed again, then Processed."""
    world = world or World()
    world.submitted.append("s1")
    world.history("s1", "submitted", 0, None)
    claimed = world.history("s1", "claimed", 1, "reserve")
    at = None if expired_after_claim is None else claimed + expired_after_claim
    world.history("s1", kind, 1, "reserve", detail=detail, at=at)
    world.history("s1", "claimed", 2, "reserve")
    world.history("s1", "completed", 2, "reserve")
    world.history("s1", "completed", 3, "charge")
    world.history("s1", "completed", 4, "ship")
    for index in range(3):
        world.do("s1", index)
    world.state("s1", "Processed", 4, 2)
    return world


def test_skewed_clocks_within_an_attempt_do_not_confuse_the_replay() -> None:
    # the Supervisor's clock runs behind the Scheduler's: its expiry looks older than the claim
    world = retried_once("failure 1 of 3", expired_after_claim=timedelta(seconds=-1))
    assert kinds(world) == []


def test_a_reclaim_and_a_resubmit_swapped_by_skew_are_put_back_in_order() -> None:
    """Seen in the 5,000-order run (c42-00912): the re-claim came 1.2 s before the resubmit,
    but the re-claimer's clock ran behind, so its row looks later."""
    world = World()
    world.processed("p1")
    error_at = world.error("e1", resubmitted=False)
    world.entities = [
        e for e in world.entities if (e["PartitionKey"], e["RowKey"]) != ("e1", DESIGN.state_row)
    ]
    resubmit_at = error_at + timedelta(seconds=69.4)
    world.history("e1", "alert_claimed", 4, None, "undo", at=resubmit_at + timedelta(seconds=0.3))
    world.alert("e1", 4, error_at)
    world.history("e1", "resubmitted", 4, "charge", "undo", at=resubmit_at)
    world.clock += 80
    world.history("e1", "claimed", 5, "charge", "undo")
    again = world.history("e1", "refused", 5, "charge", "undo")
    world.alert("e1", 5, again)
    world.state("e1", "Error", 5, 1, "undo", FinishedAt=again)
    assert kinds(world) == []


def test_the_rows_of_one_transaction_stamped_microseconds_apart_in_any_order() -> None:
    """The service stamps each row of a transaction as it applies it: a reply's claim of the
    next step (or a submission's claim of the first) may carry the earlier stamp."""
    world = World()
    world.processed("p1")
    rows = [e for e in world.entities if e["PartitionKey"] == "p1" and "Kind" in e]
    submitted, first_claim, reserve_done = rows[0], rows[1], rows[2]
    first_claim[COMMITTED] = submitted[COMMITTED] - 0.000_01  # one create transaction
    world.history("p1", "claimed", 2, "charge")
    world.entities[-1][COMMITTED] = reserve_done[COMMITTED] - 0.000_03  # with reserve's reply
    assert kinds(world) == []


def test_a_submitted_order_without_state_or_parking_is_lost() -> None:
    world = clean()
    world.submitted.append("ghost")
    assert kinds(world) == ["lost_order"]


def test_a_parked_submission_is_not_lost() -> None:
    world = clean()
    world.submitted.append("parked1")
    body = json.dumps({"type": "OrderSubmitted", "order_id": "parked1"}).encode()
    world.entities.append(
        {"PartitionKey": DESIGN.rejected_partition, "RowKey": "r1", "Body00": body}
    )
    assert kinds(world) == []


def test_an_order_left_in_the_in_flight_index_is_stuck() -> None:
    world = clean()
    world.entities.append({"PartitionKey": DESIGN.live_partition, "RowKey": "p1"})
    assert kinds(world) == ["stuck_order"]


def test_an_effect_applied_twice_is_reported() -> None:
    world = clean()
    world.do("p1", 1, key="p1:charge:again")
    assert kinds(world) == ["effect_applied_twice", "unexpected_effect"]  # the key is wrong too
    world = clean()
    world.do("p1", 1)  # the same key twice: a provider that does not de-duplicate
    assert kinds(world) == ["effect_applied_twice"]


def test_a_compensated_order_with_an_effect_left_applied_is_reported() -> None:
    world = clean()
    world.do("c1", 1)  # charge applied (say by a late do), never undone
    assert kinds(world) == ["compensation_incomplete"]


def test_a_processed_order_missing_an_effect_is_reported() -> None:
    world = clean()
    world.effects = [
        e for e in world.effects if not (e["order_id"] == "p1" and e["action"] == "ship")
    ]
    assert kinds(world) == ["processed_effect_missing"]


@pytest.mark.parametrize("how", ["missing", "two_ids", "extra_copy", "early_reclaim"])
def test_an_error_with_wrong_alerts_is_reported(how: str) -> None:
    world = World()
    world.processed("p1")
    if how == "missing":
        world.error("e1", alert=False, resubmitted=False)
    elif how == "two_ids":
        error_at = world.error("e1", resubmitted=False)
        world.alert("e1", 4, error_at + timedelta(seconds=1))
    elif how == "extra_copy":
        error_at = world.error("e1", resubmitted=False)
        world.alert("e1", 4, error_at)  # a second copy, but nobody re-claimed
    else:
        error_at = world.error("e1", resubmitted=False)
        world.history("e1", "alert_claimed", 4, None, "undo", at=error_at + timedelta(seconds=2))
        world.alert("e1", 4, error_at)
    assert kinds(world) == ["error_alerts"]


def test_an_alert_for_an_order_that_never_was_in_error_is_reported() -> None:
    world = clean()
    world.alert("p1", 3, T0)
    assert kinds(world) == ["alert_without_error"]


def late_reply(kind: str, step: str = "reserve") -> World:
    """reserve's attempt 1 expires and is claimed again; then a reply for attempt 1 lands."""
    world = World()
    world.begin("s1")
    world.history("s1", "expired_retry", 1, "reserve", detail="failure 1 of 3")
    world.history("s1", "claimed", 2, "reserve")
    world.history("s1", kind, 1, step)
    return world


def test_an_ok_of_an_expired_attempt_of_the_step_still_waited_on_is_legal() -> None:
    world = late_reply("completed")  # attempt 2 runs; attempt 1's ok completes reserve
    world.history("s1", "completed", 3, "charge")
    world.history("s1", "completed", 4, "ship")
    world.history("s1", "reply_dropped", 2, "reserve")  # the retry's reply, now the stale one
    for index in range(3):
        world.do("s1", index)
    world.state("s1", "Processed", 4, 2)
    assert kinds(world) == []


def test_a_refusal_of_an_expired_attempt_applied_is_reported() -> None:
    world = late_reply("refused")  # a refusal speaks only for its own attempt
    world.state("s1", "Compensated", 2, 0)
    assert kinds(world) == ["stale_reply_applied"]


def test_an_ok_for_a_step_the_order_moved_past_applied_is_reported() -> None:
    world = World()
    world.processed("p1")
    world.entities = [
        e for e in world.entities if (e["PartitionKey"], e["RowKey"]) != ("p1", DESIGN.state_row)
    ]
    world.history("p1", "completed", 1, "reserve")  # reserve's reply again, after it was done
    world.state("p1", "Processed", 3, 2)
    assert kinds(world) == ["stale_reply_applied"]


def test_an_ok_for_an_attempt_never_claimed_for_the_step_is_reported() -> None:
    world = late_reply("completed", step="reserve")
    world.entities[-1]["Attempt"] = 3  # attempt 3 was never claimed
    world.history("s1", "completed", 4, "charge")
    world.history("s1", "completed", 5, "ship")
    for index in range(3):
        world.do("s1", index)
    world.state("s1", "Processed", 5, 2)
    assert kinds(world) == ["stale_reply_applied"]


def test_a_history_no_legal_transition_explains_is_reported() -> None:
    world = clean()
    world.history("p1", "resubmitted", 3, "ship")  # a Processed order "resubmitted"
    assert kinds(world) == ["illegal_transition"]


def test_a_history_that_does_not_end_in_the_state_row_is_reported() -> None:
    world = World()
    world.processed("p1")
    world.entities[-1]["Attempt"] = 4
    assert kinds(world) == ["illegal_transition"]


def test_a_failure_count_past_the_threshold_is_reported() -> None:
    world = World()
    world.processed("p1")
    world.error("e1", resubmitted=False)
    world.entities[-1]["FailureCount"] = DESIGN.max_failures + 1
    assert kinds(world) == ["failure_count_exceeded"]


@pytest.mark.parametrize(
    "detail", ["failure 3 of 3", "failure 1 of 6"], ids=["retry-at-threshold", "other-threshold"]
)
def test_a_retry_past_the_threshold_or_against_another_threshold_is_reported(detail: str) -> None:
    world = World()
    world.processed("p1")
    retried_once(detail, world=world)
    # A retry at the threshold is also a transition the replay cannot explain.
    assert "failure_count_exceeded" in kinds(world)
    assert set(kinds(world)) <= {"failure_count_exceeded", "illegal_transition"}


def test_an_expiry_taken_as_the_loads_is_a_retry_that_counts_no_failure() -> None:
    spared = "Processing past 12:00:00, not counted: saturated (1 of 5)"
    assert kinds(retried_once(spared)) == []
    assert kinds(retried_once("Processing past 12:00:00, failure 1 of 3")) == []
    # beyond its allowance, or anything but a retry, no legal run explains it
    assert kinds(retried_once(spared.replace("1 of 5", "6 of 5"))) == ["illegal_transition"]
    assert "illegal_transition" in kinds(retried_once(spared, kind="expired_compensate"))


def workspace(world: World, order: str, expiries: int, end: str = "completed") -> None:
    """A workspace order (on_failure "error"): create, configure, then notify expiring
    ``expiries`` times (its own threshold is 5) before ``end`` (completed, refused, or an
    expiry kind)."""
    world.submitted.append(order)
    world.history(order, "submitted", 0, None)
    world.history(order, "claimed", 1, "create")
    world.history(order, "completed", 1, "create")
    world.history(order, "completed", 2, "configure")
    for failure in range(1, expiries + 1):
        detail = f"failure {failure} of 5"
        world.history(order, "expired_retry", 2 + failure, "notify", detail=detail)
        world.history(order, "claimed", 3 + failure, "notify")
    attempt = 3 + expiries
    done = [("cloud", "create"), ("cloud", "configure")]
    if end == "completed":
        world.history(order, "completed", attempt, "notify")
        done.append(("mailer", "notify"))
        world.state(order, "Processed", attempt, 2, Workflow="workspace")
    else:
        failures = expiries + (end != "refused")
        detail = f"failure {failures} of 5" if end != "refused" else "mailbox full"
        error_at = world.history(order, end, attempt, "notify", detail=detail)
        world.state(order, "Error", attempt, 2, Workflow="workspace", FailureCount=failures)
        world.alert(order, attempt, error_at)
    for agent, action in done:  # a Python agent's effect rows, read as ledger entries
        key = f"{order}:{INCARNATION}:{action}"
        entry = {"kind": "do", "service": agent, "action": action, "idempotency_key": key}
        world.effects.append({**entry, "order_id": order})


def test_a_workspace_order_is_judged_by_its_own_workflow_and_thresholds() -> None:
    world = World()
    workspace(world, "w1", expiries=4)  # four expiries: legal under notify's own 5
    workspace(world, "w2", expiries=0, end="refused")  # Error, nothing undone: on_failure
    workspace(world, "w3", expiries=4, end="expired_error")
    assert kinds(world) == []


def test_a_workspace_order_compensated_or_retried_past_its_threshold_is_reported() -> None:
    world = World()
    workspace(world, "w1", expiries=4, end="expired_compensate")
    assert "illegal_transition" in kinds(world)
    world = World()
    workspace(world, "w2", expiries=5)
    assert "failure_count_exceeded" in kinds(world)


def test_an_order_of_an_unknown_workflow_is_reported() -> None:
    world = World()
    world.processed("p1")
    world.entities[-1]["Workflow"] = "nonesuch"
    assert kinds(world) == ["illegal_transition"]


def test_any_poisoned_message_is_reported() -> None:
    world = clean()
    world.poison["sas-replies-poison"] = [json.dumps({"order_id": "p1"})]
    assert kinds(world) == ["poisoned_message"]
    assert check(world.evidence(), DESIGN).violations[0].order_id == "p1"


@pytest.mark.parametrize(
    ("order", "entry"),
    [
        ("ghost", {"service": "cloud", "action": "create", "idempotency_key": "ghost:create"}),
        ("p1", {"service": "cloud", "action": "create", "idempotency_key": "p1:create"}),
        ("p1", {"service": "payment", "action": "charge", "idempotency_key": "p1:charge:2"}),
    ],
    ids=["never-submitted", "foreign-action", "key-not-the-step-s"],
)
def test_an_effect_no_legal_run_makes_is_reported(order: str, entry: dict[str, str]) -> None:
    world = clean()
    world.effects = [e for e in world.effects if (e["order_id"], e["action"]) != ("p1", "charge")]
    if entry["action"] != "charge":  # keep p1 whole: only the entry under test is wrong
        world.do("p1", 1)
    world.effects.append({"kind": "do", "order_id": order, **entry})
    assert kinds(world) == ["unexpected_effect"]


def test_an_effect_of_a_step_never_reached_no_legal_run_makes_is_reported() -> None:
    world = World()
    world.submitted.append("w1")
    world.history("w1", "submitted", 0, None)
    world.history("w1", "claimed", 1, "create")
    error_at = world.history("w1", "refused", 1, "create", detail="no capacity")
    world.state("w1", "Error", 1, 0, Workflow="workspace")
    world.alert("w1", 1, error_at)
    assert kinds(world) == []
    configure = {"service": "cloud", "action": "configure", "idempotency_key": "w1:configure"}
    world.effects.append({"kind": "do", "order_id": "w1", **configure})
    assert kinds(world) == ["unexpected_effect"]


def test_an_order_from_before_incarnations_keeps_its_keys() -> None:
    world = World()
    world.processed("p1")
    world.entities[-1].pop("Incarnation")
    world.effects = [
        {**e, "idempotency_key": e["idempotency_key"].replace(f":{INCARNATION}:", ":")}
        for e in world.effects
    ]
    assert kinds(world) == []
    world.entities.pop()
    world.state("p1", "Processed", 3, 2)  # its state names an incarnation its keys lack
    assert kinds(world) == ["unexpected_effect"]


def processed_v2(world: World, order: str) -> None:
    """A version 2 order: hold, ship, charge, invoice, each completed at its first attempt."""
    world.submitted.append(order)
    world.history(order, "submitted", 0, None)
    world.history(order, "claimed", 1, "hold")
    for attempt, (name, *_rest) in enumerate(V2, start=1):
        world.history(order, "completed", attempt, name)
        world.do(order, attempt - 1, steps=V2)
    world.state(order, "Processed", 4, 3, Version=2)


def test_a_v2_order_is_judged_by_the_steps_of_its_version() -> None:
    world = clean()
    processed_v2(world, "v2")
    assert kinds(world) == []
    world.entities[-1].pop("Version")  # the same rows judged as version 1's
    assert set(kinds(world)) == {"illegal_transition", "unexpected_effect"}


def test_a_v2_order_with_a_step_of_version_1_is_reported() -> None:
    world = World()
    processed_v2(world, "v2")
    reserve = next(e for e in world.effects if e["action"] == "reserve")
    reserve["idempotency_key"] = f"v2:{INCARNATION}:reserve"  # v1's name for v2's hold
    assert kinds(world) == ["unexpected_effect"]
    world = World()
    processed_v2(world, "v2")
    world.effects = [e for e in world.effects if e["action"] != "invoice"]  # v1 has no invoice
    assert kinds(world) == ["processed_effect_missing"]


def waited_and_resumed(world: World, order: str) -> str:
    """A version 2 order: a Supervisor without v2 kept it waiting at hold (with the one alert
    for the missing version); one with v2 resumed it and recovered its expiry in the same
    transaction; a reply of another incarnation was dropped, and it finished."""
    key = f"order.2.{'f' * 16}"
    world.submitted.append(order)
    world.history(order, "submitted", 0, None)
    world.history(order, "claimed", 1, "hold")
    waited = world.history(order, "waiting", 1, "hold", detail="order v2 is not deployed")
    alert_id = f"definition-missing:{key}:{waited:%Y-%m-%d}"
    world.alerts.append(json.dumps({"alert_id": alert_id, "order_id": order}))
    world.history(order, "expired_retry", 1, "hold", detail="failure 1 of 3")
    world.history(order, "resumed", 1, "hold", detail="order v2 is deployed again")
    world.entities[-1][COMMITTED] = world.entities[-2][COMMITTED] - 0.000_02  # one transaction
    world.history(order, "claimed", 2, "hold")
    world.history(order, "reply_dropped", 7, "hold", detail="ok other_incarnation")
    world.history(order, "completed", 1, "hold")  # the first attempt's late ok still applies
    for attempt, (name, *_rest) in enumerate(V2[1:], start=3):
        world.history(order, "completed", attempt, name)
    for index in range(len(V2)):
        world.do(order, index, steps=V2)
    world.state(order, "Processed", 5, 3, Version=2, Definition="f" * 16)
    return alert_id


def test_an_order_that_waited_for_its_version_and_resumed_is_legal() -> None:
    world = clean()
    waited_and_resumed(world, "v2")
    verdict = check(world.evidence(), DESIGN)
    assert verdict.violations == []
    assert (verdict.recoveries["waiting"], verdict.recoveries["resumed"]) == (1, 1)
    assert verdict.missing_definition_alerts == 1


@pytest.mark.parametrize("how", ["resumed_unwaited", "expired_waiting", "alert_unwaited"])
def test_waiting_rows_and_alerts_no_deploy_explains_are_reported(how: str) -> None:
    world = World()
    world.processed("p1")
    if how == "alert_unwaited":  # a missing-definition alert for an order that never waited
        world.alerts.append(json.dumps({"alert_id": "definition-missing:order.1.-:2026-01-01",
                                        "order_id": "p1"}))  # fmt: skip
        assert kinds(world) == ["alert_without_error"]
        return
    world.begin("s1")
    if how == "expired_waiting":  # a failure counted for a deploy: it must resume instead
        world.history("s1", "waiting", 1, "reserve", detail="order v1 is not deployed")
        world.history("s1", "expired_retry", 1, "reserve", detail="failure 1 of 3")
    else:
        world.history("s1", "resumed", 1, "reserve")
    world.history("s1", "claimed", 2, "reserve")
    world.history("s1", "completed", 2, "reserve")
    world.history("s1", "completed", 3, "charge")
    world.history("s1", "completed", 4, "ship")
    for index in range(3):
        world.do("s1", index)
    world.state("s1", "Processed", 4, 2)
    assert kinds(world) == ["illegal_transition"]


def test_an_orphaned_effect_is_reported() -> None:
    """ship applied for an Error order that stopped undoing charge: ship never completed (no
    step row) and was never undone, so nothing accounts for it."""
    world = clean()
    world.do("e1", 2)
    assert kinds(world) == ["orphaned_effect"]
    world = clean()  # the same effect, recorded as completed: a step the undo skipped
    world.do("e1", 2)
    world.step_row("e1", "ship")
    assert kinds(world) == []


def test_the_effect_of_the_step_an_error_stopped_on_is_not_orphaned() -> None:
    world = World()
    workspace(world, "w1", expiries=4, end="expired_error")
    key = f"w1:{INCARNATION}:notify"  # an expired attempt sent the mail: the operator's call
    world.effects.append({"kind": "do", "service": "mailer", "action": "notify",
                          "idempotency_key": key, "order_id": "w1"})  # fmt: skip
    assert kinds(world) == []


def test_every_class_has_a_test_here() -> None:
    source = Path(__file__).read_text()
    tested = {
        "lost_order": "is_lost",
        "stuck_order": "is_stuck",
        "effect_applied_twice": "applied_twice",
        "compensation_incomplete": "effect_left_applied",
        "processed_effect_missing": "missing_an_effect",
        "error_alerts": "wrong_alerts",
        "alert_without_error": "never_was_in_error",
        "stale_reply_applied": "after_its_attempt_expired",
        "illegal_transition": "no_legal_transition",
        "failure_count_exceeded": "past_the_threshold",
        "poisoned_message": "poisoned_message_is_reported",
        "unexpected_effect": "no_legal_run_makes",
        "orphaned_effect": "orphaned_effect_is_reported",
    }
    assert set(tested) == set(KINDS)
    assert all(f"{fragment}" in source for fragment in tested.values())


def cancelled_while_charging(world: World, order: str) -> None:
    """Cancelled while charge ran: charge's ok recorded, then charge and reserve undone."""
    world.submitted.append(order)
    world.history(order, "submitted", 0, None)
    world.history(order, "claimed", 1, "reserve")
    world.history(order, "completed", 1, "reserve")
    world.history(order, "cancelled", 2, "charge", detail="customer asked")
    world.history(order, "completed", 2, "charge")
    world.history(order, "claimed", 3, "charge", "undo")
    world.history(order, "undone", 3, "charge", "undo")
    world.history(order, "undone", 4, "reserve", "undo")
    world.do(order, 0, undone=True)
    world.do(order, 1, undone=True)
    world.state(order, "Cancelled", 4, 0, "undo")


def suspended_then_resumed(world: World, order: str) -> None:
    """Suspended while reserve ran: charge waited unclaimed until the resume."""
    world.submitted.append(order)
    world.history(order, "submitted", 0, None)
    world.history(order, "claimed", 1, "reserve")
    world.history(order, "suspended", 1, "reserve")
    world.history(order, "completed", 1, "reserve")
    world.history(order, "unsuspended", 1, "charge")
    world.history(order, "claimed", 2, "charge")
    world.history(order, "completed", 2, "charge")
    world.history(order, "completed", 3, "ship")
    for index in range(3):
        world.do(order, index)
    world.state(order, "Processed", 3, 2)


def test_cancelled_suspended_and_terminated_orders_run_legally() -> None:
    world = clean()
    cancelled_while_charging(world, "x1")
    suspended_then_resumed(world, "s1")
    world.submitted.append("t1")
    world.history("t1", "submitted", 0, None)
    world.history("t1", "claimed", 1, "reserve")
    world.history("t1", "terminated", 1, "reserve", detail="settled by hand")
    world.history("t1", "reply_dropped", 1, "reserve")
    world.do("t1", 0)  # the running step's effect stays: terminate undoes nothing
    world.state("t1", "Terminated", 1, 0)
    assert check(world.evidence(), DESIGN).violations == []


def test_a_cancelled_order_with_an_effect_left_applied_is_reported() -> None:
    world = clean()
    cancelled_while_charging(world, "x1")
    world.do("x1", 2)  # ship applied: never undone
    assert "compensation_incomplete" in kinds(world)


def test_a_claim_while_suspended_or_a_step_forward_after_a_cancel_is_illegal() -> None:
    world = clean()
    world.begin("s1")
    world.history("s1", "suspended", 1, "reserve")
    world.history("s1", "completed", 1, "reserve")
    world.history("s1", "claimed", 2, "charge")  # nobody resumed it
    world.do("s1", 0)
    world.state("s1", "Processing", 2, 1)
    world.submitted.append("x1")
    world.history("x1", "submitted", 0, None)
    world.history("x1", "claimed", 1, "reserve")
    world.history("x1", "cancelled", 1, "reserve", detail="customer asked")
    world.history("x1", "completed", 1, "reserve")
    world.history("x1", "claimed", 2, "charge")  # forward after the cancel
    world.do("x1", 0)
    world.state("x1", "Processing", 2, 1)
    verdict = check(world.evidence(), DESIGN)
    assert sorted(
        {str(v.order_id) for v in verdict.violations if v.kind == "illegal_transition"}
    ) == [
        "s1",
        "x1",
    ]


def test_a_cancelled_order_keeps_the_effects_of_steps_declared_with_no_undo() -> None:
    """The workspace's create has no undo action (it needs none, as declared): cancelled while
    configure ran, the order ends Cancelled at once when configure answers, both left."""
    world = World()
    world.submitted.append("w1")
    world.history("w1", "submitted", 0, None)
    world.history("w1", "claimed", 1, "create")
    world.history("w1", "completed", 1, "create")
    world.history("w1", "cancelled", 2, "configure", detail="customer asked")
    world.history("w1", "completed", 2, "configure")
    world.state("w1", "Cancelled", 2, 1, Workflow="workspace")
    for action in ("create", "configure"):
        key = f"w1:{INCARNATION}:{action}"
        entry = {"kind": "do", "service": "cloud", "action": action, "idempotency_key": key}
        world.effects.append({**entry, "order_id": "w1"})
    assert kinds(world) == []


def skippable_notify() -> Design:
    """The checker's design with the workspace's notify declared as a step that may be
    skipped (``on_failure = "continue"``)."""
    flow = DESIGN.workflows[("workspace", 1)]
    steps = tuple(
        replace(s, on_failure="continue") if s.name == "notify" else s for s in flow.steps
    )
    return replace(
        DESIGN, workflows={**DESIGN.workflows, ("workspace", 1): replace(flow, steps=steps)}
    )


def skipped_workspace(world: World, order: str, end: str) -> None:
    """create and configure done, notify fails for good (``end``: refused or expired_skipped)
    and is skipped: the order ends Processed without notify's effect."""
    world.submitted.append(order)
    world.history(order, "submitted", 0, None)
    world.history(order, "claimed", 1, "create")
    world.history(order, "completed", 1, "create")
    world.history(order, "completed", 2, "configure")
    attempt = 3
    if end == "expired_skipped":
        for failure in range(1, 5):
            world.history(
                order, "expired_retry", attempt, "notify", detail=f"failure {failure} of 5"
            )
            attempt += 1
            world.history(order, "claimed", attempt, "notify")
        world.history(order, end, attempt, "notify", detail="failure 5 of 5")
    else:
        world.history(order, end, attempt, "notify", detail="mailbox full")
    world.state(order, "Processed", attempt, 2, Workflow="workspace")
    for action in ("create", "configure"):
        key = f"{order}:{INCARNATION}:{action}"
        entry = {"kind": "do", "service": "cloud", "action": action, "idempotency_key": key}
        world.effects.append({**entry, "order_id": order})


def test_a_step_that_may_be_skipped_is_judged_skipped_on_refusal_or_expiry() -> None:
    world = World()
    skipped_workspace(world, "w1", "refused")
    skipped_workspace(world, "w2", "expired_skipped")
    verdict = check(world.evidence(), skippable_notify())
    assert verdict.violations == []
    assert (verdict.recoveries["refused_skipped"], verdict.recoveries["expired_skipped"]) == (1, 1)
    # Under the workflow's own policy (error) the same histories are illegal.
    assert "illegal_transition" in kinds(world)


def test_a_skip_of_a_step_whose_policy_is_not_continue_is_reported() -> None:
    world = World()
    workspace(world, "w1", expiries=4, end="expired_skipped")
    assert "illegal_transition" in kinds(world)


def test_an_input_builder_failure_is_an_error_instead_of_the_claim() -> None:
    world = World()
    world.begin("b1")
    world.history("b1", "completed", 1, "reserve")
    error_at = world.history("b1", "input_failed", 2, "charge", detail="charge: KeyError")
    world.do("b1", 0)
    world.state("b1", "Error", 2, 1)
    world.alert("b1", 2, error_at)
    assert kinds(world) == []
    world = World()
    world.begin("b2")
    world.history("b2", "input_failed", 1, "reserve", detail="reserve: KeyError")
    world.state("b2", "Error", 1, 0)
    assert "illegal_transition" in kinds(world)  # the step was claimed already

"""Random interleavings of deliveries, drops, duplicates, sweeps, refusals of steps that may be
skipped, an input builder broken and fixed, and operator steering, on workflows with per-step
failure policies; each run's end is judged by the chaos checker and by what its submitter was
told. Seeds that break a guarantee are reported."""

from __future__ import annotations

import os
import random

import pytest

from sas.domain.errors import IllegalTransition, InvalidMessage
from sas.domain.messages import StatusEvent
from sas.domain.model import ProcessState
from sas.testing import Outcome, fault, ok, refuse, too_slow
from tests.harness import BUDGET, World
from tests.unit.test_hostile_steering_fuzz import ConsistentRemote
from tests.unit.test_hostile_step_policy import REGISTRY, SHIP_BUILDER, judged, submit

pytestmark = [pytest.mark.unit]

QUEUES = ["orders", "scheduler", "agent-inventory", "agent-payment", "agent-shipping", "replies"]
ACTIONS = {
    ("inventory", "reserve"), ("inventory", "release"), ("payment", "note"),
    ("payment", "write"), ("shipping", "tell"), ("shipping", "ship"), ("shipping", "cancel"),
}  # fmt: skip
SKIPPABLE = {"note", "tell"}
SEEDS = int(os.environ.get("HOSTILE_SEEDS", "40"))


def _outcomes(rng: random.Random, action: str) -> list[Outcome]:
    refusable = action in SKIPPABLE | {"reserve", "write", "ship"}
    found = []
    for _ in range(rng.randint(0, 3)):
        pick = rng.random()
        if pick < 0.4:
            found.append(ok())
        elif pick < 0.55:
            found.append(fault("HTTP 503"))
        elif refusable and pick < (0.9 if action in SKIPPABLE else 0.8):
            found.append(refuse("HTTP 422"))
        else:
            found.append(too_slow(BUDGET * 2))
    return found


def _steer(w: World, oid: str, verb: str) -> bool:
    """The operator's ``verb``; whether it was taken (a refused one changes nothing)."""
    try:
        if verb == "cancel":
            w.operator.cancel(oid, actor="dana", reason="r")
        elif verb == "suspend":
            w.operator.suspend(oid, actor="dana")
        elif verb == "resume":
            w.operator.resume(oid, actor="dana")
        else:
            w.operator.resubmit(oid, actor="dana")
    except (IllegalTransition, InvalidMessage):
        return False
    return True


def _move(w: World, oid: str, rng: random.Random, log: list[str]) -> bool:
    """One random move; whether it was a cancel the order took."""
    pick = rng.random()
    if pick < 0.45:
        queue, twice = rng.choice(QUEUES), rng.random() < 0.15
        log.append(f"deliver {queue}{' twice' if twice else ''}")
        w.deliver(queue, twice=twice)
    elif pick < 0.52:
        queue = rng.choice(QUEUES[1:])
        log.append(f"drop {queue}")
        w.drop(queue)
    elif pick < 0.68:
        seconds = rng.choice([0, 1, 3, BUDGET + 3, 60, 600, 3600])
        log.append(f"tick {seconds}")
        w.tick(seconds)
    elif pick < 0.72:
        SHIP_BUILDER.fixed = not SHIP_BUILDER.fixed
        log.append(f"ship's builder fixed={SHIP_BUILDER.fixed}")
    elif w.store.get_state(oid) is not None:
        verb = rng.choice(["cancel", "suspend", "suspend", "resume", "resume", "resubmit"])
        taken = _steer(w, oid, verb)
        log.append(verb if taken else f"{verb} (refused)")
        return taken and verb == "cancel"
    return False


def _skips(w: World, oid: str) -> int:
    """Steps the order skipped: expiries that skipped, and refusals of a step that may be
    skipped before any cancel (after it, a refusal undoes)."""
    count, cancelled = 0, False
    for entry in w.store.get_history(oid):
        cancelled = cancelled or entry.kind == "cancelled"
        skippable = entry.kind == "refused" and entry.step in SKIPPABLE and entry.mode == "do"
        count += entry.kind == "expired_skipped" or (skippable and not cancelled)
    return count


def run_seed(seed: int, workflow: str, max_failures: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    w = World(workflows=REGISTRY, max_failures=max_failures, remote=ConsistentRemote)
    for agent, action in sorted(ACTIONS):
        w.remote.script(agent, action, *_outcomes(rng, action))
    SHIP_BUILDER.fixed = rng.random() < 0.5
    oid = submit(w, workflow)
    log: list[str] = []
    cancelled = False
    for _ in range(rng.randint(5, 40)):
        cancelled = _move(w, oid, rng, log) or cancelled
    if w.store.get_state(oid) is None:
        return [], log
    if w.state(oid).suspended:
        _steer(w, oid, "resume")
    for _ in range(40):
        w.run()
        w.tick(60)
    w.run()
    problems = judged(w, oid)
    end = w.state(oid).process_state
    if cancelled and end in (ProcessState.PROCESSED, ProcessState.COMPENSATED):
        problems.append(f"cancelled, but ended {end}")
    told = [m for m in w.bus.to("status-q") if isinstance(m, StatusEvent) and m.order_id == oid]
    skipped = sum(1 for m in told if m.status == "step_skipped")
    if skipped != _skips(w, oid):
        problems.append(f"told of {skipped} skips, skipped {_skips(w, oid)}")
    return problems, log


@pytest.mark.parametrize(
    ("workflow", "max_failures"),
    [("skippy", 1), ("tail", 1), ("strict_mid", 2), ("after_skip_broken", 1), ("two_skips", 2)],
)
def test_random_interleavings_keep_the_step_policy_guarantees(
    workflow: str, max_failures: int
) -> None:
    failures = {}
    for seed in range(SEEDS):
        problems, log = run_seed(seed, workflow, max_failures)
        if problems:
            failures[seed] = (problems, log)
    if failures:
        shortest = sorted(failures.items(), key=lambda kv: len(kv[1][1]))[:3]
        lines = [f"{len(failures)} of {SEEDS} seeds broke a guarantee"]
        lines += [f"seed {seed}: {problems}\n   moves: {log}" for seed, (problems, log) in shortest]
        pytest.fail("\n".join(lines))

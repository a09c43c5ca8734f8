"""Random interleavings of deliveries, drops, duplicate deliveries, Supervisor sweeps (with large
time jumps), scripted remote outcomes and operator steering, checked against the steering
guarantees after every move and at the end. Seeds that break a guarantee are reported."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pytest

from sas.domain.errors import IllegalTransition, InvalidMessage, PermanentRemoteError
from sas.domain.messages import StepRequest
from sas.domain.model import ProcessState
from sas.testing import InMemoryRemote, fault, ok, refuse, too_slow
from tests.harness import BUDGET, World
from tests.unit.test_failure_modes import order

pytestmark = [pytest.mark.unit]

QUEUES = ["orders", "scheduler", "agent-inventory", "agent-payment", "agent-shipping", "replies"]
ACTIONS = {
    ("inventory", "reserve"), ("inventory", "release"), ("payment", "charge"),
    ("payment", "refund"), ("shipping", "ship"), ("shipping", "cancel"),
}  # fmt: skip
SEEDS = int(os.environ.get("HOSTILE_SEEDS", "150"))


class ConsistentRemote(InMemoryRemote):
    """A provider that never contradicts itself under one key: once applied, every call gets
    the result; once refused, every call is refused (so duplicate deliveries of one attempt
    cannot produce an effect the order was told was refused)."""

    def _answer(self, agent, action, key, data, otherwise, **how):
        if (agent, action, key) in self.effects:
            return dict(self.effects[(agent, action, key)].result)
        refused = self.__dict__.setdefault("_refused", set())
        if (agent, action, key) in refused:
            raise PermanentRemoteError("HTTP 422 (again)")
        try:
            return super()._answer(agent, action, key, data, otherwise, **how)
        except PermanentRemoteError:
            refused.add((agent, action, key))
            raise


@dataclass
class Track:
    cancelled_at_attempt: int | None = None
    suspended: bool = False
    log: list[str] = field(default_factory=list)


def _script(world: World, rng: random.Random) -> None:
    for agent, action in sorted(ACTIONS):
        outcomes = []
        for _ in range(rng.randint(0, 3)):
            pick = rng.random()
            if pick < 0.45:
                outcomes.append(ok())
            elif pick < 0.65:
                outcomes.append(fault("HTTP 503"))
            elif pick < 0.85 and action in ("reserve", "charge", "ship"):
                outcomes.append(refuse("HTTP 422"))
            else:
                outcomes.append(too_slow(BUDGET * 2))
        world.remote.script(agent, action, *outcomes)


def _check_move(world: World, oid: str, before, after, kinds_before: int, t: Track) -> list[str]:
    problems = []
    new_kinds = world.history(oid)[kinds_before:]
    if before.suspended and after.suspended:
        if after.attempt != before.attempt:
            problems.append(f"suspended order claimed: attempt {before.attempt}->{after.attempt}")
        allowed = {"expired_held"} | ({"expired_compensate"} if before.cancelled else set())
        bad = [k for k in new_kinds if k.startswith("expired_") and k not in allowed]
        if bad:
            problems.append(f"suspended order expired: {bad}")
        if after.failure_count > before.failure_count:
            problems.append("failure counted while suspended")
    if before.cancelled is not None:
        claimed_do = after.attempt > before.attempt and after.mode == "do"
        if claimed_do:
            problems.append(f"cancelled order claimed a forward step at attempt {after.attempt}")
    return problems


def _forward_requests_after(world: World, oid: str, attempt: int) -> list[StepRequest]:
    return [
        s.message
        for s in world.bus.sent
        if isinstance(s.message, StepRequest)
        and s.message.order_id == oid
        and s.message.mode == "do"
        and s.message.attempt > attempt
    ]


def _final_checks(world: World, oid: str, t: Track) -> list[str]:
    problems = []
    state = world.state(oid)
    effects = [e for e in world.remote.effects.values() if e.order_id == oid]
    forward = {(e.agent, e.action, k[2]): e for k, e in world.remote.effects.items()
               if e.order_id == oid and e.undoes is None}  # fmt: skip
    undos = [e for e in effects if e.undoes is not None]
    if t.cancelled_at_attempt is not None:
        extra = _forward_requests_after(world, oid, t.cancelled_at_attempt)
        if extra:
            problems.append(
                f"forward requests after the cancel: {[(r.step, r.attempt) for r in extra]}"
            )
    if state.process_state in (ProcessState.CANCELLED, ProcessState.COMPENSATED):
        for key, e in forward.items():
            if e.undone_by is None:
                problems.append(
                    f"{state.process_state}: {e.agent}/{e.action} applied, never undone"
                )
            n = sum(1 for u in undos if u.undoes == key)
            if n > 1:
                problems.append(f"{e.agent}/{e.action} undone {n} times")
    steps = 2 if state.workflow == "strict" else 3
    if state.process_state is ProcessState.PROCESSED and (
        len(forward) != steps or any(e.undone_by for e in forward.values())
    ):
        problems.append(
            f"Processed with effects {[(e.action, e.undone_by) for e in forward.values()]}"
        )
    if state.process_state is ProcessState.CANCELLED and t.cancelled_at_attempt is None:
        problems.append("Cancelled without a cancel")
    if t.cancelled_at_attempt is not None and state.process_state in (
        ProcessState.PROCESSED, ProcessState.COMPENSATED,
    ):  # fmt: skip
        problems.append(f"cancel written but order ended {state.process_state}")
    if not state.is_terminal:
        problems.append(
            f"not settled: {state.process_state} {state.mode} {state.step} susp={state.suspended}"
        )
    if state.process_state is ProcessState.ERROR:
        alerts = [a for a in world.alerts() if getattr(a, "order_id", None) == oid]
        if not alerts:
            problems.append("Error without an alert")
    return problems


def run_seed(
    seed: int, *, workflow: str = "order", max_failures: int = 3
) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    world = World(max_failures=max_failures, remote=lambda clock: ConsistentRemote(clock))
    _script(world, rng)
    oid = order(world, workflow=workflow)
    t = Track()
    problems: list[str] = []
    for _ in range(rng.randint(5, 40)):
        before = world.state(oid) if world.store.get_state(oid) else None
        kinds_before = len(world.history(oid)) if before else 0
        move = rng.random()
        if move < 0.45:
            q = rng.choice(QUEUES)
            twice = rng.random() < 0.15
            t.log.append(f"deliver {q}{' twice' if twice else ''}")
            world.deliver(q, twice=twice)
        elif move < 0.52:
            q = rng.choice(
                ["replies", "agent-payment", "agent-inventory", "agent-shipping", "scheduler"]
            )
            t.log.append(f"drop {q}")
            world.drop(q)
        elif move < 0.68:
            secs = rng.choice([0, 1, 3, BUDGET + 3, 60, 600, 3600])
            t.log.append(f"tick {secs}")
            world.tick(secs)
        elif move < 0.72:
            secs = rng.choice([1, 5, 30])
            t.log.append(f"advance {secs}")
            world.clock.advance(secs)
        else:
            verb = rng.choice(["cancel", "cancel", "suspend", "suspend", "resume", "resume",
                               "terminate", "resubmit"])  # fmt: skip
            t.log.append(verb)
            try:
                if verb == "cancel":
                    world.operator.cancel(oid, actor="dana", reason="r")
                    if t.cancelled_at_attempt is None:
                        t.cancelled_at_attempt = before.attempt if before else 0
                elif verb == "suspend":
                    world.operator.suspend(oid, actor="dana")
                elif verb == "resume":
                    world.operator.resume(oid, actor="dana")
                elif verb == "terminate":
                    if rng.random() < 0.3:
                        world.operator.terminate(oid, actor="dana", reason="r")
                else:
                    world.operator.resubmit(oid, actor="dana")
            except (IllegalTransition, InvalidMessage) as exc:
                t.log[-1] += f" (refused: {exc})"
        if before is None or world.store.get_state(oid) is None:
            continue
        after = world.state(oid)
        for p in _check_move(world, oid, before, after, kinds_before, t):
            problems.append(f"after '{t.log[-1]}': {p}")
    # settle: resume a suspension, then let time and sweeps pass
    if world.store.get_state(oid) is not None and world.state(oid).suspended:
        try:
            world.operator.resume(oid, actor="dana")
            t.log.append("final resume")
        except IllegalTransition:
            pass
    for _ in range(40):
        world.run()
        world.tick(60)
    world.run()
    problems += _final_checks(world, oid, t)
    return problems, t.log


@pytest.mark.parametrize("workflow,max_failures", [("order", 3), ("order", 1), ("strict", 2)])
def test_random_interleavings_keep_the_steering_guarantees(workflow, max_failures):
    failures = {}
    for seed in range(SEEDS):
        problems, log = run_seed(seed, workflow=workflow, max_failures=max_failures)
        if problems:
            failures[seed] = (problems, log)
    if failures:
        first = sorted(failures.items(), key=lambda kv: len(kv[1][1]))[:5]
        lines = [f"{len(failures)} of {SEEDS} seeds broke a guarantee"]
        for seed, (problems, log) in first:
            lines.append(f"seed {seed}: {problems}\n   moves: {log}")
        summary: dict[str, int] = {}
        for problems, _ in failures.values():
            for p in problems:
                key = p.split(":")[0] if "after" not in p else p.split(": ", 1)[1][:50]
                summary[key] = summary.get(key, 0) + 1
        lines.append(f"by kind: {summary}")
        pytest.fail("\n".join(lines))

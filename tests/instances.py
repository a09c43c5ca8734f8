"""An instance of the app in a test: one context (its store, transport, clock, instance id) and
the handlers called on it, so a test can run several instances side by side by name."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from sas.domain.clock import Clock
from sas.domain.messages import OrderSubmitted, ScheduleRequest, StepReply, StepRequest
from sas.domain.workflow import Registry, Workflow
from sas.services import agent, scheduler, submission, supervisor
from sas.services.agent import AgentOutcome
from sas.services.context import Agents, Context, Routes
from sas.services.ports import StateStore, Transport
from sas.services.scheduler import ReplyOutcome, ScheduleOutcome
from sas.services.submission import SubmissionOutcome
from workflows.order import ORDER_WORKFLOW

WORKFLOWS: dict[str, Workflow] = {ORDER_WORKFLOW.name: ORDER_WORKFLOW}
"""What the tests' instances run: the order, and whatever a test adds (monkeypatch.setitem)."""


class TestWorkflows(Registry):
    """A registry of ``WORKFLOWS`` as they are at each use."""

    def __init__(self) -> None:
        super().__init__(workflows=(ORDER_WORKFLOW,))

    def _now(self) -> Registry:
        return Registry(workflows=tuple(WORKFLOWS.values()))

    def named(self, name: str) -> Workflow:
        return self._now().named(name)

    def __contains__(self, name: object) -> bool:
        return name in self._now()

    @property
    def agents(self) -> tuple[str, ...]:
        return self._now().agents

    @property
    def longest_step_budget(self) -> timedelta:
        return self._now().longest_step_budget

    @property
    def shortest_budget(self) -> timedelta:
        return self._now().shortest_budget


TEST_WORKFLOWS = TestWorkflows()


@dataclass(frozen=True)
class Instance:
    ctx: Context

    def submit(self, message: OrderSubmitted) -> SubmissionOutcome:
        return submission.submit(self.ctx, message)

    def schedule(self, request: ScheduleRequest) -> ScheduleOutcome:
        return scheduler.schedule(self.ctx, request)

    def on_reply(self, reply: StepReply) -> ReplyOutcome:
        return scheduler.on_reply(self.ctx, reply)

    def sweep(self, *, parallelism: int = 1) -> Counter[str]:
        return supervisor.sweep(self.ctx, parallelism=parallelism)

    def run_step(self, name: str, request: StepRequest) -> AgentOutcome:
        return agent.run_step(self.ctx, name, request)

    def named(self, instance_id: str, **changes: Any) -> Instance:
        """Another instance beside this one (the same store and transport)."""
        return Instance(replace(self.ctx, instance_id=instance_id, **changes))


def instance(
    store: StateStore,
    transport: Transport,
    routes: Routes,
    clock: Clock,
    instance_id: str = "instance-1",
    **context: Any,
) -> Instance:
    context.setdefault("workflows", TEST_WORKFLOWS)
    return Instance(Context(store, transport, clock, routes, instance_id, **context))


@dataclass(frozen=True)
class AgentOf:
    """One agent of an instance, as its queue function calls it."""

    name: str
    instance: Instance

    def handle(self, request: StepRequest) -> AgentOutcome:
        return self.instance.run_step(self.name, request)


def agents_of(inst: Instance, remote: Any, **options: Any) -> Instance:
    """``inst`` able to run agents calling ``remote`` (``options``: ``Agents``' fields)."""
    return inst.named(inst.ctx.instance_id, agents=Agents(remote=remote, **options))


def agent_runner(
    name: str,
    remote: Any,
    transport: Transport,
    routes: Routes,
    clock: Clock,
    *,
    breaker: Any = None,
    **options: Any,
) -> AgentOf:
    """The agent ``name`` of an instance that runs nothing else (agents keep no state in the
    store: ``options`` are ``Agents``' fields; ``breaker``: one breaker for every target)."""
    from tests.fakes import InMemoryStore

    if breaker is not None:
        options["breaker"] = lambda target: breaker
    inst = instance(InMemoryStore(), transport, routes, clock, f"agent-{name}")
    return AgentOf(name, agents_of(inst, remote, **options))

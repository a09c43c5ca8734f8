"""One instance of the app in a test: a context (store, transport, clock, routes, instance id)
and the handlers its functions call, so a test can run several instances side by side."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from sas.domain.clock import Clock
from sas.domain.messages import Message, OrderSubmitted, ScheduleRequest, StepReply, StepRequest
from sas.domain.workflow import Registry
from sas.services import agent, scheduler, submission, supervisor
from sas.services.context import Agents, Context, Routes
from sas.services.ports import BudgetStore, RemoteService, StateStore, Transport


@dataclass(frozen=True)
class Instance:
    ctx: Context

    def submit(self, message: OrderSubmitted) -> submission.SubmissionOutcome:
        return submission.submit(self.ctx, message)

    def schedule(self, request: ScheduleRequest) -> scheduler.ScheduleOutcome:
        return scheduler.schedule(self.ctx, request)

    def on_reply(self, reply: StepReply) -> scheduler.ReplyOutcome:
        return scheduler.on_reply(self.ctx, reply)

    def sweep(self, *, parallelism: int = 1, budgets: BudgetStore | None = None) -> Counter[str]:
        return supervisor.sweep(self.ctx, parallelism=parallelism, budgets=budgets)

    def run_step(self, name: str, request: StepRequest) -> agent.AgentOutcome:
        return agent.run_step(self.ctx, name, request)

    def consume(self, queue: str, message: Message) -> Any:
        """What the function triggered by ``queue`` does with ``message``."""
        if isinstance(message, OrderSubmitted):
            return self.submit(message)
        if isinstance(message, ScheduleRequest):
            return self.schedule(message)
        if isinstance(message, StepReply):
            return self.on_reply(message)
        if isinstance(message, StepRequest):
            routes = self.ctx.routes
            name = next(a for a, q in routes.agents.items() if queue in routes.all_lanes(q))
            return self.run_step(name, message)
        raise ValueError(f"no function consumes {type(message).__name__} on {queue}")

    def named(self, instance_id: str, **changes: Any) -> Instance:
        """Another instance beside this one (the same store and transport unless changed)."""
        return Instance(replace(self.ctx, instance_id=instance_id, **changes))

    def with_remote(self, remote: RemoteService, **agents: Any) -> Instance:
        """This instance with agents calling ``remote`` (``agents``: ``Agents``' fields)."""
        return self.named(self.ctx.instance_id, agents=Agents(remote=remote, **agents))


def instance(
    store: StateStore,
    transport: Transport,
    routes: Routes,
    clock: Clock,
    workflows: Registry,
    instance_id: str = "instance-1",
    **context: Any,
) -> Instance:
    """An instance running ``workflows`` (``context``: the rest of ``Context``'s fields)."""
    return Instance(Context(store, transport, clock, routes, instance_id, workflows, **context))

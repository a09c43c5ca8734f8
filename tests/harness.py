"""A deterministic little world for failure-mode tests: the real Table store on Azurite, a
fake clock, queues played by hand, and a remote service with an idempotency ledger.

Messages are delivered only when a test says so, so every interleaving the pattern must
survive (crash here, duplicate there, reply late) can be written down step by step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from azure.data.tables import TableClient

from sas.adapters.table_store import TableStateStore
from sas.domain.errors import NotFound, PermanentRemoteError, TransientRemoteError
from sas.domain.messages import Message, OrderSubmitted, ScheduleRequest, StepReply, StepRequest
from sas.domain.model import OrderState
from sas.domain.priority import Waiting
from sas.domain.recovery import RetryPolicy
from sas.domain.wire import live_table_name
from sas.services.context import Agents, Routes
from sas.services.operator import Operator
from sas.services.routing import Router
from tests.fakes import FakeClock
from tests.instances import AgentOf, Instance, instance
from workflows.order import ORDER_WORKFLOW

BUDGET = ORDER_WORKFLOW.steps[0].budget.total_seconds()
"""A step's complete-by budget in the order workflow, in seconds."""

ROUTES = Routes(
    "orders",
    "scheduler",
    "replies",
    "alerts",
    {"inventory": "agent-inventory", "payment": "agent-payment", "shipping": "agent-shipping"},
)


@dataclass
class Envelope:
    message: Message
    message_id: str
    due: datetime


class Bus:
    """The Transport port over in-memory queues with delayed delivery."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.queues: dict[str, list[Envelope]] = defaultdict(list)
        self.sent: list[tuple[str, Envelope]] = []
        self.fail_next_send_to: set[str] = set()

    def send(
        self,
        queue: str,
        message: Message,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        if queue in self.fail_next_send_to:
            self.fail_next_send_to.discard(queue)
            raise ConnectionError(f"crash before sending to {queue}")
        envelope = Envelope(
            message, message_id, self.clock.now() + timedelta(seconds=delay_seconds)
        )
        self.queues[queue].append(envelope)
        self.sent.append((queue, envelope))

    def waiting(self, queue: str) -> Waiting:
        """As a peek sees it: the visible (due) messages only."""
        now = self.clock.now()
        due = [e.due for e in self.queues[queue] if e.due <= now]
        return Waiting(min(due) if due else None, min(len(due), Waiting.PEEK))

    def take(self, queue: str) -> list[Message]:
        """Remove and return the messages of ``queue`` that are due."""
        now = self.clock.now()
        due = [e for e in self.queues[queue] if e.due <= now]
        self.queues[queue] = [e for e in self.queues[queue] if e.due > now]
        return [e.message for e in due]

    def all_sent(self, queue: str) -> list[Message]:
        return [e.message for q, e in self.sent if q == queue]


@dataclass
class LedgerRemote:
    """A remote provider: effects at most once per key, undo by original key, scripted faults.

    ``script[(agent, action)]`` is consumed call by call: "ok", "slow" (apply, then take
    ``slow_seconds`` so the deadline passes), or an exception instance to raise.
    """

    clock: FakeClock
    script: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    slow_seconds: float = 60
    effects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    undo_order: list[tuple[str, str]] = field(default_factory=list)

    def perform(
        self,
        agent: str,
        action: str,
        *,
        idempotency_key: str,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        self.calls.append((agent, action, idempotency_key))
        behaviour = self.script.get((agent, action), [])
        outcome = behaviour.pop(0) if behaviour else "ok"
        if isinstance(outcome, BaseException):
            raise outcome
        result = self._apply(agent, action, idempotency_key, payload)
        if outcome == "slow":
            self.clock.advance(self.slow_seconds)
        return result

    def _apply(self, agent: str, action: str, key: str, payload: dict[str, Any]) -> dict[str, Any]:
        if "original_key" in payload:
            original = self.effects.get(
                (agent, payload["original_action"], payload["original_key"])
            )
            if original is not None and "undone_by" not in original:
                original["undone_by"] = key
                self.undo_order.append((agent, payload["original_action"]))
            return {"undone": original is not None}
        effect = self.effects.setdefault(
            (agent, action, key), {"order_id": payload["order_id"], "effect": len(self.effects) + 1}
        )
        return {"effect": effect["effect"]}

    def applied(self, order_id: str) -> dict[tuple[str, str], bool]:
        """(agent, action) -> undone?, for the order's applied effects."""
        return {
            (agent, action): "undone_by" in effect
            for (agent, action, _), effect in self.effects.items()
            if effect["order_id"] == order_id
        }


def live_table_of(table: TableClient) -> TableClient:
    """The in-flight table beside ``table`` (the ``table`` fixture creates both)."""
    return TableClient(
        endpoint=table.url,
        table_name=live_table_name(table.table_name),
        credential=table.credential,
    )


def store_on(table: TableClient) -> TableStateStore:
    return TableStateStore(table, live_table_of(table))


class World:
    def __init__(
        self,
        table: Any,
        *,
        max_failures: int = 3,
        routes: Routes = ROUTES,
        router: Callable[[FakeClock], Router] | None = None,
        remote: Any = None,
    ) -> None:
        self.clock = FakeClock()
        self.routes = routes
        self.router = router(self.clock) if router is not None else None
        self.bus = Bus(self.clock)
        self.store = store_on(table)
        self.remote = remote(self.clock) if remote is not None else LedgerRemote(self.clock)
        self.policy = RetryPolicy(max_failures=max_failures, base_backoff=timedelta(seconds=2))
        agents = Agents(remote=self.remote, router=self.router, sleep=self.clock.sleep)
        self.app = instance(
            self.store, self.bus, routes, self.clock, "scheduler-1", policy=self.policy,
            agents=agents,
        )  # fmt: skip
        self.submission = self.app
        self.scheduler = self.app
        self.supervisor = self.new_supervisor("supervisor-1")
        self.operator = Operator(self.app.ctx)
        self.agents = {name: AgentOf(name, self.app) for name in routes.agents}

    def new_scheduler(self, instance_id: str) -> Instance:
        return self.app.named(instance_id)

    def new_supervisor(self, instance_id: str, store: Any = None) -> Instance:
        return self.app.named(instance_id, store=store or self.store)

    # --- driving -------------------------------------------------------------------------

    def submit(self, order: OrderSubmitted) -> None:
        self.submission.submit(order)

    def deliver(self, queue: str, *, twice: bool = False) -> list[Any]:
        """Hand every due message of ``queue`` to its consumer (twice: duplicate delivery)."""
        outcomes = []
        for message in self.bus.take(queue):
            for _ in range(2 if twice else 1):
                outcomes.append(self._consume(queue, message))
        return outcomes

    def _consume(self, queue: str, message: Message) -> Any:
        self.clock.advance(0.001)  # time passes between deliveries, as it does
        if isinstance(message, OrderSubmitted):
            return self.submission.submit(message)
        if isinstance(message, ScheduleRequest):
            return self.scheduler.schedule(message)
        if isinstance(message, StepReply):
            return self.scheduler.on_reply(message)
        if isinstance(message, StepRequest):
            agent = next(
                name for name, q in self.routes.agents.items() if queue in self.routes.all_lanes(q)
            )
            return self.agents[agent].handle(message)
        raise AssertionError(f"nobody consumes {type(message).__name__} on {queue}")

    def drop(self, queue: str) -> list[Message]:
        """The consumer crashed: the messages are gone (their lease would expire later)."""
        return self.bus.take(queue)

    def run(self, *, twice: bool = False, rounds: int = 50) -> None:
        """Deliver everything due, in pipeline order, until nothing is due."""
        bases = [
            self.routes.orders,
            self.routes.scheduler,
            *self.routes.agents.values(),
            self.routes.replies,
        ]
        order = [lane for base in bases for lane in self.routes.all_lanes(base)]
        for _ in range(rounds):
            delivered = sum(len(self.deliver(q, twice=twice)) for q in order)
            if not delivered:
                return
        raise AssertionError("the world did not settle")

    def make_due(self, order_id: str) -> None:
        """Mark the order's in-flight marker due now, as time would (a sweep lists only due
        markers): for tests that sweep at a moment of their choosing."""
        self.store.touch_live(order_id, self.clock.now(), self.clock.now())

    def tick(self, advance_seconds: float = 0) -> Any:
        self.clock.advance(advance_seconds)
        return self.supervisor.sweep()

    def settle_with_supervision(self, *, ticks: int = 20, step_seconds: float = 20) -> None:
        """Alternate supervisor ticks and deliveries until the order stops moving."""
        for _ in range(ticks):
            self.run()
            self.tick(step_seconds)
        self.run()

    # --- looking -------------------------------------------------------------------------

    def state(self, order_id: str) -> OrderState:
        found = self.store.get_state(order_id)
        assert found is not None
        return found.value

    def alerts(self) -> list[Message]:
        return self.bus.all_sent(self.routes.alerts)

    def history(self, order_id: str) -> list[str]:
        return [entry.kind for entry in self.store.get_history(order_id)]


def transient(reason: str = "HTTP 503") -> TransientRemoteError:
    return TransientRemoteError(reason)


def permanent(reason: str = "HTTP 422 refused") -> PermanentRemoteError:
    return PermanentRemoteError(reason)


__all__ = ["ROUTES", "Bus", "LedgerRemote", "NotFound", "World", "permanent", "transient"]

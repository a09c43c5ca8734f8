"""A deterministic little world for failure-mode tests: a store (in memory, or the real Table
store on Azurite where the store's behaviour is under test), a fake clock, queues played by
hand, and remote services that apply each effect once per idempotency key (sas.testing's).

Messages are delivered only when a test says so, so every interleaving the pattern must
survive (crash here, duplicate there, reply late) can be written down step by step.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from azure.data.tables import TableClient

from sas.adapters.table_store import TableStateStore
from sas.domain.messages import Message, OrderSubmitted
from sas.domain.model import OrderState
from sas.domain.recovery import RetryPolicy
from sas.domain.wire import live_table_name
from sas.domain.workflow import START_SLACK, Registry
from sas.services.context import Agents, Routes
from sas.services.operator import Operator
from sas.services.ports import StateStore
from sas.services.routing import Router
from sas.testing import FakeClock, InMemoryQueues, InMemoryRemote, InMemoryStore, Instance, instance
from tests.workflows import BUDGET as STEP_BUDGET
from tests.workflows import REGISTRY

BUDGET = STEP_BUDGET.total_seconds()
"""A step's complete-by budget in the tests' workflows, in seconds."""
CLAIMED = BUDGET + START_SLACK.total_seconds()
"""A claimed step's deadline, in seconds from its claim: its budget and the slack within which
an agent starts it unrecorded."""

ROUTES = Routes(
    "orders",
    "scheduler",
    "replies",
    "alerts",
    {"inventory": "agent-inventory", "payment": "agent-payment", "shipping": "agent-shipping"},
)


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
    """``table``: the Azurite table to keep orders in (None: the in-memory store)."""

    def __init__(
        self,
        table: TableClient | None = None,
        *,
        max_failures: int = 3,
        routes: Routes = ROUTES,
        router: Callable[[FakeClock], Router] | None = None,
        remote: Callable[[FakeClock], Any] | None = None,
        workflows: Registry = REGISTRY,
    ) -> None:
        self.clock = FakeClock()
        self.routes = routes
        self.router = router(self.clock) if router is not None else None
        self.bus = InMemoryQueues(self.clock)
        self.store: StateStore = InMemoryStore() if table is None else store_on(table)
        self.remote = remote(self.clock) if remote is not None else InMemoryRemote(self.clock)
        self.policy = RetryPolicy(max_failures=max_failures, base_backoff=timedelta(seconds=2))
        agents = Agents(remote=self.remote, router=self.router, sleep=self.clock.sleep)
        self.app = instance(
            self.store, self.bus, routes, self.clock, workflows, "scheduler-1",
            policy=self.policy, agents=agents,
        )  # fmt: skip
        """Every function that consumes a queue, as ``deliver`` and ``run`` call it (replace
        it to restart the app); sweeps run on ``supervisor``."""
        self.supervisor = self.new_supervisor("supervisor-1")
        self.operator = Operator(self.app.ctx)

    def new_scheduler(self, instance_id: str) -> Instance:
        return self.app.named(instance_id)

    def new_supervisor(self, instance_id: str, store: Any = None) -> Instance:
        return self.app.named(instance_id, store=store or self.store)

    # --- driving -------------------------------------------------------------------------

    def submit(self, order: OrderSubmitted) -> None:
        self.app.submit(order)

    def deliver(self, queue: str, *, twice: bool = False) -> list[Any]:
        """Hand every due message of ``queue`` to its consumer (twice: duplicate delivery)."""
        outcomes = []
        for message in self.bus.take(queue):
            for _ in range(2 if twice else 1):
                self.clock.advance(0.001)  # time passes between deliveries, as it does
                outcomes.append(self.app.consume(queue, message))
        return outcomes

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
        return self.bus.to(self.routes.alerts)

    def history(self, order_id: str) -> list[str]:
        return [entry.kind for entry in self.store.get_history(order_id)]


class ReadThenYield:
    """The store, with another instance's whole call run right after this one's next read."""

    def __init__(self, store: Any, meanwhile: Callable[[], Any]) -> None:
        self._store = store
        self._meanwhile: Callable[[], Any] | None = meanwhile
        self.meanwhile: Any = None
        """What the other call returned (None: it has not run)."""

    def get_state(self, order_id: str) -> Any:
        found = self._store.get_state(order_id)
        if self._meanwhile is not None:
            run, self._meanwhile = self._meanwhile, None
            self.meanwhile = run()
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


__all__ = ["BUDGET", "ROUTES", "ReadThenYield", "World"]

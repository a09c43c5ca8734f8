"""Run an application's declared workflows in memory, with a clock that moves only when nothing
else can happen, through sas's own handlers: submission, Scheduler, agents and Supervisor.

Every message goes through its wire encoding and is delivered in due order; agents' actions
answer from a script (``ok``, ``fault``, ``refuse``, ``too_slow``, ``crash_before_reply``), else
a Python agent runs its own function and an HTTP agent succeeds with an empty result; a key a
scripted call applied gets that first result again, as from an idempotent service. A Python
agent's ``app_table(name)`` is an in-memory table (``tables``, empty at first). A run
takes milliseconds: the Supervisor's ticks, backoffs and deadlines are fake time. Messages are
handled one at a time, so a slow call's fake time passes for every order; an exception a
handler raises ends ``run()`` (it is a bug the test should see). With ``breakers=True`` each
agent's target is behind a circuit breaker with the deployed policy, as deployed.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sas.domain.errors import ConfigurationError, InvalidMessage
from sas.domain.messages import OperatorAlert, OrderSubmitted, StatusEvent, encode
from sas.domain.model import HistoryEntry, OrderState
from sas.domain.recovery import RetryPolicy
from sas.domain.wire import Mode, Priority, idempotency_key, queue_word, without_incarnation
from sas.domain.workflow import PythonAgent, Registry
from sas.services import supervisor
from sas.services.actions import TABLES
from sas.services.breaker import CircuitBreaker
from sas.services.context import Agents, Routes
from sas.services.operator import Operator
from sas.services.ports import StateStore
from sas.testing.instance import Instance, instance
from sas.testing.memory import FakeClock, InMemoryBreakers, InMemoryQueues, InMemoryStore, Sent
from sas.testing.remote import Call, Crash, InMemoryRemote, Outcome
from sas.testing.tables import InMemoryTables

if TYPE_CHECKING:
    from sas.entrypoints.order_views import OrderView

STATUS_QUEUE = "status-harness"
_order_ids = itertools.count(1)
"""Order ids unique in the process: a module's state (keyed by idempotency key) never leaks
from one harness into the next."""


class HarnessError(BaseException):
    """An action needs what the app would not give it either (a table no agent declares, a
    setting its agent does not declare): ``run()`` stops with it, rather than retrying it as
    a transient fault as a deployed agent would."""


class Harness:
    """``registry``'s workflows on an in-memory store, run by ``run()``."""

    def __init__(
        self,
        registry: Registry,
        *,
        max_failures: int = 3,
        supervisor_every: float = 2.0,
        redelivery_after: float = 30.0,
        duplicate_deliveries: bool = False,
        store: StateStore | None = None,
        seed: int = 0,
        breakers: bool = False,
    ) -> None:
        if supervisor_every <= 0 or redelivery_after <= 0:
            raise ValueError("supervisor_every and redelivery_after must be positive")
        if problems := registry.undeployable():  # as the app checks it at start
            raise ConfigurationError("; ".join(problems))
        self.registry = registry
        self.clock = FakeClock()
        self.store: StateStore = InMemoryStore() if store is None else store
        """Where orders are kept: in memory, unless a test passes a store (sas's own run the
        same scenarios on Table Storage)."""
        self._seen: set[str] = set()
        self.queues = InMemoryQueues(self.clock)
        self.remote = InMemoryRemote(self.clock)
        """Every HTTP agent's service, and the script of every action."""
        self.tables = InMemoryTables(registry.tables, self.clock)
        """The tables the Python agents declare: ``tables["cards"]`` is what
        ``app_table("cards")`` gives their actions."""
        self._every = timedelta(seconds=supervisor_every)
        self._redelivery = timedelta(seconds=redelivery_after)
        self._duplicates = duplicate_deliveries
        self.routes = _routes(registry)
        self._max_failures = max_failures
        self._pick = random.Random(seed)  # noqa: S311 - which host takes a delivery
        self._deploys = itertools.count(1)
        self.breakers = InMemoryBreakers()
        """The circuit breakers' state (``breakers=True``): ``breakers.written`` lists every
        state they took."""
        self._breakers: dict[str, CircuitBreaker] | None = {} if breakers else None
        self.app: Instance = self._host(registry, "harness")
        """The handlers, as the app's functions call them, on the harness's store and queues."""
        self.ctx = self.app.ctx
        self._hosts = [self.app]

    def deploy(self, registry: Registry, *, alongside: bool = False) -> None:
        """Restart the app on ``registry`` (a workflow's new version added, one removed or
        changed), with the orders, the queued messages and the remote services as they are.
        ``alongside``: the hosts that ran before keep running too, as during a deploy; each
        delivery and each sweep goes to one of them, at random (``seed``), until the next
        deploy."""
        self.registry = registry
        self.routes = _routes(registry, self.routes)
        self.tables.declare(registry.tables)
        self.app = self._host(registry, f"harness-{next(self._deploys)}")
        self.ctx = self.app.ctx
        self._hosts = [*self._hosts, self.app] if alongside else [self.app]

    def _host(self, registry: Registry, instance_id: str) -> Instance:
        return instance(
            self.store,
            self.queues,
            self.routes,
            self.clock,
            registry,
            instance_id,
            policy=RetryPolicy(max_failures=self._max_failures),
            agents=Agents(
                remote=self.remote,
                sleep=self.clock.sleep,
                python={a.name: self._scripted(a) for a in registry.python_agents},
                settings=registry.settings,  # each at its local value, as in a local run
                breaker=None if self._breakers is None else self._breaker,
            ),
        )

    def _breaker(self, target: str) -> CircuitBreaker:
        """The target's breaker, with the deployed policy, for every host (one process's)."""
        assert self._breakers is not None  # noqa: S101 - only handed out with breakers on
        found = self._breakers.get(target)
        if found is None:
            found = self._breakers[target] = CircuitBreaker(self.breakers, self.clock, target)
        return found

    def _next_host(self, queue: str | None = None) -> Instance:
        """Any host (of those with a function on ``queue``: an agent new in this deploy has no
        function on the hosts from before)."""
        hosts = [h for h in self._hosts if queue is None or queue in h.ctx.routes.consumed]
        return hosts[0] if len(hosts) == 1 else self._pick.choice(hosts)

    # --- what a test says ----------------------------------------------------------------

    def script(self, agent: str, action: str, *outcomes: Outcome) -> None:
        """The next calls of ``agent``'s ``action`` answer these, in order; ValueError for an
        action no step of the registry calls."""
        known = {
            (step.agent, name)
            for workflow in self.registry.workflows
            for step in workflow.steps
            for name in (step.action, step.undo)
            if name is not None
        }
        if (agent, action) not in known:
            raise ValueError(f"no step calls {agent!r} action {action!r}")
        self.remote.script(agent, action, *outcomes)

    def unused(self) -> dict[tuple[str, str], list[Outcome]]:
        """Scripted outcomes no call took (a test may want none)."""
        return self.remote.unused()

    def submit(
        self,
        workflow: str,
        details: Mapping[str, Any] | BaseModel,
        *,
        order_id: str | None = None,
        priority: Priority = "normal",
    ) -> str:
        """Post an order to the orders queue, as an application would; returns its id."""
        data = details.model_dump(mode="json") if isinstance(details, BaseModel) else dict(details)
        order_id = order_id or f"order-{next(_order_ids)}"
        message = OrderSubmitted(
            order_id=order_id,
            workflow=workflow,
            details=data,
            reply_to=STATUS_QUEUE,
            status_events="steps",
            priority=priority,
        )
        self.queues.send("orders", message, message_id=order_id, correlation_id=order_id)
        return order_id

    def run(self, *, for_seconds: float = 3600.0) -> None:
        """Deliver every message when due, with the Supervisor's ticks between, until nothing
        is left to do or ``for_seconds`` of fake time have passed."""
        end = self.clock.now() + timedelta(seconds=for_seconds)
        next_tick = self.clock.now() + self._every
        while self.clock.now() < end:
            due = self.queues.next_due()
            if due is not None and due <= self.clock.now():
                self._deliver(self.queues.take_next())
                continue
            if due is None and self._settled():
                return
            if next_tick <= self.clock.now():
                supervisor.sweep(self._next_host().ctx)
                next_tick = self.clock.now() + self._every
                continue
            wake = min(t for t in (due, next_tick, end) if t is not None)
            self.clock.advance((wake - self.clock.now()).total_seconds())

    # --- what a test reads ---------------------------------------------------------------

    @property
    def calls(self) -> list[Call]:
        """Every call of an action, in order: count them to see how often an action ran."""
        return self.remote.calls

    @property
    def effects(self) -> set[str]:
        """The effects a scripted or HTTP call applied (a provider applies one per key), each
        as ``<order>:<step>`` or ``<order>:<step>:undo`` (its key without the incarnation); a
        Python agent's own effects are its business."""
        return {without_incarnation(key) for _, _, key in self.remote.effects}

    def key(self, order_id: str, step: str, mode: Mode = "do") -> str:
        """The idempotency key the order's ``step`` (or its undo) is called with."""
        return idempotency_key(order_id, self.state(order_id).incarnation, step, mode)

    def state(self, order_id: str) -> OrderState:
        """The order's stored state: ``results`` holds each completed step's result by step
        name (what later steps' input builders are given)."""
        found = self.store.get_state(order_id)
        if found is None:
            raise LookupError(f"no order {order_id!r}")
        return found.value

    def order(self, order_id: str) -> OrderView:
        """The order as the HTTP API shows it (``GET /api/orders/{id}``, ``sas status``): its
        state, details, ``steps`` (each with its ``result``) and history."""
        from sas.entrypoints.order_views import OrderView  # FastAPI's models: only when asked

        self.state(order_id)  # LookupError for an unknown order, as state() raises
        return OrderView.of_detail(Operator(self.ctx).detail(order_id), self.registry)

    def history(self, order_id: str) -> list[str]:
        """The order's history, each entry as ``kind`` or ``kind:step``."""
        return [_line(entry) for entry in self.store.get_history(order_id)]

    def statuses(self, order_id: str) -> list[str]:
        """The status events its submitter received."""
        events = self.queues.to(STATUS_QUEUE)
        return [e.status for e in events if isinstance(e, StatusEvent) and e.order_id == order_id]

    @property
    def alerts(self) -> list[OperatorAlert]:
        return [m for m in self.queues.to("alerts") if isinstance(m, OperatorAlert)]

    # --- how it runs ---------------------------------------------------------------------

    def _settled(self) -> bool:
        """Every order ended, and owes no alert."""
        ids = self._seen | set(getattr(self.store, "states", ()))
        found = [self.store.get_state(order_id) for order_id in sorted(ids)]
        states = [versioned.value for versioned in found if versioned is not None]
        return all(s.is_terminal and not s.alert_pending for s in states)

    def _deliver(self, delivery: Sent) -> None:
        if delivery.queue not in self.routes.consumed:
            return  # status events and alerts: kept in ``queues.sent`` for the test
        if isinstance(delivery.message, OrderSubmitted):
            self._seen.add(delivery.message.order_id)
        for _ in range(2 if self._duplicates else 1):
            try:
                self._next_host(delivery.queue).consume(delivery.queue, delivery.message)
            except Crash:
                self.queues.put_back(delivery, self._redelivery)
                return
            except InvalidMessage as refused:  # as the queue functions do: kept, settled
                body = encode(delivery.message)
                self.store.park_message(delivery.queue, refused.reason, body, self.clock.now())

    def _scripted(self, python: PythonAgent) -> PythonAgent:
        """``python`` with each action answering from the script first."""

        def wrap(action: str, function: Callable[..., Any]) -> Callable[..., Any]:
            def run(context: Any, data: dict[str, Any]) -> Any:
                key = context.idempotency_key
                tables = TABLES.set(self.tables)
                try:
                    return self.remote.call(
                        python.name, action, key, data, lambda: function(context, data)
                    )
                except ConfigurationError as exc:
                    raise HarnessError(
                        f"{python.name}.{action}: {exc} (in memory, settings have their local "
                        "values and the tables are those the agents declare)"
                    ) from exc
                finally:
                    TABLES.reset(tables)

            return run

        actions = {name: wrap(name, function) for name, function in python.actions.items()}
        return replace(python, actions=actions)


def _routes(registry: Registry, before: Routes | None = None) -> Routes:
    """Each agent's queue (those of agents an earlier registry named stay)."""
    agents = {} if before is None else dict(before.agents)
    agents |= {name: f"agent-{queue_word(name)}" for name in registry.agents}
    return Routes("orders", "scheduler", "replies", "alerts", agents)


def _line(entry: HistoryEntry) -> str:
    return entry.kind if entry.step is None else f"{entry.kind}:{entry.step}"

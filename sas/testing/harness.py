"""Run an application's declared workflows in memory, with a clock that moves only when nothing
else can happen, through sas's own handlers: submission, Scheduler, agents and Supervisor.

Every message goes through its wire encoding and is delivered in due order; agents' actions
answer from a script (``ok``, ``fault``, ``refuse``, ``too_slow``, ``crash_before_reply``), else
a Python agent runs its own function and an HTTP agent succeeds with an empty result. A run
takes milliseconds: the Supervisor's ticks, backoffs and deadlines are fake time. Messages are
handled one at a time, so a slow call's fake time passes for every order; an exception a
handler raises ends ``run()`` (it is a bug the test should see).
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from pydantic import BaseModel

from sas.domain.errors import (
    ConfigurationError,
    InvalidMessage,
    PermanentRemoteError,
    TransientRemoteError,
)
from sas.domain.messages import (
    Message,
    OperatorAlert,
    OrderSubmitted,
    ScheduleRequest,
    StatusEvent,
    StepReply,
    StepRequest,
    decode,
    encode,
)
from sas.domain.model import HistoryEntry, OrderState
from sas.domain.priority import Waiting
from sas.domain.recovery import RetryPolicy
from sas.domain.wire import Priority
from sas.domain.workflow import PythonAgent, Registry
from sas.services import agent, scheduler, submission, supervisor
from sas.services.context import Agents, Context, Routes
from sas.testing.memory import FakeClock, InMemoryStore

STATUS_QUEUE = "status-harness"
_order_ids = itertools.count(1)
"""Order ids unique in the process: a module's state (keyed by idempotency key) never leaks
from one harness into the next."""


class Call(NamedTuple):
    """One call of an action, as the agent made it."""

    agent: str
    action: str
    key: str
    """The idempotency key."""
    data: Mapping[str, Any]


class Crash(BaseException):
    """The agent's process died mid-call: nothing after it runs, its message is not settled."""


class HarnessError(BaseException):
    """An action needs what the harness does not give (a table through ``app_table``, a
    setting its agent does not declare): ``run()`` stops with it, rather than retrying it as
    a transient fault as a deployed agent would."""


@dataclass(frozen=True)
class Outcome:
    """What one call of an action does (see the module's functions that make them)."""

    result: Mapping[str, Any] | None = None
    error: Exception | None = None
    seconds: float = 0.0
    """How long the call takes, in fake time."""
    crash: bool = False


def ok(result: Mapping[str, Any] | None = None) -> Outcome:
    """The effect is applied; the call returns ``result``."""
    return Outcome(result=result or {})


def fault(reason: str = "unavailable", retry_after: float | None = None) -> Outcome:
    """A transient fault: nothing applied; the agent retries while the deadline allows."""
    return Outcome(error=TransientRemoteError(reason, retry_after))


def refuse(reason: str = "refused") -> Outcome:
    """A refusal for good: nothing applied; the workflow compensates (or stops in Error)."""
    return Outcome(error=PermanentRemoteError(reason))


def too_slow(seconds: float, result: Mapping[str, Any] | None = None) -> Outcome:
    """The effect is applied, but the call returns after ``seconds``: past the deadline, its
    reply is never sent and the Supervisor retries the step."""
    return Outcome(result=result or {}, seconds=seconds)


def crash_before_reply(result: Mapping[str, Any] | None = None) -> Outcome:
    """The effect is applied, then the agent's process dies before replying: its message comes
    back after the visibility timeout."""
    return Outcome(result=result or {}, crash=True)


@dataclass(order=True)
class _Delivery:
    due: datetime
    seq: int
    queue: str = field(compare=False)
    message: Message = field(compare=False)


class _Queues:
    """The transport: messages kept in their wire form, delivered in order of due time."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self._pending: list[_Delivery] = []
        self._seq = itertools.count()
        self.kept: dict[str, list[Message]] = defaultdict(list)
        """Messages to queues the app does not consume (status, alerts), by queue."""

    def send(
        self,
        queue: str,
        message: Message,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        wire = decode(type(message), encode(message))  # what a consumer would read
        due = self._clock.now() + timedelta(seconds=delay_seconds)
        heapq.heappush(self._pending, _Delivery(due, next(self._seq), queue, wire))

    def waiting(self, queue: str) -> Waiting:
        return Waiting()  # no backlog: deadlines get no queue allowance

    def next_due(self) -> datetime | None:
        return self._pending[0].due if self._pending else None

    def take(self) -> _Delivery:
        return heapq.heappop(self._pending)

    def put_back(self, delivery: _Delivery, after: timedelta) -> None:
        again = _Delivery(
            self._clock.now() + after, next(self._seq), delivery.queue, delivery.message
        )
        heapq.heappush(self._pending, again)


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
    ) -> None:
        if supervisor_every <= 0 or redelivery_after <= 0:
            raise ValueError("supervisor_every and redelivery_after must be positive")
        self.registry = registry
        self.clock = FakeClock()
        self.store = InMemoryStore()
        self.queues = _Queues(self.clock)
        self.calls: list[Call] = []
        """Every call of an action, in order: count them to see how often an action ran."""
        self.effects: set[str] = set()
        """The idempotency keys whose effect a scripted or default call applied (a provider
        applies one per key); a Python agent's own effects are its business."""
        self._script: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
        self._every = timedelta(seconds=supervisor_every)
        self._redelivery = timedelta(seconds=redelivery_after)
        self._duplicates = duplicate_deliveries
        agents = {name: f"agent-{name}" for name in registry.agents}
        self.routes = Routes("orders", "scheduler", "replies", "alerts", agents)
        self.ctx = Context(
            self.store,
            self.queues,
            self.clock,
            self.routes,
            "harness",
            workflows=registry,
            policy=RetryPolicy(max_failures=max_failures),
            agents=Agents(
                remote=self,
                sleep=self.clock.sleep,
                python={a.name: self._scripted(a) for a in registry.python_agents},
                settings=registry.settings,  # each at its local value, as in a local run
            ),
        )

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
        self._script[(agent, action)].extend(outcomes)

    def unused(self) -> dict[tuple[str, str], list[Outcome]]:
        """Scripted outcomes no call took (a test may want none)."""
        return {key: list(left) for key, left in self._script.items() if left}

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
                self._deliver(self.queues.take())
                continue
            if due is None and self._settled():
                return
            if next_tick <= self.clock.now():
                supervisor.sweep(self.ctx)
                next_tick = self.clock.now() + self._every
                continue
            wake = min(t for t in (due, next_tick, end) if t is not None)
            self.clock.advance((wake - self.clock.now()).total_seconds())

    # --- what a test reads ---------------------------------------------------------------

    def state(self, order_id: str) -> OrderState:
        found = self.store.get_state(order_id)
        if found is None:
            raise LookupError(f"no order {order_id!r}")
        return found.value

    def history(self, order_id: str) -> list[str]:
        """The order's history, each entry as ``kind`` or ``kind:step``."""
        return [_line(entry) for entry in self.store.get_history(order_id)]

    def statuses(self, order_id: str) -> list[str]:
        """The status events its submitter received."""
        events = self.queues.kept[STATUS_QUEUE]
        return [e.status for e in events if isinstance(e, StatusEvent) and e.order_id == order_id]

    @property
    def alerts(self) -> list[OperatorAlert]:
        return [m for m in self.queues.kept["alerts"] if isinstance(m, OperatorAlert)]

    # --- how it runs ---------------------------------------------------------------------

    def _settled(self) -> bool:
        """Every order ended, and owes no alert."""
        states = [self.state(order_id) for order_id in self.store.states]
        return all(s.is_terminal and not s.alert_pending for s in states)

    def _deliver(self, delivery: _Delivery) -> None:
        consumed = delivery.queue in self.routes.consumed
        times = 2 if self._duplicates and consumed else 1
        for _ in range(times):
            try:
                self._handle(delivery.queue, delivery.message)
            except Crash:
                self.queues.put_back(delivery, self._redelivery)
                return
            except InvalidMessage as refused:  # as the queue functions do: kept, settled
                body = encode(delivery.message)
                self.store.park_message(delivery.queue, refused.reason, body, self.clock.now())

    def _handle(self, queue: str, message: Message) -> None:
        if isinstance(message, OrderSubmitted):
            submission.submit(self.ctx, message)
        elif isinstance(message, ScheduleRequest):
            scheduler.schedule(self.ctx, message)
        elif isinstance(message, StepReply):
            scheduler.on_reply(self.ctx, message)
        elif isinstance(message, StepRequest):
            name = next(a for a, q in self.routes.agents.items() if q == queue)
            agent.run_step(self.ctx, name, message)
        else:
            self.queues.kept[queue].append(message)

    def perform(
        self,
        agent: str,
        action: str,
        *,
        idempotency_key: str,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        """An HTTP agent's call: scripted, or a success with an empty result."""
        result: dict[str, Any] = self._call(agent, action, idempotency_key, payload, dict)
        return result

    def _scripted(self, python: PythonAgent) -> PythonAgent:
        """``python`` with each action answering from the script first."""

        def wrap(action: str, function: Callable[..., Any]) -> Callable[..., Any]:
            def run(context: Any, data: dict[str, Any]) -> Any:
                key = context.idempotency_key
                try:
                    return self._call(
                        python.name, action, key, data, lambda: function(context, data)
                    )
                except ConfigurationError as exc:
                    raise HarnessError(
                        f"{python.name}.{action}: {exc} (in memory, settings have their local "
                        "values and there are no tables: give the action a store of its own)"
                    ) from exc

            return run

        actions = {name: wrap(name, function) for name, function in python.actions.items()}
        return replace(python, actions=actions)

    def _call(
        self,
        agent: str,
        action: str,
        key: str,
        data: Mapping[str, Any],
        otherwise: Callable[[], Any],
    ) -> Any:
        self.calls.append(Call(agent, action, key, dict(data)))
        script = self._script.get((agent, action))
        if not script:
            result = otherwise()
            self.effects.add(key)
            return result
        outcome = script.pop(0)
        if outcome.error is not None:
            raise outcome.error
        self.effects.add(key)
        self.clock.advance(outcome.seconds)
        if outcome.crash:
            raise Crash
        return dict(outcome.result or {})


def _line(entry: HistoryEntry) -> str:
    return entry.kind if entry.step is None else f"{entry.kind}:{entry.step}"

"""What every handler is given: the ports, the clock, the queues, the policies.

``sas/bootstrap.py`` builds one per process; tests build their own on fakes or on Azurite.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from sas.domain.clock import Clock
from sas.domain.endpoints import Endpoint
from sas.domain.model import OrderState
from sas.domain.priority import AdmissionPolicy, InFlightPolicy
from sas.domain.recovery import RetryPolicy
from sas.domain.wire import DEFAULT_PRIORITY, DEFAULT_REPLY_TO_PREFIXES, PRIORITIES, Priority
from sas.domain.workflow import PythonAgent, Registry, Workflow
from sas.services.backlog import Backlog
from sas.services.breaker import CircuitBreaker
from sas.services.in_flight import InFlight
from sas.services.ports import RemoteService, StateStore, Transport
from sas.services.retry_budget import RetryBudget
from sas.services.routing import Router

ALERT_LEASE = timedelta(seconds=60)
"""How long a claim to send an alert excludes other senders: far longer than one send, retries
included (Service Bus: 10 s; Storage Queues: bounded in ``adapters.clients``), plus twice the
largest clock-skew allowance (``settings.MAX_CLOCK_SKEW_SECONDS``), so only a sender that died
is ever replaced."""


@dataclass(frozen=True)
class Routes:
    """Where messages go: the queue names, resolved from settings once. Every queue the app
    consumes has a lane per priority: the attributes name the normal lanes, ``lanes`` maps
    each to its lane per priority (a queue without lanes is its own lane for every one)."""

    orders: str
    scheduler: str
    replies: str
    alerts: str
    agents: Mapping[str, str]
    lanes: Mapping[str, Mapping[Priority, str]] = field(default_factory=dict)
    """Lane per priority of each consumed queue, keyed by the queue's normal lane."""

    def lane(self, queue: str, priority: Priority = DEFAULT_PRIORITY) -> str:
        return self.lanes.get(queue, {}).get(priority, queue)

    def agent(self, name: str, priority: Priority = DEFAULT_PRIORITY) -> str:
        return self.lane(self.agents[name], priority)

    def all_lanes(self, queue: str) -> tuple[str, ...]:
        """``queue``'s lanes, highest priority first, without repeats."""
        return tuple(dict.fromkeys(self.lane(queue, p) for p in PRIORITIES))

    @property
    def consumed(self) -> tuple[str, ...]:
        """Every queue the app is triggered by, every lane of it."""
        return self.lanes_for(PRIORITIES)

    def lanes_for(self, priorities: tuple[Priority, ...]) -> tuple[str, ...]:
        """The lanes of ``priorities`` of every queue the app is triggered by."""
        bases = (self.orders, self.scheduler, self.replies, *self.agents.values())
        lanes = (self.lane(base, p) for base in bases for p in priorities)
        return tuple(dict.fromkeys(lanes))


@dataclass(frozen=True)
class Agents:
    """What the agents call remote services with."""

    remote: RemoteService
    breaker: Callable[[str], CircuitBreaker] | None = None
    """The circuit breaker of a remote target (``Endpoint.target``), shared by every agent."""
    router: Router | None = None
    """Chooses among a service's endpoints by health and load."""
    sleep: Callable[[float], None] = time.sleep
    max_call_seconds: float = 10.0
    safety_margin: timedelta = timedelta(milliseconds=250)
    """An agent aims to be done this long before the deadline."""
    python: Mapping[str, PythonAgent] = field(default_factory=dict)
    """The agents whose actions are the app's Python functions, by name: run in-process."""
    settings: Mapping[str, str] = field(default_factory=dict)
    """The values of the settings the Python agents declare (``PythonAgent.settings``)."""

    def breaker_of(self, target: str) -> CircuitBreaker | None:
        return None if self.breaker is None else self.breaker(target)

    def endpoints(self, agent: str) -> tuple[Endpoint, ...]:
        return () if self.router is None else self.router.endpoints(agent)


@dataclass(frozen=True)
class Context:
    store: StateStore
    transport: Transport
    clock: Clock
    routes: Routes
    instance_id: str
    """Who writes: the ``LockedBy`` of its claims and the actor of its history rows."""
    workflows: Registry
    """The application's workflows (sas/declared.py)."""
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    backlog: Backlog | None = None
    """Peeks at the queues: a claimed step's deadline covers the wait its request can expect in
    its agent's lane and its reply in the replies lane, and low-priority submissions wait for
    a higher backlog. None: neither."""
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    in_flight: InFlight | None = None
    """Counts each workflow's orders in flight: a submission past its ``max_in_flight`` waits
    in the waiting room (``in_flight_policy``, sas/services/room.py). None: no limit."""
    in_flight_policy: InFlightPolicy = field(default_factory=InFlightPolicy)
    reply_to_prefixes: tuple[str, ...] = DEFAULT_REPLY_TO_PREFIXES
    alert_lease: timedelta = ALERT_LEASE
    agents: Agents | None = None
    """Only a process that runs agents needs them."""
    retry_budget: RetryBudget = field(default_factory=RetryBudget)
    """The Supervisor's (sas/services/retry_budget.py): bootstrap makes one Context a process."""

    def definition(self, state: OrderState) -> Workflow:
        """The workflow version ``state`` is bound to, as it was when the order began;
        DefinitionMissing if this host does not have it (sas/services/versions.py)."""
        return self.workflows.bound(state.workflow, state.version, state.definition)

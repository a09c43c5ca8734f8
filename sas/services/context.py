"""What every handler is given: the ports, the clock, the queues, the policies.

``sas/bootstrap.py`` builds one per process; tests build their own on fakes or on Azurite.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from sas.domain.clock import Clock
from sas.domain.endpoints import Endpoint
from sas.domain.priority import AdmissionPolicy
from sas.domain.transitions import RetryPolicy
from sas.services.backlog import Backlog
from sas.services.breaker import CircuitBreaker
from sas.services.ports import RemoteService, StateStore, Transport
from sas.services.routes import Routes
from sas.services.routing import Router

DEFAULT_REPLY_TO_PREFIXES: tuple[str, ...] = ("status-",)
"""Where a submitter's status queue may be, unless ``SAS_REPLY_TO_PREFIXES`` says otherwise."""

ALERT_LEASE = timedelta(seconds=60)
"""How long a claim to send an alert excludes other senders: far longer than one send, retries
included (Service Bus: 10 s; Storage Queues: bounded in ``adapters.clients``), plus twice the
largest clock-skew allowance (``settings.MAX_CLOCK_SKEW_SECONDS``), so only a sender that died
is ever replaced."""


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
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    backlog: Backlog | None = None
    """Peeks at the agents' lanes: a claimed step's deadline covers the wait its request can
    expect there, and low-priority submissions wait for a higher backlog. None: neither."""
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    reply_to_prefixes: tuple[str, ...] = DEFAULT_REPLY_TO_PREFIXES
    alert_lease: timedelta = ALERT_LEASE
    agents: Agents | None = None
    """Only a process that runs agents needs them."""

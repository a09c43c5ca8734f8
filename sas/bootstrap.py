"""Wires settings, adapters and services together, lazily and once per worker process.

Nothing here runs at import time: the Functions host imports function_app.py to index it,
and that must not open connections or read settings that are not there yet.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import timedelta
from functools import wraps
from typing import Any, TypeVar, cast

from sas import settings as settings_module
from sas.declared import registry
from sas.domain.clock import Clock
from sas.domain.errors import ConfigurationError
from sas.domain.recovery import RetryPolicy
from sas.domain.workflow import Registry
from sas.services import metrics, telemetry
from sas.services.backlog import Backlog
from sas.services.breaker import BreakerStore, CircuitBreaker
from sas.services.context import Agents, Context, Routes
from sas.services.gauges import QueueGauges
from sas.services.health import Health, HealthSources
from sas.services.in_flight import InFlight
from sas.services.operator import Operator
from sas.services.parked_messages import ParkedMessages
from sas.services.ports import (
    BudgetStore,
    LoadStore,
    PoisonStore,
    QueueDepth,
    QueuePeek,
    StateStore,
    Transport,
)
from sas.services.routing import Router
from sas.services.store_time import StoreClock, SystemClock
from sas.settings import AGENTS, HTTP_AGENTS

_lock = threading.RLock()
_cached: list[Callable[..., Any]] = []
T = TypeVar("T")


def _once(factory: Callable[[], T]) -> Callable[[], T]:
    value: list[T] = []

    @wraps(factory)
    def get() -> T:
        if not value:
            with _lock:
                if not value:
                    value.append(factory())
        return value[0]

    get.cache_clear = value.clear  # type: ignore[attr-defined]
    _cached.append(get)
    return get


def reset() -> None:
    """Forget every wired object (tests, or after settings change)."""
    with _lock:
        for get in _cached:
            get.cache_clear()  # type: ignore[attr-defined]
        _breakers.clear()
        _app_tables.clear()


@_once
def settings() -> settings_module.Settings:
    loaded = settings_module.load()
    telemetry_setup()  # every wired object reads the settings first: exporters before spans
    return loaded


@_once
def telemetry_setup() -> str:
    """Exporters as the environment asks (none by default), and the order's fields on every
    log record."""
    from sas.adapters.telemetry_setup import configure

    exporter = configure(os.environ)
    telemetry.install_log_filter()
    return exporter


@_once
def host_clock() -> Clock:
    """This machine's clock: only the store clock below reads it."""
    return SystemClock()


@_once
def clock() -> Clock:
    """The store's time, which every role reads (sas/services/store_time.py)."""
    return _store_clock()


@_once
def _store_clock() -> StoreClock:
    """Told the date of every response of the app's store clients."""
    s = settings()
    return StoreClock(
        host_clock(),
        host_name=s.instance_id,
        allowance=timedelta(seconds=s.clock_skew_seconds),
        calibrate=_calibrate_clock,
    )


def _calibrate_clock() -> None:
    from sas.adapters.clients import ping

    ping(_table())


@_once
def workflows() -> Registry:
    """The application's declared workflows (sas/declared.py)."""
    return registry()


@_once
def routes() -> Routes:
    s = settings()
    return Routes(
        orders=s.queue(settings_module.QUEUE_ORDERS),
        scheduler=s.queue(settings_module.QUEUE_SCHEDULER),
        replies=s.queue(settings_module.QUEUE_REPLIES),
        alerts=s.queue(settings_module.QUEUE_ALERTS),
        agents={agent: s.agent_queue(agent) for agent in AGENTS},
        lanes={s.queue(key): s.lanes(key) for key in settings_module.LANED_QUEUES},
    )


@_once
def _table() -> Any:
    """One TableClient (one connection pool) for the state store and the breakers."""
    from sas.adapters.clients import table_client

    s = settings()
    return table_client(s.storage, s.table_name, _store_clock().hooks())


@_once
def _live_table() -> Any:
    """The in-flight table (the Supervisor's index), beside the orders table."""
    from sas.adapters.clients import table_client

    s = settings()
    return table_client(s.storage, s.live_table_name, _store_clock().hooks())


@_once
def store() -> StateStore:
    from sas.adapters.table_store import TableStateStore

    return TableStateStore(_table(), _live_table())


@_once
def transport() -> Transport:
    s = settings()
    if s.transport == "servicebus" and s.servicebus is not None:
        from sas.adapters.servicebus import ServiceBusTransport

        return ServiceBusTransport.from_connection(s.servicebus, clock())
    from sas.adapters.clients import queue_service_client
    from sas.adapters.storage_queues import StorageQueueTransport

    return StorageQueueTransport(queue_service_client(s.storage, _store_clock().hooks()))


@_once
def poison() -> PoisonStore:
    """Poison queues (Storage) or dead-letter queues (Service Bus) of every consumed queue."""
    from sas.domain.parked import consumed_queues

    s = settings()
    r = routes()
    sources = consumed_queues(
        orders=r.orders, scheduler=r.scheduler, replies=r.replies, agents=r.agents, lanes=r.lanes
    )
    if s.transport == "servicebus" and s.servicebus is not None:
        from sas.adapters.poison_servicebus import ServiceBusDeadLetters

        return ServiceBusDeadLetters.from_connection(s.servicebus, sources, clock())
    from sas.adapters.clients import queue_service_client
    from sas.adapters.poison_storage import StoragePoisonQueues

    return StoragePoisonQueues(queue_service_client(s.storage, _store_clock().hooks()), sources)


@_once
def context() -> Context:
    """What every handler of this process is given."""
    s = settings()
    return Context(
        store=store(),
        transport=transport(),
        clock=clock(),
        routes=routes(),
        instance_id=s.instance_id,
        workflows=workflows(),
        policy=RetryPolicy(
            max_failures=s.max_failures, clock_skew=timedelta(seconds=s.clock_skew_seconds)
        ),
        backlog=Backlog(transport(), clock()),
        in_flight=InFlight(store(), clock()),
        admission=s.admission,
        reply_to_prefixes=s.reply_to_prefixes,
    )


@_once
def agent_context() -> Context:
    """The context of a process that runs agents: remote services, breakers, a router where
    some service declares several endpoints or a capacity; the Python agents' settings set."""
    s = settings()
    declared = workflows()
    if missing := [key for key in declared.settings if not os.environ.get(key)]:
        raise ConfigurationError(f"missing setting {missing[0]} (a Python agent's)")
    values = {key: os.environ[key] for key in declared.settings}
    routed = any(len(found) > 1 or found[0].capacity is not None for found in s.endpoints.values())
    agents = Agents(
        remote=_remote(),
        breaker=breaker,
        router=router() if routed else None,
        python={agent.name: agent for agent in declared.python_agents},
        settings=values,
    )
    return replace(context(), agents=agents)


def check_agent(agent: str, env: Mapping[str, str] | None = None) -> None:
    """What the function of ``agent`` needs of the settings (``env``; default the process's):
    ConfigurationError naming the first one missing. Run before each step it takes, and by
    the dev host before it starts the function."""
    environ = os.environ if env is None else env
    s = settings() if env is None else settings_module.load(env)
    if agent in HTTP_AGENTS:
        s.endpoints_of(agent)
    if missing := [key for key in workflows().settings if not environ.get(key)]:
        raise ConfigurationError(f"missing setting {missing[0]} (a Python agent's)")


@_once
def gauges() -> QueueGauges:
    """Queue depth, parked and poisoned counts for the metrics: read by the Supervisor's
    process, at most once a minute, only while metrics are exported."""
    r = routes()
    queues = (*r.consumed, r.alerts)
    depth = cast(QueueDepth, transport())  # both transports have it; the port stays small
    return QueueGauges(depth, queues, store(), poison(), clock())


@_once
def operator() -> Operator:
    return Operator(context())


@_once
def parked_messages() -> ParkedMessages:
    return ParkedMessages(context(), poison=poison())


@_once
def health() -> Health:
    """The operators' health view: throughput, endpoints and their breakers, waiting alerts."""
    s = settings()
    peeking = transport()  # both transports peek and estimate depth; the ports stay small
    return Health(
        HealthSources(
            store=store(),
            breakers=_breaker_store(),
            loads=_load_store(),
            budgets=budget_store(),
            queues=cast(QueuePeek, peeking),
            depth=cast(QueueDepth, peeking),
            clock=clock(),
            alerts_queue=routes().alerts,
            endpoints=lambda: list(s.all_endpoints),
        )
    )


@_once
def _remote() -> Any:
    from sas.adapters.remote_http import HttpRemoteService, quiet_request_log

    quiet_request_log()
    return HttpRemoteService(settings().remote_targets)


@_once
def _breaker_store() -> BreakerStore:
    """Breaker state lives in the orders table (PartitionKey ``~breaker``)."""
    from sas.adapters.breaker_table import TableBreakerStore

    return TableBreakerStore(_table())


def breaker(name: str) -> CircuitBreaker:
    """The circuit breaker of one remote target (an agent's service, or one endpoint of it:
    ``Endpoint.target``), default policy, state in the table; one per process, so its cached
    state serves every caller."""
    with _lock:
        found = _breakers.get(name)
        if found is None:
            found = _breakers[name] = CircuitBreaker(_breaker_store(), clock(), name)
            metrics.watch_breaker(name, found.last_status)
        return found


@_once
def budget_store() -> BudgetStore:
    """The Supervisors' retries held back live in the in-flight table (``~budget``)."""
    from sas.adapters.load_table import TableBudgetStore

    return TableBudgetStore(_live_table())


@_once
def _load_store() -> LoadStore:
    """Endpoint load rows live in the in-flight table (PartitionKey ``~load``)."""
    from sas.adapters.load_table import TableLoadStore

    return TableLoadStore(_live_table())


@_once
def router() -> Router:
    """Routes steps to remote endpoints by health (their breakers) and load."""
    s = settings()
    return Router(
        dict(s.endpoints),
        clock(),
        s.instance_id,
        healthy=lambda endpoint: breaker(endpoint.target).healthy(),
        loads=_load_store(),
        background=True,
    )


_breakers: dict[str, CircuitBreaker] = {}
_app_tables: dict[str, Any] = {}


def app_table(name: str) -> Any:
    """A TableClient for a table a Python agent declared (``PythonAgent.tables``)."""
    if name not in workflows().tables:
        raise ConfigurationError(f"table {name!r}: no Python agent declares it")
    with _lock:
        found = _app_tables.get(name)
        if found is None:
            from sas.adapters.clients import table_client

            found = _app_tables[name] = table_client(settings().storage, name)
        return found

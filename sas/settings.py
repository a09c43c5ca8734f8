"""Every setting sas reads, validated at first use with an error that names the key.

Connections follow the Azure Functions convention: ``<Conn>`` holds a connection string
(Azurite, or keys where allowed), or ``<Conn>__tableServiceUri`` / ``__queueServiceUri`` /
``__fullyQualifiedNamespace`` with ``__credential=managedidentity`` and ``__clientId`` for an
identity-based connection resolved with azure-identity.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal, TypedDict
from urllib.parse import urlparse

from sas.declared import registry
from sas.domain.endpoints import Endpoint, single_endpoint
from sas.domain.errors import ConfigurationError
from sas.domain.priority import AdmissionPolicy
from sas.domain.wire import (
    APP_QUEUE_NAME,
    DEFAULT_PRIORITY,
    DEFAULT_REPLY_TO_PREFIXES,
    ENDPOINT_NAME,
    MAX_APP_QUEUE_NAME,
    POISON_SUFFIX,
    PRIORITIES,
    REPLY_TO_PREFIX,
    TABLE_NAME_RULE,
    Priority,
    lane_queue_name,
    lane_setting,
    live_table_name,
    queue_word,
)

TransportKind = Literal["servicebus", "storage"]
"""Which queue service carries the messages (a value; SAS_TRANSPORT is the key that picks it)."""

TRANSPORT = "SAS_TRANSPORT"
TABLE_NAME = "SAS_TABLE_NAME"
INSTANCE_ID = "SAS_INSTANCE_ID"
SUPERVISOR_SCHEDULE = "SAS_SUPERVISOR_SCHEDULE"
MAX_FAILURES = "SAS_MAX_FAILURES"
CLOCK_SKEW_SECONDS = "SAS_CLOCK_SKEW_SECONDS"
REPLY_TO_PREFIXES = "SAS_REPLY_TO_PREFIXES"
STORAGE_CONNECTION = "SasStorage"
SERVICEBUS_CONNECTION = "SasServiceBus"
QUEUE_ORDERS = "SAS_QUEUE_ORDERS"
QUEUE_SCHEDULER = "SAS_QUEUE_SCHEDULER"
QUEUE_REPLIES = "SAS_QUEUE_REPLIES"
QUEUE_ALERTS = "SAS_QUEUE_ALERTS"
LOW_PRIORITY_BACKLOG = "SAS_LOW_PRIORITY_BACKLOG_SECONDS"
LOW_PRIORITY_MAX_DEFERRAL = "SAS_LOW_PRIORITY_MAX_DEFERRAL_SECONDS"
MAX_ENDPOINTS = 8
AGENTS: tuple[str, ...] = registry().agents
"""The agents the declared workflows name (sas/declared.py): each has its queue."""
HTTP_AGENTS: tuple[str, ...] = registry().http_agents
"""The agents that call a remote HTTP service: each needs its URL (or endpoints) setting."""
APP_TABLES: tuple[str, ...] = registry().tables
"""The tables the Python agents declare (``PythonAgent.tables``), beside sas's own."""


def agent_queue_setting(agent: str) -> str:
    return f"SAS_QUEUE_AGENT_{agent.upper()}"


def remote_url_setting(agent: str) -> str:
    return f"SAS_REMOTE_{agent.upper()}_URL"


def remote_capacity_setting(agent: str) -> str:
    """Capacity (calls at once) of the one endpoint the URL setting names; unset: no limit."""
    return f"SAS_REMOTE_{agent.upper()}_CAPACITY"


def missing_remote(agent: str) -> str:
    """What an HTTP agent given no service is told: the setting to set."""
    return (
        f"missing setting {remote_url_setting(agent)}: the base URL of the remote service the "
        f"agent {agent!r} calls (or its endpoints, {remote_endpoints_setting(agent)})"
    )


def remote_endpoints_setting(agent: str) -> str:
    """Several endpoints of one remote service, as JSON: ``[{"name": "west", "url": "https://...",
    "capacity": 8}, ...]`` (capacity optional). Replaces the URL setting when set."""
    return f"SAS_REMOTE_{agent.upper()}_ENDPOINTS"


QUEUE_PREFIX = "SAS_QUEUE_PREFIX"
DEFAULT_QUEUE_PREFIX = "sas"
LANED_QUEUES: tuple[str, ...] = (
    QUEUE_ORDERS,
    QUEUE_SCHEDULER,
    QUEUE_REPLIES,
    *(agent_queue_setting(agent) for agent in AGENTS),
)
"""The queue settings the app is triggered by: each has a lane (a queue of its own, with its
own trigger) per priority; ``lane_setting`` names them."""


def queue_names(env: Mapping[str, str]) -> dict[str, str]:
    """Every queue's name by its setting key: ``<SAS_QUEUE_PREFIX>-orders``, ``-orders-high``,
    ``-scheduler``, ``-replies``, ``-agent-<agent>``, ``-alerts``, ... (prefix ``sas`` by
    default), unless the queue's own setting names it; a lane follows its normal lane's name
    when only that is set. ConfigurationError, naming the key, for a name no queue can have or
    two keys naming one queue."""
    prefix = env.get(QUEUE_PREFIX) or DEFAULT_QUEUE_PREFIX
    bases = {
        QUEUE_ORDERS: "orders",
        QUEUE_SCHEDULER: "scheduler",
        QUEUE_REPLIES: "replies",
        **{agent_queue_setting(agent): f"agent-{queue_word(agent)}" for agent in AGENTS},
    }
    names: dict[str, str] = {}
    source: dict[str, str] = {}  # the setting each name comes from
    for key, base in bases.items():
        normal = env.get(key) or f"{prefix}-{base}"
        for priority in PRIORITIES:
            lane = lane_setting(key, priority)
            names[lane] = env.get(lane) or lane_queue_name(normal, priority)
            source[lane] = next((k for k in (lane, key) if env.get(k)), QUEUE_PREFIX)
    names[QUEUE_ALERTS] = env.get(QUEUE_ALERTS) or f"{prefix}-alerts"
    source[QUEUE_ALERTS] = QUEUE_ALERTS if env.get(QUEUE_ALERTS) else QUEUE_PREFIX
    by_name: dict[str, str] = {}
    for key, name in names.items():
        if not APP_QUEUE_NAME.matches(name):
            raise ConfigurationError(f"{source[key]}={name!r} is not a valid queue name")
        if name in by_name:
            raise ConfigurationError(f"{by_name[name]} and {key} name the same queue {name!r}")
        by_name[name] = key
    return names


DEFAULT_QUEUES: dict[str, str] = queue_names({})
"""The queue names of a deployment that sets none."""
MAX_QUEUE_PREFIX = MAX_APP_QUEUE_NAME - max(
    len(name) - len(DEFAULT_QUEUE_PREFIX) for name in DEFAULT_QUEUES.values()
)
"""The longest ``SAS_QUEUE_PREFIX`` ``queue_names`` accepts: with it, the longest queue name
(the longest agent's ``-low`` or ``-high`` lane) and the host's ``-poison`` suffix fill a queue
name's 63 characters. infra/main.bicep's ``@maxLength`` is this (``make infra``)."""
DEFAULT_TABLE = "sasorders"
DEFAULT_CLOCK_SKEW_SECONDS = 2.0
MAX_CLOCK_SKEW_SECONDS = 10.0


@dataclass(frozen=True)
class Connection:
    """One resolved connection: a connection string, or endpoints plus an identity."""

    setting: str
    connection_string: str | None = None
    table_uri: str | None = None
    queue_uri: str | None = None
    namespace: str | None = None
    client_id: str | None = None
    credential: Literal["managedidentity"] | None = None
    """``<Conn>__credential``: 'managedidentity' means ManagedIdentityCredential (the
    user-assigned one ``client_id`` names, else the system-assigned one); None means
    DefaultAzureCredential, and then ``client_id`` must be None too."""

    @property
    def uses_identity(self) -> bool:
        return self.connection_string is None


@dataclass(frozen=True)
class Settings:
    transport: TransportKind
    table_name: str
    queues: Mapping[str, str]
    """Queue name by setting key (QUEUE_* and agent queue settings)."""
    remote_urls: Mapping[str, str]
    """Remote service base URL by agent name, for each HTTP agent given one."""
    instance_id: str
    storage: Connection
    servicebus: Connection | None
    max_failures: int = 3
    clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    """The clock-skew allowance: the Supervisor calls a step expired this long after its
    deadline (by the store's time, which every role reads), and a host whose clock is further
    than this from the store's is reported."""
    reply_to_prefixes: tuple[str, ...] = DEFAULT_REPLY_TO_PREFIXES
    """A submitter's status queue must start with one of these (the app's own never may)."""
    endpoints: Mapping[str, tuple[Endpoint, ...]] = field(default_factory=dict)
    """Each HTTP agent's remote endpoints, for each given a URL or endpoints."""
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    """When low-priority orders are let in under a backlog of higher ones."""

    def endpoints_of(self, agent: str) -> tuple[Endpoint, ...]:
        """ConfigurationError, naming the setting, for an agent given no service."""
        found = self.endpoints.get(agent)
        if found:
            return found
        if agent in self.remote_urls:
            return (single_endpoint(agent, self.remote_urls[agent]),)
        raise ConfigurationError(missing_remote(agent))

    @property
    def all_endpoints(self) -> tuple[Endpoint, ...]:
        """Every endpoint of every HTTP agent given a service."""
        return tuple(e for agent in self.remote_urls for e in self.endpoints_of(agent))

    @property
    def remote_targets(self) -> dict[str, str]:
        """Base URL by remote target (``Endpoint.target``), every endpoint of every agent."""
        return {e.target: e.url for e in self.all_endpoints}

    @property
    def live_table_name(self) -> str:
        """The in-flight table (the Supervisor's index) beside the orders table."""
        return live_table_name(self.table_name)

    @property
    def tables(self) -> tuple[str, ...]:
        """Every table the app uses: what provisioning (Bicep, or locally) creates."""
        return (self.table_name, self.live_table_name, *APP_TABLES)

    def queue(self, key: str) -> str:
        return self.queues[key]

    def agent_queue(self, agent: str) -> str:
        return self.queues[agent_queue_setting(agent)]

    def lanes(self, queue_setting: str) -> dict[Priority, str]:
        """The lane of ``queue_setting`` (one of LANED_QUEUES) for every priority."""
        return {p: self.queues[lane_setting(queue_setting, p)] for p in PRIORITIES}

    def lane(self, queue_setting: str, priority: Priority = DEFAULT_PRIORITY) -> str:
        return self.queues[lane_setting(queue_setting, priority)]


def transport_from(env: Mapping[str, str]) -> TransportKind:
    value = (env.get(TRANSPORT) or "servicebus").strip().lower()
    if value not in ("servicebus", "storage"):
        raise ConfigurationError(f"{TRANSPORT} must be 'servicebus' or 'storage', got {value!r}")
    return "servicebus" if value == "servicebus" else "storage"


def load(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    transport = transport_from(env)
    table_name = env.get(TABLE_NAME) or DEFAULT_TABLE
    if not TABLE_NAME_RULE.matches(table_name):
        raise ConfigurationError(f"{TABLE_NAME}={table_name!r} is not a valid table name")
    if {table_name.lower(), live_table_name(table_name).lower()} & {t.lower() for t in APP_TABLES}:
        raise ConfigurationError(f"{TABLE_NAME}={table_name!r}: a Python agent declares it too")
    queues = queue_names(env)
    given = {agent: _endpoints(env, agent) for agent in HTTP_AGENTS}
    endpoints = {agent: found for agent, found in given.items() if found is not None}
    remote_urls = {agent: found[0].url for agent, found in endpoints.items()}
    storage = _storage_connection(env, STORAGE_CONNECTION)
    servicebus = (
        _servicebus_connection(env, SERVICEBUS_CONNECTION) if transport == "servicebus" else None
    )
    instance_id = env.get(INSTANCE_ID) or f"{socket.gethostname()}-{os.getpid()}"
    max_failures = _positive_int(env, MAX_FAILURES, default=3)
    return Settings(
        transport,
        table_name,
        queues,
        remote_urls,
        instance_id,
        storage,
        servicebus,
        max_failures,
        clock_skew_seconds=_clock_skew(env),
        reply_to_prefixes=_reply_to_prefixes(env, queues.values()),
        endpoints=endpoints,
        admission=AdmissionPolicy(
            backlog=timedelta(seconds=_seconds(env, LOW_PRIORITY_BACKLOG, 5.0, 1.0, 300.0)),
            max_deferral=timedelta(
                seconds=_seconds(env, LOW_PRIORITY_MAX_DEFERRAL, 60.0, 1.0, 3600.0)
            ),
        ),
    )


def _seconds(env: Mapping[str, str], key: str, default: float, low: float, high: float) -> float:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{key} must be a number of seconds") from None
    if not low <= value <= high:
        raise ConfigurationError(f"{key} must be between {low:g} and {high:g} seconds")
    return value


def _endpoints(env: Mapping[str, str], agent: str) -> tuple[Endpoint, ...] | None:
    """The agent's endpoints: the ENDPOINTS setting (JSON) if set, else the URL setting; None
    if neither is (its function fails, naming the setting: ``Settings.endpoints_of``)."""
    key = remote_endpoints_setting(agent)
    raw = env.get(key)
    if raw is not None and raw.strip() and (env.get(remote_capacity_setting(agent)) or "").strip():
        raise ConfigurationError(
            f"{remote_capacity_setting(agent)} applies to the one URL; with {key}, give each "
            "endpoint its own capacity"
        )
    if raw is None or raw.strip() == "":
        if not env.get(remote_url_setting(agent)):
            return None
        capacity_key = remote_capacity_setting(agent)
        capacity = _positive_int(env, capacity_key, default=1) if env.get(capacity_key) else None
        return (single_endpoint(agent, _url(env, remote_url_setting(agent)), capacity),)
    try:
        items = json.loads(raw)
    except ValueError:
        raise ConfigurationError(f"{key} must be a JSON list of endpoints") from None
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ENDPOINTS:
        raise ConfigurationError(f"{key} must list 1 to {MAX_ENDPOINTS} endpoints")
    found: list[Endpoint] = []
    for number, item in enumerate(items, start=1):
        endpoint = _endpoint(agent, item, f"{key}: endpoint {number}")
        if any(e.name == endpoint.name for e in found):
            raise ConfigurationError(f"{key}: endpoint name {endpoint.name!r} is used twice")
        found.append(endpoint)
    return tuple(found)


def _endpoint(agent: str, item: object, where: str) -> Endpoint:
    """One entry of an ENDPOINTS setting, checked field by field."""
    if not isinstance(item, dict) or not set(item) <= {"name", "url", "capacity"}:
        raise ConfigurationError(f"{where} must be an object with name, url and capacity")
    name, capacity, raw_url = item.get("name"), item.get("capacity"), item.get("url")
    if not isinstance(name, str) or not ENDPOINT_NAME.matches(name):
        raise ConfigurationError(f"{where}: name must match {ENDPOINT_NAME.body}")
    if capacity is not None and (
        not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1
    ):
        raise ConfigurationError(f"{where}: capacity must be a whole number, at least 1")
    if not isinstance(raw_url, str):
        raise ConfigurationError(f"{where}: url must be an http(s) URL")
    return Endpoint(agent, name, _url({where: raw_url}, where), capacity)


def _clock_skew(env: Mapping[str, str]) -> float:
    return _seconds(
        env, CLOCK_SKEW_SECONDS, DEFAULT_CLOCK_SKEW_SECONDS, 0.0, MAX_CLOCK_SKEW_SECONDS
    )


def _reply_to_prefixes(env: Mapping[str, str], app_queues: Iterable[str]) -> tuple[str, ...]:
    raw = env.get(REPLY_TO_PREFIXES)
    if raw is None or raw.strip() == "":
        prefixes = DEFAULT_REPLY_TO_PREFIXES
    else:
        prefixes = tuple(p.strip() for p in raw.split(",") if p.strip())
    for prefix in prefixes:
        if not REPLY_TO_PREFIX.matches(prefix):
            raise ConfigurationError(
                f"{REPLY_TO_PREFIXES}: {prefix!r} is not a queue-name prefix "
                "(lowercase letters, digits and hyphens, starting with a letter or digit)"
            )
    if not prefixes:
        raise ConfigurationError(f"{REPLY_TO_PREFIXES} names no prefix")
    for queue in app_queues:
        # The host's poison queue of each is the app's too (a prefix may cover it alone).
        for covered in (queue, queue + POISON_SUFFIX):
            if covered.startswith(prefixes):
                raise ConfigurationError(
                    f"{REPLY_TO_PREFIXES} would let submitters name the app's queue {covered!r}"
                )
    return prefixes


def _positive_int(env: Mapping[str, str], key: str, *, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{key} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise ConfigurationError(f"{key} must be at least 1")
    return value


def _url(env: Mapping[str, str], key: str) -> str:
    value = env.get(key)
    if not value:
        raise ConfigurationError(f"missing setting {key}")
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigurationError(f"{key} must be an http(s) URL")
    return value.rstrip("/")


class _Identity(TypedDict):
    credential: Literal["managedidentity"] | None
    client_id: str | None


def _identity(env: Mapping[str, str], name: str) -> _Identity:
    """The Functions convention: managed identity only where ``<Conn>__credential`` says so.

    A ``__clientId`` without ``__credential=managedidentity`` is refused rather than ignored:
    the Functions host ignores it there, so its triggers would sign in differently from the app.
    """
    credential = env.get(f"{name}__credential") or None
    if credential is not None and credential.lower() != "managedidentity":
        raise ConfigurationError(f"{name}__credential must be 'managedidentity' when set")
    client_id = env.get(f"{name}__clientId") or None
    if client_id is not None and credential is None:
        raise ConfigurationError(
            f"{name}__clientId is set without {name}__credential=managedidentity: "
            "set both (a user-assigned managed identity) or neither (DefaultAzureCredential)"
        )
    return {"credential": "managedidentity" if credential else None, "client_id": client_id}


def _storage_connection(env: Mapping[str, str], name: str) -> Connection:
    if value := env.get(name):
        if "AccountName=" not in value and "UseDevelopmentStorage=true" not in value:
            raise ConfigurationError(f"{name} is not a storage connection string")
        return Connection(setting=name, connection_string=value)
    table_uri, queue_uri = env.get(f"{name}__tableServiceUri"), env.get(f"{name}__queueServiceUri")
    if not table_uri or not queue_uri:
        raise ConfigurationError(
            f"missing setting {name} (a connection string) or both "
            f"{name}__tableServiceUri and {name}__queueServiceUri"
        )
    for key, uri in (
        (f"{name}__tableServiceUri", table_uri),
        (f"{name}__queueServiceUri", queue_uri),
    ):
        parsed = urlparse(uri)
        if parsed.scheme != "https" or not parsed.netloc:
            raise ConfigurationError(f"{key} must be an https URL with a host")
    return Connection(
        setting=name, table_uri=table_uri, queue_uri=queue_uri, **_identity(env, name)
    )


def _servicebus_connection(env: Mapping[str, str], name: str) -> Connection:
    if value := env.get(name):
        if "Endpoint=sb://" not in value:
            raise ConfigurationError(f"{name} is not a Service Bus connection string")
        return Connection(setting=name, connection_string=value)
    namespace = env.get(f"{name}__fullyQualifiedNamespace")
    if not namespace:
        raise ConfigurationError(
            f"missing setting {name} (a connection string) or {name}__fullyQualifiedNamespace"
        )
    if not re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+", namespace):
        raise ConfigurationError(f"{name}__fullyQualifiedNamespace must be a host name")
    return Connection(setting=name, namespace=namespace, **_identity(env, name))

"""The infrastructure agrees with the code: settings, queues, table, roles, no keys, alerts,
diagnostics, budgets, the runtime lock (requirements.txt) and host.json sampling.

Reads the Bicep through pycep-parser's JSON and evaluates the few simple expressions the
infra uses to derive queue names (map, items, concat, ternaries), so the check follows the
values rather than the spelling. An expression it cannot evaluate fails loudly: extend
``evaluate`` rather than weakening a check.
"""

from __future__ import annotations

import inspect
import ipaddress
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st
from pycep import BicepParser
from pycep.models import BicepElement

from sas import settings
from sas.declared import registry
from sas.domain import wire
from sas.domain.errors import ConfigurationError
from sas.domain.workflow import PythonAgent, Registry, StepDefinition, Workflow
from sas.settings import HTTP_AGENTS
from sas_local import infra
from workflows.order import ORDER_WORKFLOW

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
LOCAL_SETTINGS_EXAMPLE = ROOT / "local.settings.example.json"

# Read by the supervisor timer (schedule) and the failure policy; not in sas.settings.
SUPERVISOR_SCHEDULE = "SAS_SUPERVISOR_SCHEDULE"
MAX_FAILURES = "SAS_MAX_FAILURES"

STORAGE_IDENTITY_KEYS = {
    f"{settings.STORAGE_CONNECTION}__tableServiceUri",
    f"{settings.STORAGE_CONNECTION}__queueServiceUri",
    f"{settings.STORAGE_CONNECTION}__credential",
    f"{settings.STORAGE_CONNECTION}__clientId",
}
SERVICEBUS_IDENTITY_KEYS = {
    f"{settings.SERVICEBUS_CONNECTION}__fullyQualifiedNamespace",
    f"{settings.SERVICEBUS_CONNECTION}__credential",
    f"{settings.SERVICEBUS_CONNECTION}__clientId",
}
SAS_KEYS = {
    settings.QUEUE_PREFIX,
    settings.TRANSPORT,
    settings.TABLE_NAME,
    *(settings.remote_url_setting(agent) for agent in HTTP_AGENTS),
    *(settings.remote_capacity_setting(agent) for agent in HTTP_AGENTS),
    *(settings.remote_endpoints_setting(agent) for agent in HTTP_AGENTS),
    settings.LOW_PRIORITY_BACKLOG,
    settings.LOW_PRIORITY_MAX_DEFERRAL,
    SUPERVISOR_SCHEDULE,
    MAX_FAILURES,
    settings.CLOCK_SKEW_SECONDS,
    settings.REPLY_TO_PREFIXES,
}
HOST_LOCAL_KEYS = {"FUNCTIONS_WORKER_RUNTIME", "AzureWebJobsStorage", "AzureWebJobsFeatureFlags"}
"""What `func start` needs beside the app's own settings."""
HOST_KEYS = {
    "AzureWebJobsStorage__blobServiceUri",
    "AzureWebJobsStorage__queueServiceUri",
    "AzureWebJobsStorage__tableServiceUri",
    "AzureWebJobsStorage__credential",
    "AzureWebJobsStorage__clientId",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
}

# Built-in role definition ids.
BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
TABLE_DATA_CONTRIBUTOR = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3"
SB_DATA_SENDER = "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39"
SB_DATA_RECEIVER = "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0"
SB_DATA_OWNER = "090c5cfd-751d-490a-894a-3ce6f1109419"
METRICS_PUBLISHER = "3913510d-42f4-4e42-8a64-420c390055eb"
REQUIRED_ROLES = {
    BLOB_DATA_OWNER: "Storage Blob Data Owner",
    QUEUE_DATA_CONTRIBUTOR: "Storage Queue Data Contributor",
    TABLE_DATA_CONTRIBUTOR: "Storage Table Data Contributor",
    SB_DATA_SENDER: "Azure Service Bus Data Sender",
    SB_DATA_RECEIVER: "Azure Service Bus Data Receiver",
    SB_DATA_OWNER: "Azure Service Bus Data Owner",  # on trigger queues only, never the namespace
    METRICS_PUBLISHER: "Monitoring Metrics Publisher",
}
FORBIDDEN_ROLES = {
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9": "User Access Administrator",
    "f58310d9-a9f6-439a-9e8d-f62e7b41a168": "Role Based Access Control Administrator",
}
ROLE_ASSIGNMENT = "Microsoft.Authorization/roleAssignments"
SB_NAMESPACE = "Microsoft.ServiceBus/namespaces"
SB_QUEUE = "Microsoft.ServiceBus/namespaces/queues"
STORAGE_ACCOUNT = "Microsoft.Storage/storageAccounts"
DIAGNOSTIC_SETTINGS = "Microsoft.Insights/diagnosticSettings"
METRIC_ALERT = "Microsoft.Insights/metricAlerts"
LOG_ALERT = "Microsoft.Insights/scheduledQueryRules"
ACTION_GROUP = "Microsoft.Insights/actionGroups"
OPERATOR_ALERT_EVENT = "sas.operator_alert"
ALERTS_QUEUE = settings.DEFAULT_QUEUES[settings.QUEUE_ALERTS]
GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


# --- reading the Bicep -----------------------------------------------------------------------


@cache
def bicep(name: str) -> dict[str, Any]:
    return dict(BicepParser().parse(file_path=INFRA / name))


def text(name: str) -> str:
    return (INFRA / name).read_text()


def all_infra_text() -> str:
    paths = sorted(INFRA.rglob("*.bicep")) + sorted(INFRA.rglob("*.json"))
    return "\n".join(path.read_text() for path in paths)


def resources_of_type(parsed: Mapping[str, Any], type_: str) -> dict[str, Any]:
    return {name: r for name, r in parsed.get("resources", {}).items() if r["type"] == type_}


def body(resource: Mapping[str, Any]) -> dict[str, Any]:
    """A resource's object, under its loop or condition if it has one."""
    config = resource["config"]
    while (
        isinstance(config, dict)
        and "config" in config
        and ("loop_type" in config or "condition" in config)
    ):
        config = config["config"]
    return dict(config)


def module_params(module: str) -> dict[str, Any]:
    config = bicep("main.bicep")["modules"][module]["config"]
    if "condition" in config:
        config = config["config"]
    return dict(config["params"])


def param_default(parsed: Mapping[str, Any], name: str) -> Any:
    return parsed["parameters"][name].get("default")


def decorator(parsed: Mapping[str, Any], param: str, kind: str) -> Any:
    for item in parsed["parameters"][param]["decorators"]:
        if item["type"] == kind:
            return item["argument"]
    return None


Scope = dict[str, Any]


def file_scope(parsed: Mapping[str, Any], **overrides: Any) -> Scope:
    """Parameters (defaults, then overrides) and variables of one Bicep file, evaluated."""
    scope: Scope = {}
    for name, param in parsed.get("parameters", {}).items():
        if "default" in param:
            scope[name] = evaluate(param["default"], scope)
    scope.update(overrides)
    for name, variable in parsed.get("variables", {}).items():
        try:
            scope[name] = evaluate(variable["value"], scope)
        except Unevaluable:
            continue  # depends on resources or modules: not needed by these checks
    return scope


class Unevaluable(Exception):
    pass


class DeploymentFails(Exception):
    """What Bicep's fail() does: the deployment stops with this message."""


def evaluate(expr: Any, scope: Scope) -> Any:
    """Evaluate the subset of Bicep expressions that the queue and role lists use."""
    if isinstance(expr, bool | int | float) or expr is None:
        return expr
    if isinstance(expr, BicepElement):  # an identifier; plain str is a literal
        return _lookup(expr, scope)
    if isinstance(expr, str):
        return re.sub(r"\$\{(\w+)\}", lambda m: str(_lookup(m.group(1), scope)), expr)
    if isinstance(expr, list):
        return [evaluate(item, scope) for item in expr]
    if isinstance(expr, dict):
        if "function" in expr:
            return _call(expr["function"]["type"], expr["function"].get("parameters", {}), scope)
        if "operator" in expr:
            return _operate(expr["operator"]["type"], expr["operator"]["operands"], scope)
        if expr.get("type") == "lambda_expression":
            detail = expr["detail"]
            return lambda value: evaluate(detail["expression"], {**scope, detail["var_1"]: value})
        if "loop_type" in expr:
            loop = expr["loop_type"]["detail"]
            items = evaluate(loop["array_name"], scope)
            return [evaluate(expr["config"], {**scope, loop["item_name"]: i}) for i in items]
        return {key: evaluate(value, scope) for key, value in expr.items()}
    raise Unevaluable(repr(expr))


def _lookup(name: str, scope: Scope) -> Any:
    if name not in scope:
        raise Unevaluable(name)
    return scope[name]


def _call(name: str, parameters: Mapping[str, Any], scope: Scope) -> Any:
    args = [evaluate(value, scope) for value in parameters.values()]
    functions: dict[str, Callable[..., Any]] = {
        "map": lambda items, fn: [fn(item) for item in items],
        "items": lambda obj: [{"key": k, "value": obj[k]} for k in sorted(obj)],
        "concat": lambda *lists: [item for lst in lists for item in lst],
        "flatten": lambda lists: [item for lst in lists for item in lst],
        "to_object": lambda items, key, value: {key(i): value(i) for i in items},
        "toObject": lambda items, key, value: {key(i): value(i) for i in items},
        "union": lambda *objs: {k: v for obj in objs for k, v in obj.items()},
        "empty": lambda value: not value,
        "any": lambda value: value,  # Bicep's type-checking escape: the value as it is
        "string": _arm_string,
        "filter": lambda items, fn: [item for item in items if fn(item)],
        "split": lambda text, separator: text.split(separator),
        "trim": lambda text: text.strip(),
        "replace": lambda text, old, new: text.replace(old, new),
        "length": len,
        "range": lambda start, count: list(range(start, start + count)),
        "substring": lambda text, start, length: text[start : start + length],
        "contains": lambda container, item: item in container,
        "starts_with": lambda text, start: text.startswith(start),
        "ends_with": lambda text, end: text.endswith(end),
        "fail": _fail,
        # the public cloud's (the only one the infra's Service Bus DNS zone is for)
        "environment": lambda: {"suffixes": {"storage": "core.windows.net"}},
        # resource id without the subscription: '<type>/<name>' (role ids are the name)
        "subscription_resource_id": lambda type_, *names: "/".join(
            [type_, *(str(n) for n in names if n is not None)]
        ),
    }
    if name not in functions:
        raise Unevaluable(name)
    return functions[name](*args)


def _fail(message: str) -> Any:
    raise DeploymentFails(message)


def _arm_string(value: Any) -> str:
    """ARM's string(): an array or object as compact JSON."""
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _operate(name: str, operands: Mapping[str, Any], scope: Scope) -> Any:
    if name == "conditional":
        branch = "true_value" if evaluate(operands["condition"], scope) else "false_value"
        return evaluate(operands[branch], scope)
    if name == "property_accessor":
        value = evaluate(operands["operand_1"], scope)
        for key in _accessor_path(operands["operand_2"]):
            value = value[key]
        return value
    values = [evaluate(value, scope) for value in operands.values()]
    if name == "equals":
        return values[0] == values[1]
    if name == "not_equals":
        return values[0] != values[1]
    if name == "not":
        return not values[0]
    if name == "and":
        return bool(values[0] and values[1])
    if name == "or":
        return bool(values[0] or values[1])
    if name == "index_accessor":
        return values[0][values[1]]
    raise Unevaluable(name)


def dotted(expr: Any) -> str:
    """``a.b.c`` for a property access expression (or an identifier)."""
    if isinstance(expr, str):
        return str(expr)
    operands = expr["operator"]["operands"]
    return ".".join([operands["operand_1"], *_accessor_path(operands["operand_2"])])


def _accessor_path(expr: Any) -> list[str]:
    if isinstance(expr, str):
        return [expr]
    if isinstance(expr, dict) and expr.get("operator", {}).get("type") == "property_accessor":
        operands = expr["operator"]["operands"]
        return [operands["operand_1"], *_accessor_path(operands["operand_2"])]
    raise Unevaluable(repr(expr))


def setting_keys(expr: Any, variables: Mapping[str, Any]) -> set[str]:
    """Keys of every object an app settings expression can produce (both ternary branches)."""
    if isinstance(expr, str) and expr in variables:
        return setting_keys(variables[expr]["value"], variables)
    if isinstance(expr, dict):
        if "function" in expr:
            return set().union(
                *(setting_keys(v, variables) for v in expr["function"]["parameters"].values())
            )
        if "operator" in expr:
            operands = expr["operator"]["operands"]
            branches = [operands[k] for k in ("true_value", "false_value") if k in operands]
            return set().union(*(setting_keys(v, variables) for v in branches))
        return set(expr)
    return set()


def iso_duration(value: str) -> timedelta:
    match = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?", value)
    assert match and value not in ("P", "PT"), f"not an ISO 8601 duration: {value!r}"
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def main_scope(transport: str, **overrides: Any) -> Scope:
    """main.bicep's scope, with each HTTP agent's URL module's output (remote-url.bicep)."""
    scope = file_scope(
        bicep("main.bicep"),
        environmentName="test",
        location="swedencentral",
        transport=transport,
        **{
            **{infra.param_name(a, "Url"): f"https://remote/{a}" for a in HTTP_AGENTS},
            **overrides,
        },
    )
    for agent in HTTP_AGENTS:  # remote-url.bicep outputs its parameter as it is
        source = evaluate(module_params(infra.url_module(agent))["source"], scope)
        scope[infra.url_module(agent)] = {"outputs": {"source": source}}
    return scope


def remote_urls(scope: Scope) -> dict[str, str]:
    """Each HTTP agent's SAS_REMOTE_<AGENT>_URL app setting as main.bicep writes it."""
    values = bicep("main.bicep")["variables"]["sasSettings"]["value"]
    return {a: evaluate(values[settings.remote_url_setting(a)], scope) for a in HTTP_AGENTS}


def module_enabled(module: str, scope: Scope) -> bool:
    config = bicep("main.bicep")["modules"][module]["config"]
    return "condition" not in config or bool(evaluate(config["condition"], scope))


def provisioned_queues(transport: str, **overrides: Any) -> tuple[list[str], list[str]]:
    """(Service Bus queues, storage queues) that main.bicep provisions for a transport."""
    scope = main_scope(transport, **overrides)
    servicebus_queues: list[str] = []
    if module_enabled("serviceBus", scope):
        params = {"queueNames": evaluate(module_params("serviceBus")["queueNames"], scope)}
        servicebus_queues = looped_names(
            "modules/servicebus.bicep", "Microsoft.ServiceBus/namespaces/queues", params
        )
    params = {"queueNames": evaluate(module_params("storage")["queueNames"], scope)}
    storage_queues = looped_names(
        "modules/storage.bicep", "Microsoft.Storage/storageAccounts/queueServices/queues", params
    )
    return servicebus_queues, storage_queues


def looped_names(module: str, type_: str, params: Mapping[str, Any]) -> list[str]:
    parsed = bicep(module)
    [resource] = resources_of_type(parsed, type_).values()
    loop = resource["config"]
    assert "loop_type" in loop, f"{module}: {type_} should be a loop over the queue names"
    scope = file_scope(parsed, **params)
    detail = loop["loop_type"]["detail"]
    items = evaluate(detail["array_name"], scope)
    return [evaluate(loop["config"]["name"], {**scope, detail["item_name"]: i}) for i in items]


# --- (a) every setting the code reads is an app setting --------------------------------------


def app_setting_keys() -> set[str]:
    parsed = bicep("main.bicep")
    assert module_params("functionApp")["appSettings"] == "appSettings"
    return setting_keys("appSettings", parsed["variables"])


def host_setting_keys() -> set[str]:
    parsed = bicep("modules/functionapp.bicep")
    [config] = resources_of_type(parsed, "Microsoft.Web/sites/config").values()
    assert body(config)["name"] == "appsettings"
    return setting_keys(body(config)["properties"], parsed["variables"])


def test_every_setting_the_code_reads_is_an_app_setting() -> None:
    keys = app_setting_keys()

    missing = (SAS_KEYS | STORAGE_IDENTITY_KEYS | SERVICEBUS_IDENTITY_KEYS) - keys
    assert not missing, f"app settings missing from infra/main.bicep: {sorted(missing)}"


def test_the_host_gets_identity_based_storage_and_entra_telemetry() -> None:
    keys = host_setting_keys()

    assert keys >= HOST_KEYS, f"missing host settings: {sorted(HOST_KEYS - keys)}"
    configs = resources_of_type(bicep("modules/functionapp.bicep"), "Microsoft.Web/sites/config")
    [config] = configs.values()
    union_args = body(config)["properties"]["function"]["parameters"].values()
    assert "appSettings" in union_args, "the app settings from main.bicep must be applied"
    assert "AzureWebJobsStorage" not in keys, "host storage must not be a connection string"
    flex_forbidden = {
        "FUNCTIONS_WORKER_RUNTIME",
        "FUNCTIONS_EXTENSION_VERSION",
        "WEBSITE_RUN_FROM_PACKAGE",
        "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    }
    assert not (keys | app_setting_keys()) & flex_forbidden


def test_setting_values_match_the_code_defaults() -> None:
    parsed = bicep("main.bicep")
    scope = main_scope("servicebus")

    assert sorted(scope["queueNames"]) == sorted(settings.DEFAULT_QUEUES.values())
    assert param_default(parsed, "queuePrefix") == settings.DEFAULT_QUEUE_PREFIX
    assert param_default(parsed, "tableName") == settings.DEFAULT_TABLE
    assert param_default(parsed, "transport") == "servicebus"
    assert decorator(parsed, "transport", "allowed") == ["servicebus", "storage"]
    assert param_default(parsed, "supervisorSchedule") == "*/15 * * * * *"
    assert param_default(parsed, "maxFailures") == 3
    assert float(param_default(parsed, "clockSkewSeconds")) == settings.DEFAULT_CLOCK_SKEW_SECONDS
    assert tuple(param_default(parsed, "replyToPrefixes").split(",")) == (
        wire.DEFAULT_REPLY_TO_PREFIXES
    )
    sas = parsed["variables"]["sasSettings"]["value"]
    assert sas[settings.TRANSPORT] == "transport"
    assert sas[settings.TABLE_NAME] == "tableName"
    assert sas[f"{settings.STORAGE_CONNECTION}__credential"] == "managedidentity"
    servicebus = parsed["variables"]["serviceBusSettings"]["value"]["operator"]["operands"]
    assert servicebus["true_value"][f"{settings.SERVICEBUS_CONNECTION}__credential"] == (
        "managedidentity"
    )
    assert evaluate(servicebus["condition"], scope) is True
    assert evaluate(servicebus["condition"], main_scope("storage")) is False


# --- the queue prefix: the limits the app sets, in the Bicep too ------------------------------


def test_the_queue_prefix_parameter_has_the_apps_length_limits() -> None:
    main = bicep("main.bicep")
    assert decorator(main, "queuePrefix", "min_length") == 1  # empty: the app's default
    assert decorator(main, "queuePrefix", "max_length") == settings.MAX_QUEUE_PREFIX
    longest = "q" * settings.MAX_QUEUE_PREFIX
    names = settings.queue_names({settings.QUEUE_PREFIX: longest})
    assert max(len(name + wire.POISON_SUFFIX) for name in names.values()) == wire.MAX_QUEUE_NAME
    # Provisioned with Storage Queues, poison queues too: all fit.
    _, storage_queues = provisioned_queues("storage", queuePrefix=longest)
    assert set(names.values()) < set(storage_queues)
    assert max(len(name) for name in storage_queues) == wire.MAX_QUEUE_NAME
    with pytest.raises(ConfigurationError, match=settings.QUEUE_PREFIX):
        settings.queue_names({settings.QUEUE_PREFIX: longest + "q"})
    readme = " ".join((INFRA / "README.md").read_text().split())
    assert f"at most {settings.MAX_QUEUE_PREFIX} characters" in readme


def bicep_takes_prefix(prefix: str) -> bool:
    """Whether a deployment with ``prefix`` gets past the parameter's decorators and
    main.bicep's own check of it (``checkedQueuePrefix`` fails the deployment)."""
    main = bicep("main.bicep")
    low, high = (decorator(main, "queuePrefix", kind) for kind in ("min_length", "max_length"))
    if not low <= len(prefix) <= high:
        return False
    try:
        main_scope("servicebus", queuePrefix=prefix)
    except DeploymentFails as failed:
        assert prefix in str(failed)  # the message names what it refuses
        return False
    return True


def app_takes_prefix(prefix: str) -> bool:
    try:
        settings.queue_names({settings.QUEUE_PREFIX: prefix})
    except ConfigurationError:
        return False
    return True


PREFIXES = [
    "sas", "q", "7", "shop-eu", "a-b-c", "x1", "Shop", "SHOP", "shop_eu", "shop.eu", "shop eu",
    "-shop", "shop-", "sh--op", "-", "é", "shöp", "q" * settings.MAX_QUEUE_PREFIX,
    "q" * (settings.MAX_QUEUE_PREFIX + 1), "q-" * 17 + "q", "q" * 40,
]  # fmt: skip


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_bicep_takes_exactly_the_queue_prefixes_the_app_takes(prefix: str) -> None:
    assert bicep_takes_prefix(prefix) == app_takes_prefix(prefix)


@hypothesis.settings(max_examples=200, deadline=None, database=None)
@hypothesis.given(st.text(alphabet="abz09-A_.", min_size=1, max_size=40))
def test_any_queue_prefix_is_taken_by_both_or_neither(prefix: str) -> None:
    assert bicep_takes_prefix(prefix) == app_takes_prefix(prefix)


def default_app_settings(transport: str) -> set[str]:
    """The app settings main.bicep writes when no optional parameter is set."""
    variables = bicep("main.bicep")["variables"]
    union = variables["appSettings"]["value"]["function"]
    assert (union["type"], list(union["parameters"].values())) == (
        "union",
        ["sasSettings", "changedSettings", "serviceBusSettings"],
    )
    scope = main_scope(transport)
    keys = set(variables["sasSettings"]["value"]) | set(scope["changedSettings"])
    servicebus = variables["serviceBusSettings"]["value"]["operator"]["operands"]
    if evaluate(servicebus["condition"], scope):
        keys |= set(servicebus["true_value"])
    return keys


def test_infra_readme_counts_the_settings_of_a_default_deployment() -> None:
    readme = " ".join((INFRA / "README.md").read_text().split())
    stated = re.search(
        r"sets (\d+) of the app's settings \((\d+) with Storage Queues; .*?adds the host's (\d+):",
        readme,
    )
    assert stated, "infra/README.md no longer states the number of app settings"
    assert [int(n) for n in stated.groups()] == [
        len(default_app_settings("servicebus")),
        len(default_app_settings("storage")),
        len(host_setting_keys()),
    ]


def test_resolved_app_settings_load() -> None:
    """The settings main.bicep writes, with placeholder endpoints, satisfy settings.load."""
    scope = main_scope("servicebus")
    endpoints = {
        "SasStorage__tableServiceUri": "https://st.table.core.windows.net/",
        "SasStorage__queueServiceUri": "https://st.queue.core.windows.net/",
        "SasStorage__clientId": "00000000-0000-0000-0000-000000000000",
        "SasServiceBus__fullyQualifiedNamespace": "sb.servicebus.windows.net",
        "SasServiceBus__clientId": "00000000-0000-0000-0000-000000000000",
    }
    env: dict[str, str] = {}
    for key, value in bicep("main.bicep")["variables"]["sasSettings"]["value"].items():
        env[key] = endpoints.get(key) or str(evaluate(value, scope))
    assert scope["changedSettings"] == {}  # a default deployment sets no optional setting
    env.update(main_scope("servicebus", queuePrefix="shop", maxFailures=5)["changedSettings"])
    operands = bicep("main.bicep")["variables"]["serviceBusSettings"]["value"]["operator"]
    for key, value in operands["operands"]["true_value"].items():
        env[key] = endpoints.get(key) or str(evaluate(value, scope))

    loaded = settings.load(env)

    own = sorted(key for key in env if key not in registry().settings)
    # sas's own and a URL per HTTP agent; the Python agents' settings are the app's
    assert len(own) <= 12 + len(HTTP_AGENTS), own
    assert set(registry().settings) <= set(env)
    assert (loaded.queue(settings.QUEUE_ORDERS), loaded.max_failures) == ("shop-orders", 5)
    assert loaded.transport == "servicebus"
    assert loaded.storage.uses_identity
    assert loaded.servicebus is not None and loaded.servicebus.uses_identity
    assert loaded.storage.credential == loaded.servicebus.credential == "managedidentity"


# --- (b) every queue and the table are provisioned -------------------------------------------


def test_service_bus_transport_provisions_every_queue_on_service_bus() -> None:
    servicebus_queues, storage_queues = provisioned_queues("servicebus")

    assert sorted(servicebus_queues) == sorted(settings.DEFAULT_QUEUES.values())
    assert storage_queues == []


def test_storage_transport_provisions_every_queue_and_its_poison_queue() -> None:
    servicebus_queues, storage_queues = provisioned_queues("storage")

    names = sorted(settings.DEFAULT_QUEUES.values())
    assert servicebus_queues == []
    assert sorted(storage_queues) == sorted(names + [f"{name}-poison" for name in names])
    assert all(len(name) <= 63 for name in storage_queues)


def test_the_queues_exist_in_both_transports_modules() -> None:
    """Each default queue name is provisioned as a Service Bus queue and as a storage queue
    (for the transport that is selected)."""
    servicebus_queues, _ = provisioned_queues("servicebus")
    _, storage_queues = provisioned_queues("storage")

    for name in settings.DEFAULT_QUEUES.values():
        assert name in servicebus_queues
        assert name in storage_queues


def test_the_tables_and_the_deployment_container_are_provisioned() -> None:
    parsed = bicep("modules/storage.bicep")
    tables = resources_of_type(parsed, "Microsoft.Storage/storageAccounts/tableServices/tables")
    [container] = resources_of_type(
        parsed, "Microsoft.Storage/storageAccounts/blobServices/containers"
    ).values()

    assert sorted(body(t)["name"] for t in tables.values()) == [
        "appTableName",
        "liveTableName",
        "tableName",
    ]
    assert module_params("storage")["tableName"] == "tableName"
    main = bicep("main.bicep")
    assert main["variables"]["appTableNames"]["value"] == list(registry().tables) != []
    assert module_params("storage")["appTableNames"] == "appTableNames"
    assert main["variables"]["liveTableSuffix"]["value"] == wire.LIVE_TABLE_SUFFIX
    assert "liveTableSuffix" in str(module_params("storage")["liveTableName"])
    assert decorator(main, "tableName", "max_length") == 63 - len(wire.LIVE_TABLE_SUFFIX)
    assert param_default(bicep("main.bicep"), "tableName") == settings.DEFAULT_TABLE
    assert body(container)["name"] == "deploymentContainerName"
    assert body(container)["properties"]["publicAccess"] == "None"


def test_service_bus_queues_dead_letter_deduplicate_and_lock_long_enough() -> None:
    parsed = bicep("modules/servicebus.bicep")
    [queues] = resources_of_type(parsed, "Microsoft.ServiceBus/namespaces/queues").values()
    properties = body(queues)["properties"]
    main = bicep("main.bicep")
    longest_budget = max(w.longest_budget for w in registry().workflows)
    pickup_budget = max(w.pickup_budget for w in registry().workflows)

    assert properties["deadLetteringOnMessageExpiration"] is True
    assert properties["requiresDuplicateDetection"] is True
    assert properties["duplicateDetectionHistoryTimeWindow"] == (
        "duplicateDetectionHistoryTimeWindow"
    )
    assert properties["lockDuration"] == "lockDuration"
    assert properties["maxDeliveryCount"] == "maxDeliveryCount"
    assert properties["requiresSession"] is False
    params = module_params("serviceBus")
    assert params["lockDuration"] == "serviceBusLockDuration"
    assert params["duplicateDetectionHistoryTimeWindow"] == "serviceBusDuplicateDetectionWindow"
    locks = [param_default(main, "serviceBusLockDuration")]
    locks += decorator(main, "serviceBusLockDuration", "allowed")
    for lock in locks:
        assert longest_budget <= iso_duration(lock) <= timedelta(minutes=5), lock
    window = iso_duration(param_default(main, "serviceBusDuplicateDetectionWindow"))
    assert max(longest_budget, pickup_budget) <= window <= timedelta(days=7)


# --- (c) roles: everything needed, nothing privileged ----------------------------------------

# Stand-ins for the outputs of main.bicep's modules, so that module arguments evaluate.
MODULE_OUTPUTS: dict[str, Any] = {
    "identity": {"outputs": {"principalId": "app-principal", "clientId": "app-client", "id": "id"}},
    "storage": {"outputs": {"name": "st"}},
    "serviceBus": {"outputs": {"name": "sb"}},
    "monitoring": {
        "outputs": {
            "applicationInsightsName": "appi",
            "logAnalyticsName": "log",
            "logAnalyticsId": "log-id",
        }
    },
    "functionApp": {"outputs": {"name": "func"}},
    "network": {"outputs": {"appSubnetId": "app-subnet-id"}},
}


def module_args(module: str, transport: str, **overrides: Any) -> dict[str, Any] | None:
    """What main.bicep passes to a module for a transport (None: the module is not deployed).

    Arguments that cannot be evaluated (resource tokens, uniqueString) are left out; overrides
    set main.bicep's parameters (its variables follow them) or stand in for its variables."""
    scope = {**main_scope(transport, **overrides), **MODULE_OUTPUTS, **overrides}
    if not module_enabled(module, scope):
        return None
    args: dict[str, Any] = {}
    for name, value in module_params(module).items():
        try:
            args[name] = evaluate(value, scope)
        except Unevaluable:
            continue
    return args


@dataclass(frozen=True)
class Grant:
    role: str
    """Role definition id."""
    scope_type: str
    scope_name: str


def grants(args: Mapping[str, Any]) -> list[Grant]:
    """Every role assignment modules/roles.bicep creates for these arguments."""
    parsed = bicep("modules/roles.bicep")
    scope = file_scope(parsed, **args)
    result: list[Grant] = []
    for name, resource in resources_of_type(parsed, ROLE_ASSIGNMENT).items():
        assert "loop_type" in resource["config"], f"{name} should be a loop"
        loop = resource["config"]["loop_type"]["detail"]
        config = body(resource)
        for index, item in enumerate(evaluate(loop["array_name"], scope)):
            local = {**scope, loop["item_name"]: item}
            if loop.get("index_name"):
                local[loop["index_name"]] = index
            role = evaluate(config["properties"]["roleDefinitionId"], local).rsplit("/", 1)[-1]
            assert evaluate(config["properties"]["principalId"], local) == args["principalId"]
            result.append(Grant(role, *assignment_target(parsed, config["scope"], local)))
    return result


def assignment_target(parsed: Mapping[str, Any], expr: Any, scope: Scope) -> tuple[str, str]:
    """(type, name) of the resource a role assignment's ``scope`` names."""
    if isinstance(expr, str):
        resource = parsed["resources"][expr]
        return resource["type"], evaluate(body(resource)["name"], scope)
    assert expr["operator"]["type"] == "index_accessor", expr
    operands = expr["operator"]["operands"]
    resource = parsed["resources"][operands["operand_1"]]
    loop = resource["config"]["loop_type"]["detail"]
    item = evaluate(loop["array_name"], scope)[evaluate(operands["operand_2"], scope)]
    return resource["type"], evaluate(body(resource)["name"], {**scope, loop["item_name"]: item})


def app_grants(transport: str) -> list[Grant]:
    args = module_args("appRoles", transport)
    assert args is not None
    return grants(args)


def deployer_grants(transport: str) -> list[Grant]:
    args = module_args("userRoles", transport, principalId="deployer", grantDeployerDataAccess=True)
    assert args is not None
    return grants(args)


@cache
def code_trigger_queues() -> frozenset[str]:
    """The queues the app consumes: function_app indexed as the host does (servicebus)."""
    script = (
        "import json, function_app\n"
        "print(json.dumps([getattr(f.get_trigger(), 'queue_name', None)"
        " for f in function_app.app.get_functions()]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAS_", "Sas"))}
    env[settings.TRANSPORT] = "servicebus"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return frozenset(queue for queue in json.loads(done.stdout) if queue)


def test_the_app_identity_gets_every_role_it_needs() -> None:
    params = module_params("appRoles")
    assert params["hostRoles"] is True
    assert params["principalType"] == "ServicePrincipal"
    assert dotted(params["principalId"]) == "identity.outputs.principalId"

    servicebus = {grant.role for grant in app_grants("servicebus")}
    storage = {grant.role for grant in app_grants("storage")}

    assert servicebus == {
        BLOB_DATA_OWNER,
        TABLE_DATA_CONTRIBUTOR,
        SB_DATA_SENDER,
        SB_DATA_OWNER,  # on the trigger queues; includes receive
        SB_DATA_RECEIVER,  # on the alerts queue, which the queue-depth gauge peeks
        METRICS_PUBLISHER,
    }
    assert storage == {
        BLOB_DATA_OWNER,
        TABLE_DATA_CONTRIBUTOR,
        QUEUE_DATA_CONTRIBUTOR,
        METRICS_PUBLISHER,
    }


def test_role_names_in_the_bicep_match_their_ids() -> None:
    scope = file_scope(bicep("modules/roles.bicep"), principalId="p")
    roles = [v for v in scope.values() if isinstance(v, dict) and set(v) == {"id", "name"}]

    assert {role["id"] for role in roles} == set(REQUIRED_ROLES)
    for role in roles:
        assert REQUIRED_ROLES[role["id"]] == role["name"]


def test_service_bus_data_owner_is_scoped_to_each_trigger_queue_never_the_namespace() -> None:
    """Target-based scaling reads queue length with the app's identity (Manage rights): Data
    Owner on exactly the queues the app's triggers consume, nowhere else."""
    trigger_queues = code_trigger_queues()
    assert trigger_queues == set(settings.DEFAULT_QUEUES.values()) - {ALERTS_QUEUE}

    owner = [grant for grant in app_grants("servicebus") if grant.role == SB_DATA_OWNER]

    assert sorted(grant.scope_name for grant in owner) == sorted(trigger_queues)
    assert {grant.scope_type for grant in owner} == {SB_QUEUE}
    roles = bicep("modules/roles.bicep")
    queues = [r for r in resources_of_type(roles, SB_QUEUE).values() if r["existing"]]
    assert len(queues) == 2  # the trigger queues, the read-only ones
    assert all(body(queue)["parent"] == "serviceBus" for queue in queues)
    [namespace] = resources_of_type(roles, SB_NAMESPACE).values()
    assert body(namespace)["name"] == "serviceBusNamespaceName"
    assert (module_args("appRoles", "servicebus") or {})["serviceBusNamespaceName"] == "sb"
    everyone = [*app_grants("storage"), *deployer_grants("servicebus"), *deployer_grants("storage")]
    assert not [grant for grant in everyone if grant.role == SB_DATA_OWNER]


def test_the_deploying_principal_gets_data_roles_only_on_request() -> None:
    main = bicep("main.bicep")
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]

    assert param_default(main, "grantDeployerDataAccess") is False
    assert parameters["grantDeployerDataAccess"]["value"].endswith("=false}")
    for principal, asked, deployed in [
        ("", False, False),
        ("", True, False),
        ("abc", False, False),  # azd always sets principalId: that alone grants nothing
        ("abc", True, True),
    ]:
        args = module_args(
            "userRoles", "servicebus", principalId=principal, grantDeployerDataAccess=asked
        )
        assert (args is not None) is deployed, (principal, asked)
    assert module_params("userRoles")["hostRoles"] is False


def test_the_alerts_queue_is_readable_by_the_app_and_the_deployer_on_service_bus() -> None:
    """The queue-depth gauges peek every queue, the alerts queue too; operators receive from
    it. No trigger consumes it, so only Data Receiver, only there."""
    for grants_of in (app_grants, deployer_grants):
        receiver = [g for g in grants_of("servicebus") if g.role == SB_DATA_RECEIVER]
        alerts = [g for g in receiver if g.scope_name == ALERTS_QUEUE]
        assert [(g.scope_type, g.scope_name) for g in alerts] == [(SB_QUEUE, ALERTS_QUEUE)]
    app_receiver = [g for g in app_grants("servicebus") if g.role == SB_DATA_RECEIVER]
    assert [g.scope_name for g in app_receiver] == [ALERTS_QUEUE]
    assert not [g for g in app_grants("storage") if g.role == SB_DATA_RECEIVER]


def test_the_deployer_receives_only_from_the_app_s_queues_and_gets_no_host_roles() -> None:
    servicebus = deployer_grants("servicebus")

    receiver = [grant for grant in servicebus if grant.role == SB_DATA_RECEIVER]
    expected = sorted([*code_trigger_queues(), ALERTS_QUEUE])
    assert sorted(grant.scope_name for grant in receiver) == expected
    assert {grant.scope_type for grant in receiver} == {SB_QUEUE}
    assert {grant.role for grant in servicebus} == {
        TABLE_DATA_CONTRIBUTOR,
        SB_DATA_SENDER,
        SB_DATA_RECEIVER,
    }
    assert {grant.role for grant in deployer_grants("storage")} == {
        TABLE_DATA_CONTRIBUTOR,
        QUEUE_DATA_CONTRIBUTOR,
    }


def test_storage_queue_role_only_on_the_storage_transport() -> None:
    for grants_of in (app_grants, deployer_grants):
        assert QUEUE_DATA_CONTRIBUTOR not in {grant.role for grant in grants_of("servicebus")}
        [queue_role] = [g for g in grants_of("storage") if g.role == QUEUE_DATA_CONTRIBUTOR]
        assert (queue_role.scope_type, queue_role.scope_name) == (STORAGE_ACCOUNT, "st")


def test_only_send_is_granted_on_the_service_bus_namespace() -> None:
    """Send stays on the namespace (reply-to queues are named per order); nothing else does."""
    for grants_of in (app_grants, deployer_grants):
        on_namespace = [g for g in grants_of("servicebus") if g.scope_type == SB_NAMESPACE]
        assert [(g.role, g.scope_name) for g in on_namespace] == [(SB_DATA_SENDER, "sb")]
        assert not [g for g in grants_of("storage") if g.scope_type in (SB_NAMESPACE, SB_QUEUE)]


def test_role_assignments_are_deterministic_and_data_roles_only() -> None:
    for path in sorted(INFRA.rglob("*.bicep")):
        assignments = resources_of_type(bicep(path.relative_to(INFRA).as_posix()), ROLE_ASSIGNMENT)
        if path.name != "roles.bicep":
            assert not assignments, f"{path.name}: grant roles through modules/roles.bicep"
        for name, resource in assignments.items():
            assert "loop_type" in resource["config"], f"{name} should loop over roles or queues"
            config = body(resource)
            assert config["name"]["function"]["type"] == "guid", f"{name}: name must be guid()"
            definition = config["properties"]["roleDefinitionId"]["function"]
            assert definition["type"] == "subscription_resource_id"

    guids = {g.lower() for g in GUID.findall(all_infra_text())}
    assert not guids & set(FORBIDDEN_ROLES), [
        FORBIDDEN_ROLES[g] for g in guids & set(FORBIDDEN_ROLES)
    ]
    assert guids <= set(REQUIRED_ROLES), (
        f"unexpected role ids in infra: {guids - set(REQUIRED_ROLES)}"
    )
    for role in FORBIDDEN_ROLES.values():
        assert f"'{role}'" not in all_infra_text()


# --- (d) no shared keys, no local auth --------------------------------------------------------


def test_no_shared_key_or_local_auth_path() -> None:
    accounts = {
        path.name: body(account)["properties"]
        for path in sorted(INFRA.rglob("*.bicep"))
        for account in resources_of_type(
            bicep(path.relative_to(INFRA).as_posix()), STORAGE_ACCOUNT
        ).values()
        if not account["existing"]
    }
    assert set(accounts) == {"storage.bicep", "simulator.bicep"}
    for account_properties in accounts.values():
        assert account_properties["allowSharedKeyAccess"] is False
        assert account_properties["allowBlobPublicAccess"] is False
        assert account_properties["minimumTlsVersion"] == "TLS1_2"
        assert account_properties["supportsHttpsTrafficOnly"] is True

    servicebus = bicep("modules/servicebus.bicep")
    [namespace] = resources_of_type(servicebus, "Microsoft.ServiceBus/namespaces").values()
    assert body(namespace)["properties"]["disableLocalAuth"] is True
    assert body(namespace)["properties"]["minimumTlsVersion"] == "1.2"
    sku = evaluate(body(namespace)["sku"], file_scope(servicebus, name="sb", queueNames=[]))
    assert sku == {"name": "Standard", "tier": "Standard"}

    monitoring = bicep("modules/monitoring.bicep")
    [insights] = resources_of_type(monitoring, "Microsoft.Insights/components").values()
    assert body(insights)["properties"]["DisableLocalAuth"] is True

    functionapp = bicep("modules/functionapp.bicep")
    [site] = resources_of_type(functionapp, "Microsoft.Web/sites").values()
    site_properties = body(site)["properties"]
    authentication = site_properties["functionAppConfig"]["deployment"]["storage"]["authentication"]
    assert authentication["type"] == "UserAssignedIdentity"
    assert site_properties["httpsOnly"] is True
    assert site_properties["functionAppConfig"]["runtime"] == {"name": "python", "version": "3.11"}
    assert body(site)["identity"]["type"] == "UserAssigned"
    [plan] = resources_of_type(functionapp, "Microsoft.Web/serverfarms").values()
    assert body(plan)["sku"] == {"tier": "FlexConsumption", "name": "FC1"}

    infra = all_infra_text()
    for forbidden in (
        "listKeys(",
        "listkeys(",
        "AccountKey=",
        "SharedAccessKey",
        "listConnectionStrings(",
    ):
        assert forbidden not in infra, forbidden


def test_one_user_assigned_identity() -> None:
    identities = [
        name
        for path in sorted(INFRA.rglob("*.bicep"))
        for name, r in bicep(path.relative_to(INFRA).as_posix()).get("resources", {}).items()
        if r["type"] == "Microsoft.ManagedIdentity/userAssignedIdentities" and not r["existing"]
    ]

    assert identities == ["identity"]


# --- network isolation: off by default, private endpoints when on --------------------------------

NETWORK_ISOLATION_PARAMETERS = {
    "networkIsolation": "${SAS_NETWORK_ISOLATION=false}",
    "allowedIpAddresses": "${SAS_ALLOWED_IP_ADDRESSES=}",
    "serviceBusSku": "${SAS_SERVICEBUS_SKU=Standard}",
    "serviceBusMessagingUnits": "${SAS_SERVICEBUS_MESSAGING_UNITS=1}",
}
PRIVATE_DNS_ZONES = {
    "blob": "privatelink.blob.core.windows.net",
    "queue": "privatelink.queue.core.windows.net",
    "table": "privatelink.table.core.windows.net",
    "namespace": "privatelink.servicebus.windows.net",
}
FLEX_SUBNET_DELEGATION = "Microsoft.App/environments"
PRIVATE_ENDPOINT = "Microsoft.Network/privateEndpoints"
DNS_ZONE = "Microsoft.Network/privateDnsZones"
DNS_ZONE_LINK = "Microsoft.Network/privateDnsZones/virtualNetworkLinks"
DNS_ZONE_GROUP = "Microsoft.Network/privateEndpoints/privateDnsZoneGroups"
VNET = "Microsoft.Network/virtualNetworks"
# Stand-ins for the resources network.bicep references by id.
NETWORK_RESOURCES = {
    "storage": {"id": "storage-id"},
    "serviceBus": {"id": "servicebus-id"},
}
ISOLATED = {"networkIsolation": True, "resourceToken": "tok"}


def storage_account(transport: str, **overrides: Any) -> dict[str, Any]:
    """The storage account's properties as main.bicep deploys them."""
    args = module_args("storage", transport, **overrides)
    assert args is not None
    parsed = bicep("modules/storage.bicep")
    [account] = resources_of_type(parsed, STORAGE_ACCOUNT).values()
    return dict(evaluate(body(account)["properties"], file_scope(parsed, **args)))


def service_bus(**overrides: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(namespace, its network rule set or None) as main.bicep deploys them (servicebus)."""
    args = module_args("serviceBus", "servicebus", **{"resourceToken": "tok", **overrides})
    assert args is not None
    parsed = bicep("modules/servicebus.bicep")
    scope = file_scope(parsed, **args)
    [namespace] = resources_of_type(parsed, SB_NAMESPACE).values()
    [rules] = resources_of_type(parsed, f"{SB_NAMESPACE}/networkRuleSets").values()
    assert body(rules)["parent"] == "namespace" and body(rules)["name"] == "default"
    deployed_rules = evaluate(body(rules)["properties"], scope) if deployed(rules, scope) else None
    return evaluate(body(namespace), scope), deployed_rules


def network_targets(transport: str, **overrides: Any) -> tuple[Scope, list[Scope]]:
    """network.bicep's scope as main.bicep deploys it, and the scope of each loop iteration."""
    args = module_args("network", transport, **{**ISOLATED, **overrides})
    assert args is not None, "the network module is deployed with networkIsolation"
    parsed = bicep("modules/network.bicep")
    scope = file_scope(parsed, **NETWORK_RESOURCES, **args)
    looped = [PRIVATE_ENDPOINT, DNS_ZONE, DNS_ZONE_LINK, DNS_ZONE_GROUP]
    iterations: list[Scope] = []
    for type_ in looped:
        [resource] = resources_of_type(parsed, type_).values()
        assert "condition" not in resource["config"] or resource["config"]["condition"] is None
        loop = resource["config"]["loop_type"]["detail"]
        assert loop["array_name"] == "targets", f"{type_}: one of each per target, by index"
        if type_ == PRIVATE_ENDPOINT:
            for index, target in enumerate(scope["targets"]):
                iterations.append({**scope, loop["item_name"]: target, "i": index})
    return scope, iterations


def network_resource(type_: str) -> dict[str, Any]:
    [resource] = resources_of_type(bicep("modules/network.bicep"), type_).values()
    return body(resource)


def test_network_isolation_is_off_by_default_and_changes_nothing() -> None:
    main = bicep("main.bicep")
    assert param_default(main, "networkIsolation") is False
    assert param_default(main, "allowedIpAddresses") == ""
    assert param_default(main, "serviceBusSku") == "Standard"
    for transport in ("servicebus", "storage"):
        assert not module_enabled("network", main_scope(transport))
        assert module_enabled("network", main_scope(transport, networkIsolation=True))
        account = storage_account(transport)
        assert account["publicNetworkAccess"] == "Enabled"
        assert account["networkAcls"] == {"bypass": "AzureServices", "defaultAction": "Allow"}
        assert (module_args("functionApp", transport) or {})["virtualNetworkSubnetId"] == ""
    namespace, rules = service_bus()
    assert namespace["name"] == "sb-sas-tok"
    assert namespace["sku"] == {"name": "Standard", "tier": "Standard"}
    assert namespace["properties"]["publicNetworkAccess"] == "Enabled"
    assert rules is None, "a Standard namespace gets no network rule set"
    functionapp = bicep("modules/functionapp.bicep")
    [site] = resources_of_type(functionapp, "Microsoft.Web/sites").values()
    subnet = body(site)["properties"]["virtualNetworkSubnetId"]
    assert evaluate(subnet, file_scope(functionapp, virtualNetworkSubnetId="")) is None
    assert evaluate(subnet, file_scope(functionapp, virtualNetworkSubnetId="s")) == "s"


def test_network_isolation_turns_public_access_off_on_storage_and_service_bus() -> None:
    for transport in ("servicebus", "storage"):
        account = storage_account(transport, **ISOLATED)
        assert account["publicNetworkAccess"] == "Disabled"
        assert account["networkAcls"]["defaultAction"] == "Deny"
        assert account["networkAcls"]["bypass"] == "AzureServices"
        assert account["networkAcls"]["ipRules"] == []
        assert account["allowSharedKeyAccess"] is False
    namespace, rules = service_bus(**ISOLATED)
    assert namespace["properties"]["publicNetworkAccess"] == "Disabled"
    assert namespace["properties"]["disableLocalAuth"] is True
    assert rules is not None
    assert (rules["publicNetworkAccess"], rules["defaultAction"]) == ("Disabled", "Deny")
    assert rules["ipRules"] == [] and rules["trustedServiceAccessEnabled"] is False


def test_allowed_ip_addresses_open_the_firewalls_to_those_addresses_only() -> None:
    """The operator CLI reads the table and the queues from the operator's machine."""
    allowed = {**ISOLATED, "allowedIpAddresses": " 203.0.113.7/32, 198.51.100.0/24,"}
    account = storage_account("servicebus", **allowed)
    assert account["publicNetworkAccess"] == "Enabled"
    assert account["networkAcls"]["defaultAction"] == "Deny"
    assert account["networkAcls"]["ipRules"] == [
        {"value": "203.0.113.7", "action": "Allow"},  # storage takes no /32
        {"value": "198.51.100.0/24", "action": "Allow"},
    ]
    namespace, rules = service_bus(**allowed)
    assert namespace["properties"]["publicNetworkAccess"] == "Enabled"
    assert rules is not None and rules["defaultAction"] == "Deny"
    assert rules["ipRules"] == [
        {"ipMask": "203.0.113.7/32", "action": "Allow"},
        {"ipMask": "198.51.100.0/24", "action": "Allow"},
    ]
    # Without isolation the list opens nothing and closes nothing.
    assert storage_account("servicebus", allowedIpAddresses="203.0.113.7")["networkAcls"] == {
        "bypass": "AzureServices",
        "defaultAction": "Allow",
    }


def test_service_bus_is_premium_under_network_isolation() -> None:
    """Standard namespaces have no private endpoints; a namespace keeps its tier, so Premium
    is a namespace of its own."""
    namespace, _ = service_bus(**ISOLATED)
    assert namespace["sku"] == {"name": "Premium", "tier": "Premium", "capacity": 1}
    assert namespace["name"] == "sbp-sas-tok"
    namespace, _ = service_bus(**ISOLATED, serviceBusMessagingUnits=4)
    assert namespace["sku"]["capacity"] == 4
    namespace, rules = service_bus(serviceBusSku="Premium")
    assert namespace["sku"]["name"] == "Premium"
    assert namespace["properties"]["publicNetworkAccess"] == "Enabled"
    assert rules is not None and (rules["defaultAction"], rules["ipRules"]) == ("Allow", [])
    main = bicep("main.bicep")
    assert decorator(main, "serviceBusSku", "allowed") == ["Standard", "Premium"]
    assert decorator(main, "serviceBusMessagingUnits", "allowed") == [1, 2, 4, 8, 16]
    assert (module_args("serviceBus", "servicebus", **ISOLATED) or {})["sku"] == "Premium"


def test_network_isolation_adds_private_endpoints_with_their_dns_zones() -> None:
    for transport, services in [
        ("servicebus", ["blob", "queue", "table", "namespace"]),
        ("storage", ["blob", "queue", "table"]),
    ]:
        _, iterations = network_targets(transport)
        targets = [iteration["target"] for iteration in iterations]
        assert [target["groupId"] for target in targets] == services, transport
        assert [target["zone"] for target in targets] == [PRIVATE_DNS_ZONES[s] for s in services]
        expected_ids = {"namespace": "servicebus-id"}
        for target in targets:
            assert target["serviceId"] == expected_ids.get(target["groupId"], "storage-id")
            assert len(target["name"]) <= 64 and "_" not in target["name"]
        endpoint = network_resource(PRIVATE_ENDPOINT)
        zone = network_resource(DNS_ZONE)
        group = network_resource(DNS_ZONE_GROUP)
        for iteration in iterations:
            properties = evaluate(endpoint["properties"], iteration)
            assert properties["subnet"]["id"] == "${vnet.id}/subnets/snet-private-endpoints"
            [connection] = properties["privateLinkServiceConnections"]
            assert connection["properties"] == {
                "privateLinkServiceId": iteration["target"]["serviceId"],
                "groupIds": [iteration["target"]["groupId"]],
            }
            assert evaluate(zone["name"], iteration) == iteration["target"]["zone"]
        assert zone["location"] == "global"
        assert dotted(group["parent"]["operator"]["operands"]["operand_1"]) == "privateEndpoints"
        [config] = group["properties"]["privateDnsZoneConfigs"]
        zone_id = config["properties"]["privateDnsZoneId"]["operator"]["operands"]
        assert zone_id["operand_2"] == "id"
        assert zone_id["operand_1"]["operator"]["operands"] == {
            "operand_1": "privateDnsZones",
            "operand_2": "i",
        }
    link = network_resource(DNS_ZONE_LINK)
    assert link["parent"]["operator"]["operands"]["operand_1"] == "privateDnsZones"
    assert link["properties"]["registrationEnabled"] is False
    assert dotted(link["properties"]["virtualNetwork"]["id"]) == "vnet.id"
    args = module_args("network", "servicebus", **ISOLATED) or {}
    assert (args["storageAccountName"], args["serviceBusNamespaceName"]) == ("st", "sb")


def test_the_app_is_integrated_into_a_subnet_delegated_as_flex_consumption_requires() -> None:
    scope, _ = network_targets("servicebus")
    vnet = evaluate(network_resource(VNET)["properties"], scope)
    [space] = vnet["addressSpace"]["addressPrefixes"]
    subnets = {subnet["name"]: subnet["properties"] for subnet in vnet["subnets"]}
    delegated = [
        name
        for name, subnet in subnets.items()
        if [d["properties"]["serviceName"] for d in subnet.get("delegations", [])]
        == [FLEX_SUBNET_DELEGATION]
    ]
    assert delegated == [scope["appSubnetName"]], "one subnet, delegated to Microsoft.App"
    assert all("_" not in name for name in subnets), "Flex Consumption refuses _ in a subnet name"
    assert subnets[scope["privateEndpointSubnetName"]]["privateEndpointNetworkPolicies"] == (
        "Disabled"
    )
    prefixes = [ipaddress.IPv4Network(subnet["addressPrefix"]) for subnet in subnets.values()]
    assert all(prefix.subnet_of(ipaddress.IPv4Network(space)) for prefix in prefixes)
    assert not prefixes[0].overlaps(prefixes[1])
    outputs = bicep("modules/network.bicep")["outputs"]
    assert outputs["appSubnetId"]["value"] == "${vnet.id}/subnets/${appSubnetName}"
    # main.bicep hands that subnet to the app, which waits for the network module through it.
    subnet_arg = module_params("functionApp")["virtualNetworkSubnetId"]["operator"]["operands"]
    assert subnet_arg["condition"] == "networkIsolation"
    assert dotted(subnet_arg["true_value"]) == "network.outputs.appSubnetId"
    isolated = module_args("functionApp", "servicebus", networkIsolation=True) or {}
    assert isolated["virtualNetworkSubnetId"] == "app-subnet-id"


def test_network_isolation_parameters_are_set_through_azd_and_documented() -> None:
    parameters = json.loads(text("main.parameters.json"))["parameters"]
    readme = (INFRA / "README.md").read_text()
    for name, value in NETWORK_ISOLATION_PARAMETERS.items():
        assert parameters[name] == {"value": value}, name
        variable = value.removeprefix("${").split("=")[0]
        assert f"`{variable}`" in readme, f"{variable} is not in infra/README.md"
    for page in ("private-link", "dns", "service-bus"):
        assert f"https://azure.microsoft.com/pricing/details/{page}/" in readme, page


# --- Application Insights sampling keeps the operator alert -------------------------------------


def test_application_insights_sampling_never_drops_the_operator_alert() -> None:
    """The operator alert is an ERROR log, i.e. a Trace: sampling must leave traces alone."""
    host = json.loads((ROOT / "host.json").read_text())
    logging_config = host["logging"]
    sampling = logging_config.get("applicationInsights", {}).get("samplingSettings", {})

    if sampling.get("isEnabled", True):
        excluded = {kind.strip().lower() for kind in sampling.get("excludedTypes", "").split(";")}
        included = {kind.strip().lower() for kind in sampling.get("includedTypes", "").split(";")}
        assert "trace" in excluded, "Trace telemetry (the operator alert) would be sampled"
        assert "trace" not in included
    levels = logging_config["logLevel"]
    for category in ("default", "Function"):
        assert levels.get(category, "Information") not in ("Critical", "None"), category
    sources = "\n".join(path.read_text() for path in sorted((ROOT / "sas").rglob("*.py")))
    assert re.search(rf'log\.error\(\s*"{re.escape(OPERATOR_ALERT_EVENT)}\b', sources), (
        "the operator alert is no longer logged at ERROR as sas.operator_alert"
    )


# --- alert rules and diagnostic settings -------------------------------------------------------


def alerts_scope(transport: str, **overrides: Any) -> Scope:
    args = module_args("alerts", transport, **overrides)
    assert args is not None, "the alerts module is deployed on every transport"
    return file_scope(bicep("modules/alerts.bicep"), **{"namePrefix": "sas-test", **args})


def deployed(resource: Mapping[str, Any], scope: Scope) -> bool:
    condition = resource["config"].get("condition")
    return condition is None or bool(evaluate(condition, scope))


def metric_alert(metric: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resource, criterion) of the one metric alert on ``metric``."""
    found = [
        (resource, criterion)
        for resource in resources_of_type(bicep("modules/alerts.bicep"), METRIC_ALERT).values()
        for criterion in body(resource)["properties"]["criteria"]["allOf"]
        if criterion["metricName"] == metric
    ]
    assert len(found) == 1, f"expected one metric alert on {metric}, found {len(found)}"
    return found[0]


def test_operator_alert_log_rule_queries_the_event_in_application_insights() -> None:
    parsed = bicep("modules/alerts.bicep")
    rules = [
        rule
        for rule in resources_of_type(parsed, LOG_ALERT).values()
        if OPERATOR_ALERT_EVENT in json.dumps(body(rule)["properties"]["criteria"])
    ]
    assert len(rules) == 1, "one log alert rule on the operator-alert event"
    [rule] = rules
    properties = body(rule)["properties"]
    [criterion] = properties["criteria"]["allOf"]

    for transport in ("servicebus", "storage"):
        scope = alerts_scope(transport)
        assert deployed(rule, scope), transport
        assert scope["applicationInsightsName"] == "appi"  # main passes monitoring's component
    assert criterion["query"] == f'traces | where message has "{OPERATOR_ALERT_EVENT}"'
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
    assert criterion["timeAggregation"] == "Count"
    assert properties["enabled"] is True
    assert [dotted(s) for s in properties["scopes"]] == ["applicationInsights.id"]
    [insights] = resources_of_type(parsed, "Microsoft.Insights/components").values()
    assert insights["existing"] and body(insights)["name"] == "applicationInsightsName"
    assert [dotted(a) for a in properties["actions"]["actionGroups"]] == ["actionGroup.id"]


def test_dead_letter_metric_alert_watches_every_app_queue_on_service_bus() -> None:
    resource, criterion = metric_alert("DeadletteredMessages")
    properties = body(resource)["properties"]
    servicebus, storage = alerts_scope("servicebus"), alerts_scope("storage")

    assert deployed(resource, servicebus)
    assert not deployed(resource, storage)
    assert criterion["metricNamespace"] == SB_NAMESPACE
    assert [dotted(s) for s in properties["scopes"]] == ["serviceBus.id"]
    [namespace] = resources_of_type(bicep("modules/alerts.bicep"), SB_NAMESPACE).values()
    assert body(namespace)["name"] == "serviceBusNamespaceName"
    assert servicebus["serviceBusNamespaceName"] == "sb"
    [dimension] = criterion["dimensions"]
    assert (dimension["name"], dimension["operator"]) == ("EntityName", "Include")
    assert sorted(evaluate(dimension["values"], servicebus)) == sorted(
        settings.DEFAULT_QUEUES.values()
    )
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
    assert [dotted(a["actionGroupId"]) for a in properties["actions"]] == ["actionGroup.id"]


def test_alerts_queue_depth_metric_alert_on_service_bus() -> None:
    resource, criterion = metric_alert("ActiveMessages")
    properties = body(resource)["properties"]
    servicebus, storage = alerts_scope("servicebus"), alerts_scope("storage")

    assert deployed(resource, servicebus)
    assert not deployed(resource, storage)
    assert criterion["metricNamespace"] == SB_NAMESPACE
    assert [dotted(s) for s in properties["scopes"]] == ["serviceBus.id"]
    [dimension] = criterion["dimensions"]
    assert (dimension["name"], dimension["operator"]) == ("EntityName", "Include")
    assert evaluate(dimension["values"], servicebus) == [ALERTS_QUEUE]
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
    assert [dotted(a["actionGroupId"]) for a in properties["actions"]] == ["actionGroup.id"]


def test_storage_transport_alerts_from_the_queue_logs() -> None:
    """No per-queue depth metric on Storage Queues: log alerts on StorageQueueLogs instead."""
    parsed = bicep("modules/alerts.bicep")
    servicebus, storage = alerts_scope("servicebus"), alerts_scope("storage")
    rules = [
        rule
        for rule in resources_of_type(parsed, LOG_ALERT).values()
        if "StorageQueueLogs" in json.dumps(body(rule)["properties"]["criteria"])
    ]

    queries = []
    for rule in rules:
        assert deployed(rule, storage)
        assert not deployed(rule, servicebus)
        properties = body(rule)["properties"]
        assert [dotted(s) for s in properties["scopes"]] == ["logAnalytics.id"]
        assert [dotted(a) for a in properties["actions"]["actionGroups"]] == ["actionGroup.id"]
        [criterion] = properties["criteria"]["allOf"]
        assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
        queries.append(evaluate(criterion["query"], storage))
    assert any(f'| where Queue == "{ALERTS_QUEUE}"' in query for query in queries), queries
    assert any('| where Queue endswith "-poison"' in query for query in queries), queries
    [workspace] = resources_of_type(parsed, "Microsoft.OperationalInsights/workspaces").values()
    assert workspace["existing"] and body(workspace)["name"] == "logAnalyticsName"
    assert storage["logAnalyticsName"] == "log"


def test_action_group_has_the_optional_operator_email() -> None:
    parsed = bicep("modules/alerts.bicep")
    [group] = resources_of_type(parsed, ACTION_GROUP).values()
    receivers = body(group)["properties"]["emailReceivers"]

    assert param_default(bicep("main.bicep"), "alertEmail") == ""
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert parameters["alertEmail"]["value"] == "${SAS_ALERT_EMAIL}"
    assert evaluate(receivers, alerts_scope("servicebus")) == []
    [receiver] = evaluate(receivers, alerts_scope("servicebus", alertEmail="ops@example.com"))
    assert receiver["emailAddress"] == "ops@example.com"
    assert "condition" not in group["config"]


def diagnostics_scope(transport: str, **overrides: Any) -> Scope:
    args = module_args("diagnostics", transport, **overrides)
    assert args is not None
    return file_scope(bicep("modules/diagnostics.bicep"), **args)


def test_diagnostic_settings_send_the_app_namespace_and_storage_to_the_workspace() -> None:
    parsed = bicep("modules/diagnostics.bicep")
    diagnostic = resources_of_type(parsed, DIAGNOSTIC_SETTINGS)
    expected = {
        "Microsoft.Web/sites": "func",
        SB_NAMESPACE: "sb",
        STORAGE_ACCOUNT: "st",
        f"{STORAGE_ACCOUNT}/blobServices": "default",
        f"{STORAGE_ACCOUNT}/queueServices": "default",
        f"{STORAGE_ACCOUNT}/tableServices": "default",
    }

    for transport in ("servicebus", "storage"):
        scope = diagnostics_scope(transport)
        assert scope["logAnalyticsId"] == "log-id"  # monitoring.outputs.logAnalyticsId
        targets: dict[str, str] = {}
        for name, resource in diagnostic.items():
            if not deployed(resource, scope):
                continue
            config = body(resource)
            target_type, target_name = assignment_target(parsed, config["scope"], scope)
            targets[target_type] = target_name
            properties = config["properties"]
            assert properties["workspaceId"] == "logAnalyticsId", name
            streams = evaluate(properties.get("logs", []), scope) + evaluate(
                properties.get("metrics", []), scope
            )
            assert streams and all(stream["enabled"] is True for stream in streams), name
            if target_type != STORAGE_ACCOUNT:
                assert evaluate(properties.get("logs", []), scope), f"{name}: no logs"
        wanted = dict(expected)
        if transport == "storage":
            del wanted[SB_NAMESPACE]
        assert targets == wanted, transport
    for service in ("blobServices", "queueServices", "tableServices"):
        [existing] = resources_of_type(parsed, f"{STORAGE_ACCOUNT}/{service}").values()
        assert body(existing)["parent"] == "storage"


def storage_log_streams(**overrides: Any) -> dict[str, Any]:
    """Each storage service's log streams as main.bicep deploys them."""
    parsed = bicep("modules/diagnostics.bicep")
    scope = diagnostics_scope("storage", **overrides)
    found = {}
    for resource in resources_of_type(parsed, DIAGNOSTIC_SETTINGS).values():
        config = body(resource)
        target, _ = assignment_target(parsed, config["scope"], scope)
        if target.startswith(f"{STORAGE_ACCOUNT}/"):
            found[target.rsplit("/", 1)[1]] = evaluate(config["properties"]["logs"], scope)
    return found


def test_storage_request_logs_are_sized_for_cost_by_default_and_all_on_request() -> None:
    def categories(streams: list[dict[str, Any]]) -> list[str]:
        return [stream.get("category") or stream["categoryGroup"] for stream in streams]

    default = {service: categories(s) for service, s in storage_log_streams().items()}
    assert default == {
        "blobServices": ["StorageDelete"],
        "queueServices": ["StorageWrite"],  # PutMessage: what the storage alert rules read
        "tableServices": ["StorageDelete"],
    }
    everything = storage_log_streams(storageLogs="all")
    assert {service: categories(s) for service, s in everything.items()} == {
        service: ["allLogs"] for service in default
    }
    alerts = text("modules/alerts.bicep")
    assert 'StorageQueueLogs | where OperationName == "PutMessage"' in alerts
    assert json.loads(text("main.parameters.json"))["parameters"]["storageLogs"] == {
        "value": "${SAS_STORAGE_LOGS=essential}"
    }


# --- no basic-auth publishing; Log Analytics without local auth ----------------------------------


def test_basic_publishing_credentials_are_off() -> None:
    parsed = bicep("modules/functionapp.bicep")
    policies = resources_of_type(parsed, "Microsoft.Web/sites/basicPublishingCredentialsPolicies")

    assert sorted(body(policy)["name"] for policy in policies.values()) == ["ftp", "scm"]
    for policy in policies.values():
        assert "condition" not in policy["config"]
        assert body(policy)["parent"] == "functionApp"
        assert body(policy)["properties"] == {"allow": False}
    assert resources_of_type(parsed, "Microsoft.Web/sites")["functionApp"]["existing"] is False


def test_log_analytics_workspace_disables_local_auth() -> None:
    parsed = bicep("modules/monitoring.bicep")
    [workspace] = resources_of_type(parsed, "Microsoft.OperationalInsights/workspaces").values()

    assert body(workspace)["properties"]["features"]["disableLocalAuth"] is True


# --- budgets: send timeout and the comments of the infra ---------------------------------------

BUDGET_MENTION = re.compile(r"(complete-by|pickup)? ?budgets?\b[^()\n]{0,60}\((\d+) ?(s|min)\b")


def test_service_bus_send_timeout_is_below_the_shortest_step_budget() -> None:
    from sas.adapters import servicebus

    shortest = min(step.budget for w in registry().workflows for step in w.steps)
    default = inspect.signature(servicebus.ServiceBusTransport).parameters["send_timeout"].default

    assert shortest.total_seconds() > servicebus.DEFAULT_SEND_TIMEOUT
    assert default == servicebus.DEFAULT_SEND_TIMEOUT


def test_infra_comments_state_the_budgets_of_the_code() -> None:
    step_budgets = {step.budget for w in registry().workflows for step in w.steps}
    pickup_budgets = {w.pickup_budget for w in registry().workflows}
    texts = all_infra_text() + "\n" + (INFRA / "README.md").read_text()

    mentions = BUDGET_MENTION.findall(texts)

    for kind, number, unit in mentions:
        value = timedelta(seconds=int(number)) if unit == "s" else timedelta(minutes=int(number))
        expected = {
            "complete-by": step_budgets,
            "pickup": pickup_budgets,
            "": step_budgets | pickup_budgets,
        }[kind]
        assert value in expected, f"infra says a {kind or 'step'} budget is {number} {unit}"
    assert {"complete-by", "pickup"} <= {kind for kind, _, _ in mentions}


# --- the runtime lock Azure's remote build installs --------------------------------------------

DEV_ONLY = {"pytest", "pytest-timeout", "ruff", "mypy", "uvicorn", "rich", "pip-tools"}
DEV_ONLY |= {"pycep-parser", "croniter"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """Package -> (pinned version, hashes) of a requirements file; every line must pin."""
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in path.read_text().replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        tokens = line.split()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", tokens[0])
        assert match, f"{path.name}: not an exact pin: {line}"
        hashes = [t.removeprefix("--hash=") for t in tokens[1:] if t.startswith("--hash=")]
        entries[canonical(match[1])] = (match[2], hashes)
    return entries


def test_the_runtime_lock_is_complete_pinned_and_hashed() -> None:
    lock = requirement_pins(ROOT / "requirements.txt")
    top = requirement_pins(ROOT / "requirements.in")

    assert lock
    for name, (_, hashes) in lock.items():
        assert hashes, f"requirements.txt: {name} has no --hash"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), name
    for name, (version, _) in top.items():
        assert name in lock, f"{name} (requirements.in) is missing from requirements.txt"
        assert lock[name][0] == version, f"{name}: {lock[name][0]} locked, {version} wanted"
    dev = requirement_pins(ROOT / "requirements-dev.txt")
    assert set(dev) >= DEV_ONLY
    assert not (DEV_ONLY | set(dev)) & set(lock), "dev-only packages in the runtime lock"


def test_the_lock_is_installed_apart_from_the_dev_tools_and_regenerated_by_make_lock() -> None:
    dev = (ROOT / "requirements-dev.txt").read_text()
    makefile = (ROOT / "Makefile").read_text()

    assert not re.search(r"^\s*-[rc]\s", dev, re.MULTILINE), "pip would demand hashes there"
    recipe = makefile.split("$(VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    runtime = recipe.index("-r requirements.txt")
    assert runtime < recipe.index("-r requirements-dev.txt")
    lock = re.search(r"^lock:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert lock, "no lock target in the Makefile"
    for flag in ("pip-compile", "--generate-hashes", "-o requirements.txt", "requirements.in"):
        assert flag in lock.group(1), flag
    assert re.search(r"^\.PHONY:.*\block\b", makefile, re.MULTILINE)


# --- identity-based connections name their managed identity ------------------------------------


def identity_connection_settings() -> list[tuple[str, dict[str, Any]]]:
    main = bicep("main.bicep")["variables"]
    host = bicep("modules/functionapp.bicep")["variables"]
    servicebus = main["serviceBusSettings"]["value"]["operator"]["operands"]["true_value"]
    return [
        ("main.bicep sasSettings", main["sasSettings"]["value"]),
        ("main.bicep serviceBusSettings", servicebus),
        ("functionapp.bicep hostSettings", host["hostSettings"]["value"]),
    ]


def test_every_identity_based_connection_sets_managed_identity_with_its_client_id() -> None:
    """Managed identity only where <Conn>__credential says so: the Bicep says so everywhere."""
    connections: set[str] = set()
    for where, values in identity_connection_settings():
        for connection in {key.split("__")[0] for key in values if "__" in key}:
            assert values.get(f"{connection}__credential") == "managedidentity", (where, connection)
            client_id = values.get(f"{connection}__clientId")
            assert client_id is not None, (where, connection)
            assert dotted(client_id) in {"identity.outputs.clientId", "identityClientId"}
            connections.add(connection)

    assert connections == {
        settings.STORAGE_CONNECTION,
        settings.SERVICEBUS_CONNECTION,
        "AzureWebJobsStorage",
    }
    assert dotted(module_params("functionApp")["identityClientId"]) == "identity.outputs.clientId"


# --- azd wiring --------------------------------------------------------------------------------


def test_parameters_file_covers_the_required_parameters() -> None:
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    declared = bicep("main.bicep")["parameters"]

    assert set(parameters) <= set(declared), set(parameters) - set(declared)
    required = {name for name, param in declared.items() if "default" not in param}
    assert required <= set(parameters), required - set(parameters)
    assert parameters["environmentName"]["value"] == "${AZURE_ENV_NAME}"
    assert parameters["location"]["value"] == "${AZURE_LOCATION}"
    assert parameters["principalId"]["value"] == "${AZURE_PRINCIPAL_ID}"
    for agent in HTTP_AGENTS:
        assert infra.param_name(agent, "Url") in declared


def test_the_generated_infra_follows_the_declared_workflows() -> None:
    assert infra.stale() == [], "run `make infra`"


def test_a_declaration_the_infra_does_not_match_is_found_stale(monkeypatch) -> None:
    mail = StepDefinition("notify", "mail", "send", timedelta(seconds=5))
    provision = StepDefinition("provision", "vm", "create", timedelta(seconds=5))
    create = {"create": lambda context, data: None}
    declared = Registry(
        (ORDER_WORKFLOW, Workflow("setup", (provision, mail))),
        python_agents=(
            PythonAgent("vm", create, tables=("machines",), settings={"VM_SIZE": "small"}),
        ),
    )
    monkeypatch.setattr(infra, "registry", lambda: declared)

    assert infra.stale() == [
        "main.bicep",
        "main.parameters.json",
        "local.settings.example.json",
        "workflows.lock.json",
    ]
    bicep_text = infra.bicep_text(text("main.bicep"))
    assert "'agent-vm'" in bicep_text and "'agent-mail'" in bicep_text
    assert "'agent-cloud'" not in bicep_text  # the workspace's agents, not declared here
    assert "  'machines'\n" in bicep_text and "'workspaces'" not in bicep_text
    assert "param remoteMailUrl string = ''" in bicep_text
    assert "module remoteMail 'modules/remote-url.bicep'" in bicep_text
    assert (
        "SAS_REMOTE_MAIL_URL: ('parameter' == remoteMail.outputs.source) ? remoteMailUrl : "
        "'${simulatorUrl}/mail'" in bicep_text
    )
    assert "remoteVm" not in bicep_text  # a Python agent calls no remote service
    owned = infra.generated_parameters(text("main.bicep"))
    parameters = json.loads(infra.parameters_text(text("main.parameters.json"), owned))
    assert parameters["parameters"]["remoteMailUrl"] == {"value": "${SAS_REMOTE_MAIL_URL=}"}
    assert "remoteVmUrl" not in parameters["parameters"]
    local_text = infra.local_settings_text(
        LOCAL_SETTINGS_EXAMPLE.read_text(), infra.generated_settings(text("main.bicep"))
    )
    local = json.loads(local_text)["Values"]
    assert local["SAS_REMOTE_MAIL_URL"] == "http://127.0.0.1:7081/mail"
    assert "SAS_REMOTE_VM_URL" not in local
    assert local["VM_SIZE"] == "small"
    assert "WORKSPACE_DOMAIN" not in local  # the workspace's, not declared here
    assert "param settingVmSize string" in bicep_text and "VM_SIZE: settingVmSize" in bicep_text
    assert parameters["parameters"]["settingVmSize"] == {"value": "${VM_SIZE}"}
    assert "settingWorkspaceDomain" not in parameters["parameters"]


def test_make_infra_refuses_an_app_table_named_like_sas_s_own(monkeypatch) -> None:
    make = {"make": lambda context, data: None}
    step = StepDefinition("make", "maker", "make", timedelta(seconds=5))
    declared = Registry(
        (Workflow("making", (step,)),),
        python_agents=(PythonAgent("maker", make, tables=("SasOrdersLive",)),),
    )
    monkeypatch.setattr(infra, "registry", lambda: declared)
    with pytest.raises(ValueError, match="'SasOrdersLive': sas's own"):
        infra.rewritten()


def test_make_infra_keeps_what_it_does_not_own_and_refuses_a_doubled_region() -> None:
    bicep = text("main.bicep")
    mine = json.loads(text("main.parameters.json"))
    mine["parameters"]["remoteVaultUrl"] = {"value": "${VAULT_URL}"}  # the user's own
    kept = json.loads(infra.parameters_text(json.dumps(mine), infra.generated_parameters(bicep)))
    assert kept["parameters"]["remoteVaultUrl"] == {"value": "${VAULT_URL}"}
    assert list(kept["parameters"]) == list(mine["parameters"])  # nothing moved
    region = re.search(
        r"// generated: agent queues \(make infra\)\n.*?// end generated: agent queues\n",
        bicep,
        re.DOTALL,
    )
    assert region is not None
    doubled = bicep.replace(region.group(0), region.group(0) * 2)
    with pytest.raises(ValueError, match="must be there once"):
        infra.bicep_text(doubled)


def test_azure_yaml_deploys_the_python_function_app() -> None:
    azure_yaml = (ROOT / "azure.yaml").read_text()

    assert re.search(r"^services:\n  api:\n", azure_yaml, re.MULTILINE)
    assert re.search(r'^requiredVersions:\n  azd: ">= 1\.23\.4"$', azure_yaml, re.MULTILINE)
    for line in ("project: .", "language: python", "host: function"):
        assert re.search(rf"^    {re.escape(line)}$", azure_yaml, re.MULTILINE), line
    tags = text("modules/functionapp.bicep")
    assert "'azd-service-name': serviceName" in tags
    assert module_params("functionApp")["serviceName"] == "api"


# --- the simulator as a second app (deploySimulator) -----------------------------------------


def simulator_module(name: str) -> dict[str, Any]:
    return dict(bicep("modules/simulator.bicep")["modules"][name]["config"]["params"])


def test_azure_yaml_deploys_the_simulator_only_when_asked() -> None:
    azure_yaml = (ROOT / "azure.yaml").read_text()
    service = azure_yaml.split("\n  simulator:\n", 1)[1]

    for line in (
        "project: ./sas_local/simulator",
        "language: python",
        "host: function",
        "condition: ${SAS_DEPLOY_SIMULATOR}",  # azd >= 1.23.4: unset or false, not deployed
        "dist: build",
    ):
        assert re.search(rf"^    {re.escape(line)}$", service, re.MULTILINE), line
    assert re.search(r"^          run: python3 bundle\.py build$", service, re.MULTILINE)
    assert (ROOT / "sas_local" / "simulator" / "bundle.py").is_file()
    assert "'azd-service-name': serviceName" in text("modules/functionapp.bicep")
    assert simulator_module("functionApp")["serviceName"] == "simulator"


def test_the_simulator_is_off_by_default_and_the_urls_are_the_parameters() -> None:
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert parameters["deploySimulator"] == {"value": "${SAS_DEPLOY_SIMULATOR=false}"}
    # An object: azd parses the variable as JSON (a string would break its parameters file).
    assert parameters["simulatorFaults"] == {"value": "${SAS_SIMULATOR_FAULTS}"}
    main = bicep("main.bicep")
    assert main["parameters"]["simulatorFaults"]["type"] == "object"
    assert param_default(main, "simulatorFaults") == {}  # unset: azd leaves it out
    assert param_default(main, "deploySimulator") is False
    scope = main_scope("servicebus")

    assert not module_enabled("simulator", scope)
    assert scope["simulatorUrl"] == ""
    for agent in HTTP_AGENTS:
        assert scope[infra.url_module(agent)]["outputs"] == {"source": "parameter"}
    assert remote_urls(scope) == {a: f"https://remote/{a}" for a in HTTP_AGENTS}


def test_an_empty_url_calls_the_deployed_simulator_and_a_given_one_wins() -> None:
    scope = main_scope(
        "servicebus",
        deploySimulator=True,
        simulator={"outputs": {"uri": "https://func-sim.example"}},  # the module's output
        remoteInventoryUrl="",
        remoteShippingUrl="",
    )

    assert module_enabled("simulator", scope)
    assert scope["simulatorUrl"] == "https://func-sim.example"
    assert bicep("main.bicep")["outputs"]["SAS_SIMULATOR_URL"]["value"] == "simulatorUrl"
    sources = {agent: scope[infra.url_module(agent)]["outputs"]["source"] for agent in HTTP_AGENTS}
    urls = remote_urls(scope)  # any other agent's URL is given, as payment's is
    assert {a: sources[a] for a in ("inventory", "payment", "shipping")} == {
        "inventory": "simulator",
        "payment": "parameter",
        "shipping": "simulator",
    }
    assert {a: urls[a] for a in ("inventory", "payment", "shipping")} == {
        "inventory": "https://func-sim.example/inventory",  # the simulator's routes
        "payment": "https://remote/payment",
        "shipping": "https://func-sim.example/shipping",
    }
    assert dotted(module_params("simulator")["faults"]) == "simulatorFaults"


def test_an_empty_url_without_the_simulator_is_refused_from_parameters_alone() -> None:
    scope = main_scope("servicebus", remotePaymentUrl="")

    assert scope[infra.url_module("payment")]["outputs"]["source"] == ""
    checked = bicep("modules/remote-url.bicep")
    assert decorator(checked, "source", "allowed") == ["parameter", "simulator"]  # "" refused
    assert checked["outputs"]["source"]["value"] == "source"
    # The check reads parameters only (ARM can refuse it when it validates, before anything
    # is created) and the app's setting reads its output (the app waits for it).
    for agent in HTTP_AGENTS:
        params = module_params(infra.url_module(agent))
        assert set(params) == {"source"}
        text_of = json.dumps(params["source"], default=str)
        assert "outputs" not in text_of and "simulatorUrl" not in text_of
        setting = bicep("main.bicep")["variables"]["sasSettings"]["value"][
            settings.remote_url_setting(agent)
        ]
        without = {k: v for k, v in scope.items() if k != infra.url_module(agent)}
        with pytest.raises(Unevaluable, match=infra.url_module(agent)):
            evaluate(setting, without)


def test_endpoints_are_arrays_that_reach_the_app_as_json() -> None:
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    main = bicep("main.bicep")
    endpoints = [{"name": "west", "url": "https://west.example/inventory", "capacity": 8}]
    scope = main_scope("servicebus", remoteInventoryEndpoints=endpoints)

    for agent in HTTP_AGENTS:
        name = infra.param_name(agent, "Endpoints")
        assert main["parameters"][name]["type"] == "array"
        assert param_default(main, name) == []
        # `=[]`: unset or set empty, azd passes [] (it cannot parse "" as JSON)
        assert parameters[name] == {"value": f"${{SAS_REMOTE_{agent.upper()}_ENDPOINTS=[]}}"}
    changed = scope["changedSettings"]
    assert json.loads(changed["SAS_REMOTE_INVENTORY_ENDPOINTS"]) == endpoints
    assert "SAS_REMOTE_PAYMENT_ENDPOINTS" not in changed  # empty: the one URL
    loaded = settings.load(
        {
            **dict.fromkeys(map(settings.remote_url_setting, HTTP_AGENTS), "https://remote/x"),
            "SasStorage": "UseDevelopmentStorage=true",
            "SAS_TRANSPORT": "storage",
            "SAS_REMOTE_INVENTORY_ENDPOINTS": changed["SAS_REMOTE_INVENTORY_ENDPOINTS"],
        }
    )
    [west] = loaded.endpoints_of("inventory")
    assert (west.url, west.capacity) == ("https://west.example/inventory", 8)


def test_the_simulator_is_a_stranger_to_sas_with_one_instance() -> None:
    # It gets nothing of sas's but the telemetry resource's name: no table, queue or identity.
    assert set(module_params("simulator")) == {
        "location",
        "tags",
        "resourceToken",
        "applicationInsightsName",
        "faults",
    }
    parsed = bicep("modules/simulator.bicep")
    scope = file_scope(parsed, resourceToken="tok", location="x", applicationInsightsName="ai")
    assert evaluate(simulator_module("identity")["name"], scope) == "id-sim-tok"
    roles = simulator_module("roles")
    assert dotted(roles["storageAccountName"]) == "storage.name"  # its own account
    assert not {"serviceBusNamespaceName", "triggerQueueNames", "readQueueNames"} & set(roles)
    assert "storageQueues" not in roles
    app = simulator_module("functionApp")
    assert app["maximumInstanceCount"] == 1  # its ledger is in memory
    assert app["httpPerInstanceConcurrency"] > 1
    assert set(app["appSettings"]) == {simulator_faults_setting()}
    faults = app["appSettings"][simulator_faults_setting()]
    assert evaluate(faults, {**scope, "faults": {}}) == ""
    assert json.loads(evaluate(faults, {**scope, "faults": {"transient_rate": 0.1}})) == {
        "transient_rate": 0.1
    }
    # Its telemetry goes to sas's Application Insights: the one thing of sas's it touches.
    assert dotted(roles["applicationInsightsName"]) == "applicationInsightsName"
    [account] = resources_of_type(parsed, STORAGE_ACCOUNT).values()
    assert evaluate(body(account)["name"], scope) == "stsimtok"
    properties = body(account)["properties"]
    assert properties["allowSharedKeyAccess"] is False
    assert properties["allowBlobPublicAccess"] is False
    assert properties["minimumTlsVersion"] == "TLS1_2"


def simulator_faults_setting() -> str:
    from sas_local.simulator.azure_app import FAULTS_SETTING

    return FAULTS_SETTING


# --- (e) local.settings.example.json has every setting too ------------------------------------


def test_local_settings_example_sets_what_a_local_run_needs_and_only_settings_the_code_reads() -> (
    None
):
    values: dict[str, str] = json.loads(LOCAL_SETTINGS_EXAMPLE.read_text())["Values"]

    own = {key: value for key, value in values.items() if key not in registry().settings}
    assert set(own) <= SAS_KEYS | {settings.STORAGE_CONNECTION, *HOST_LOCAL_KEYS}
    assert values.get("FUNCTIONS_WORKER_RUNTIME") == "python"
    assert "AzureWebJobsStorage" in values
    assert settings.transport_from(values) == "storage"
    assert settings.STORAGE_CONNECTION in values
    assert len(own) <= 15, sorted(own)
    settings.load(values)  # and they resolve
    # The Python agents' settings, each at the local value its declaration gives.
    assert {key: values[key] for key in registry().settings} == registry().settings

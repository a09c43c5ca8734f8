"""The infrastructure agrees with the code: settings, queues, table, roles, no keys.

Reads the Bicep through pycep-parser's JSON and evaluates the few simple expressions the
infra uses to derive queue names (map, items, concat, ternaries), so the check follows the
values rather than the spelling. An expression it cannot evaluate fails loudly: extend
``evaluate`` rather than weakening a check.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pycep import BicepParser
from pycep.models import BicepElement

from sas import settings
from sas.domain.workflow import AGENTS, WORKFLOWS

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
    *settings.DEFAULT_QUEUES,
    settings.TRANSPORT,
    settings.TABLE_NAME,
    *(settings.remote_url_setting(agent) for agent in AGENTS),
    SUPERVISOR_SCHEDULE,
    MAX_FAILURES,
}
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
REQUIRED_ROLES = {
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Azure Service Bus Data Sender",
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Azure Service Bus Data Receiver",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
}
FORBIDDEN_ROLES = {
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9": "User Access Administrator",
    "f58310d9-a9f6-439a-9e8d-f62e7b41a168": "Role Based Access Control Administrator",
    "090c5cfd-751d-490a-894a-3ce6f1109419": "Azure Service Bus Data Owner",
}
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
            return _call(expr["function"]["type"], expr["function"]["parameters"], scope)
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
        "union": lambda *objs: {k: v for obj in objs for k, v in obj.items()},
        "empty": lambda value: not value,
        "string": str,
    }
    if name not in functions:
        raise Unevaluable(name)
    return functions[name](*args)


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


def main_scope(transport: str) -> Scope:
    return file_scope(
        bicep("main.bicep"),
        environmentName="test",
        location="swedencentral",
        transport=transport,
        remoteInventoryUrl="https://remote/inventory",
        remotePaymentUrl="https://remote/payment",
        remoteShippingUrl="https://remote/shipping",
    )


def module_enabled(module: str, scope: Scope) -> bool:
    config = bicep("main.bicep")["modules"][module]["config"]
    return "condition" not in config or bool(evaluate(config["condition"], scope))


def provisioned_queues(transport: str) -> tuple[list[str], list[str]]:
    """(Service Bus queues, storage queues) that main.bicep provisions for a transport."""
    scope = main_scope(transport)
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

    assert scope["queueSettings"] == settings.DEFAULT_QUEUES
    assert param_default(parsed, "tableName") == settings.DEFAULT_TABLE
    assert param_default(parsed, "transport") == "servicebus"
    assert decorator(parsed, "transport", "allowed") == ["servicebus", "storage"]
    assert param_default(parsed, "supervisorSchedule") == "*/15 * * * * *"
    assert param_default(parsed, "maxFailures") == 3
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
    for var in ("queueSettings", "sasSettings"):
        for key, value in bicep("main.bicep")["variables"][var]["value"].items():
            env[key] = endpoints.get(key) or str(evaluate(value, scope))
    operands = bicep("main.bicep")["variables"]["serviceBusSettings"]["value"]["operator"]
    for key, value in operands["operands"]["true_value"].items():
        env[key] = endpoints.get(key) or str(evaluate(value, scope))

    loaded = settings.load(env)

    assert loaded.transport == "servicebus"
    assert loaded.storage.uses_identity
    assert loaded.servicebus is not None and loaded.servicebus.uses_identity


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


def test_the_orders_table_and_deployment_container_are_provisioned() -> None:
    parsed = bicep("modules/storage.bicep")
    [table] = resources_of_type(
        parsed, "Microsoft.Storage/storageAccounts/tableServices/tables"
    ).values()
    [container] = resources_of_type(
        parsed, "Microsoft.Storage/storageAccounts/blobServices/containers"
    ).values()

    assert body(table)["name"] == "tableName"
    assert module_params("storage")["tableName"] == "tableName"
    assert param_default(bicep("main.bicep"), "tableName") == settings.DEFAULT_TABLE
    assert body(container)["name"] == "deploymentContainerName"
    assert body(container)["properties"]["publicAccess"] == "None"


def test_service_bus_queues_dead_letter_deduplicate_and_lock_long_enough() -> None:
    parsed = bicep("modules/servicebus.bicep")
    [queues] = resources_of_type(parsed, "Microsoft.ServiceBus/namespaces/queues").values()
    properties = body(queues)["properties"]
    main = bicep("main.bicep")
    longest_budget = max(w.longest_budget for w in WORKFLOWS.values())
    pickup_budget = max(w.pickup_budget for w in WORKFLOWS.values())

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


def role_lists(**params: Any) -> dict[str, list[dict[str, str]]]:
    parsed = bicep("modules/roles.bicep")
    scope = file_scope(
        parsed,
        principalId="p",
        storageAccountName="st",
        applicationInsightsName="appi",
        **params,
    )
    assignments = resources_of_type(parsed, "Microsoft.Authorization/roleAssignments")
    return {
        name: evaluate(resource["config"]["loop_type"]["detail"]["array_name"], scope)
        for name, resource in assignments.items()
    }


def test_the_app_identity_gets_every_role_it_needs() -> None:
    params = module_params("appRoles")
    assert params["hostRoles"] is True
    assert params["principalType"] == "ServicePrincipal"
    assert dotted(params["principalId"]) == "identity.outputs.principalId"

    granted = role_lists(serviceBusNamespaceName="sb", hostRoles=True)

    ids = {role["id"] for roles in granted.values() for role in roles}
    assert ids == set(REQUIRED_ROLES)
    for roles in granted.values():
        for role in roles:
            assert REQUIRED_ROLES[role["id"]] == role["name"]


def test_storage_transport_grants_no_service_bus_roles() -> None:
    granted = role_lists(serviceBusNamespaceName="", hostRoles=True)

    ids = {role["id"] for roles in granted.values() for role in roles}
    assert ids == set(REQUIRED_ROLES) - {
        "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39",
        "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0",
    }


def test_the_deploying_user_is_optional_and_gets_no_host_roles() -> None:
    config = bicep("main.bicep")["modules"]["userRoles"]["config"]
    assert "condition" in config
    scope = main_scope("servicebus")
    assert evaluate(config["condition"], {**scope, "principalId": ""}) is False
    assert evaluate(config["condition"], {**scope, "principalId": "abc"}) is True
    assert module_params("userRoles")["hostRoles"] is False

    granted = role_lists(serviceBusNamespaceName="sb", hostRoles=False)

    names = {role["name"] for roles in granted.values() for role in roles}
    assert "Storage Blob Data Owner" not in names
    assert "Monitoring Metrics Publisher" not in names


def test_role_assignments_are_deterministic_and_data_roles_only() -> None:
    for path in sorted(INFRA.rglob("*.bicep")):
        assignments = resources_of_type(
            bicep(path.relative_to(INFRA).as_posix()), "Microsoft.Authorization/roleAssignments"
        )
        if path.name != "roles.bicep":
            assert not assignments, f"{path.name}: grant roles through modules/roles.bicep"
        for name, resource in assignments.items():
            assert "loop_type" in resource["config"], f"{name} should loop over a role list"
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
    storage = bicep("modules/storage.bicep")
    [account] = resources_of_type(storage, "Microsoft.Storage/storageAccounts").values()
    account_properties = body(account)["properties"]
    assert account_properties["allowSharedKeyAccess"] is False
    assert account_properties["allowBlobPublicAccess"] is False
    assert account_properties["minimumTlsVersion"] == "TLS1_2"
    assert account_properties["supportsHttpsTrafficOnly"] is True

    servicebus = bicep("modules/servicebus.bicep")
    [namespace] = resources_of_type(servicebus, "Microsoft.ServiceBus/namespaces").values()
    assert body(namespace)["properties"]["disableLocalAuth"] is True
    assert body(namespace)["properties"]["minimumTlsVersion"] == "1.2"
    assert body(namespace)["sku"]["name"] == "Standard"

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
    for agent in AGENTS:
        assert f"remote{agent.capitalize()}Url" in declared


def test_azure_yaml_deploys_the_python_function_app() -> None:
    azure_yaml = (ROOT / "azure.yaml").read_text()

    assert re.search(r"^services:\n  api:\n", azure_yaml, re.MULTILINE)
    for line in ("project: .", "language: python", "host: function"):
        assert re.search(rf"^    {re.escape(line)}$", azure_yaml, re.MULTILINE), line
    tags = text("modules/functionapp.bicep")
    assert "'azd-service-name': serviceName" in tags
    assert module_params("functionApp")["serviceName"] == "api"


# --- (e) local.settings.example.json has every setting too ------------------------------------


def test_local_settings_example_has_every_setting() -> None:
    if not LOCAL_SETTINGS_EXAMPLE.exists():
        pytest.skip("local.settings.example.json is not written yet")
    values: dict[str, str] = json.loads(LOCAL_SETTINGS_EXAMPLE.read_text())["Values"]

    missing = SAS_KEYS - set(values)
    assert not missing, f"local.settings.example.json lacks {sorted(missing)}"
    assert values.get("FUNCTIONS_WORKER_RUNTIME") == "python"
    assert "AzureWebJobsStorage" in values or "AzureWebJobsStorage__blobServiceUri" in values
    assert settings.STORAGE_CONNECTION in values or STORAGE_IDENTITY_KEYS - {
        f"{settings.STORAGE_CONNECTION}__clientId"
    } <= set(values)
    if settings.transport_from(values) == "servicebus":
        assert settings.SERVICEBUS_CONNECTION in values or (
            f"{settings.SERVICEBUS_CONNECTION}__fullyQualifiedNamespace" in values
        )
    settings.load(values)  # and they resolve

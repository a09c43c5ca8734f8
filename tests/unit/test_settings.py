"""Settings resolution (sas.settings.load): both connection forms, transport, defaults, errors.

Every error must be a ConfigurationError that names the offending key, and must never echo a
connection string back (it may hold a key).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

from sas import settings
from sas.domain.errors import ConfigurationError, SasError
from sas.settings import AGENTS, HTTP_AGENTS

pytestmark = [pytest.mark.unit, pytest.mark.fast]

AZURITE = "UseDevelopmentStorage=true"
ACCOUNT_KEY = "bm90LWEtcmVhbC1rZXktYnV0LXNlY3JldC1hbnl3YXk="
STORAGE_CS = (
    "DefaultEndpointsProtocol=https;AccountName=sasstore;"
    f"AccountKey={ACCOUNT_KEY};EndpointSuffix=core.windows.net"
)
SB_KEY = "c2VydmljZWJ1cy1rZXktbmV2ZXItZWNob2Vk"
SB_CS = (
    f"Endpoint=sb://sas-ns.servicebus.windows.net/;SharedAccessKeyName=app;SharedAccessKey={SB_KEY}"
)
TABLE_URI = "https://sasstore.table.core.windows.net"
QUEUE_URI = "https://sasstore.queue.core.windows.net"
NAMESPACE = "sas-ns.servicebus.windows.net"
CLIENT_ID = "0b5d1e6a-6a86-4a4e-9f8e-1c2d3e4f5a6b"


def remote_urls() -> dict[str, str]:
    return {
        settings.remote_url_setting(agent): f"https://remote.example.com/{agent}"
        for agent in HTTP_AGENTS
    }


def storage_env(**extra: str) -> dict[str, str]:
    """A complete storage-transport environment (Azurite connection string)."""
    return {
        settings.TRANSPORT: "storage",
        settings.STORAGE_CONNECTION: AZURITE,
        **remote_urls(),
        **extra,
    }


def identity_env(**extra: str) -> dict[str, str]:
    """A complete Azure-style environment: identity-based connections, Service Bus transport."""
    return {
        settings.TRANSPORT: "servicebus",
        "SasStorage__tableServiceUri": TABLE_URI,
        "SasStorage__queueServiceUri": QUEUE_URI,
        "SasStorage__credential": "managedidentity",
        "SasStorage__clientId": CLIENT_ID,
        "SasServiceBus__fullyQualifiedNamespace": NAMESPACE,
        "SasServiceBus__credential": "managedidentity",
        "SasServiceBus__clientId": CLIENT_ID,
        **remote_urls(),
        **extra,
    }


def without(env: Mapping[str, str], *keys: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in keys}


def config_error(env: Mapping[str, str]) -> str:
    with pytest.raises(ConfigurationError) as raised:
        settings.load(env)
    assert isinstance(raised.value, SasError)
    return str(raised.value)


# --- defaults and the connection-string form -----------------------------------------------


def test_defaults_with_connection_strings() -> None:
    s = settings.load(storage_env())

    assert s.transport == "storage"
    assert s.table_name == settings.DEFAULT_TABLE == "sasorders"
    assert dict(s.queues) == settings.DEFAULT_QUEUES
    assert s.queue(settings.QUEUE_ORDERS) == "sas-orders"
    assert s.queue(settings.QUEUE_SCHEDULER) == "sas-scheduler"
    assert s.queue(settings.QUEUE_REPLIES) == "sas-replies"
    assert s.queue(settings.QUEUE_ALERTS) == "sas-alerts"
    for agent in AGENTS:
        assert s.agent_queue(agent) == f"sas-agent-{agent}"
    for agent in HTTP_AGENTS:
        assert s.remote_urls[agent] == f"https://remote.example.com/{agent}"
    assert s.storage.setting == "SasStorage"
    assert s.storage.connection_string == AZURITE
    assert not s.storage.uses_identity
    assert s.servicebus is None  # not needed, not resolved, for the storage transport
    assert s.instance_id.endswith(f"-{os.getpid()}")


def test_default_queue_names_cover_every_agent() -> None:
    expected = {settings.agent_queue_setting(agent) for agent in AGENTS}

    assert expected <= set(settings.DEFAULT_QUEUES)
    assert settings.agent_queue_setting("payment") == "SAS_QUEUE_AGENT_PAYMENT"
    assert settings.remote_url_setting("payment") == "SAS_REMOTE_PAYMENT_URL"


def test_overrides_are_honoured() -> None:
    s = settings.load(
        storage_env(
            SAS_TABLE_NAME="OrdersV2",
            SAS_QUEUE_ORDERS="tenant1-orders",
            SAS_QUEUE_AGENT_PAYMENT="tenant1-payments",
            SAS_INSTANCE_ID="worker-7",
        )
    )

    assert s.table_name == "OrdersV2"
    assert s.queue(settings.QUEUE_ORDERS) == "tenant1-orders"
    assert s.agent_queue("payment") == "tenant1-payments"
    assert s.queue(settings.QUEUE_REPLIES) == "sas-replies"
    assert s.instance_id == "worker-7"


def test_remote_url_trailing_slash_is_removed() -> None:
    s = settings.load(storage_env(SAS_REMOTE_PAYMENT_URL="https://pay.example.com/api/"))

    assert s.remote_urls["payment"] == "https://pay.example.com/api"


def test_servicebus_connection_string_form() -> None:
    s = settings.load(storage_env(SAS_TRANSPORT="servicebus", SasServiceBus=SB_CS))

    assert s.transport == "servicebus"
    assert s.servicebus is not None
    assert s.servicebus.setting == "SasServiceBus"
    assert s.servicebus.connection_string == SB_CS
    assert not s.servicebus.uses_identity


def test_azure_storage_connection_string_is_accepted() -> None:
    s = settings.load(storage_env(SasStorage=STORAGE_CS))

    assert s.storage.connection_string == STORAGE_CS


def test_load_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in storage_env(SAS_TABLE_NAME="FromEnviron").items():
        monkeypatch.setenv(key, value)

    assert settings.load().table_name == "FromEnviron"


# --- the identity-based form (what Azure uses) ---------------------------------------------


def test_identity_based_connections() -> None:
    s = settings.load(identity_env())

    assert s.transport == "servicebus"
    assert s.storage.uses_identity
    assert s.storage.connection_string is None
    assert s.storage.table_uri == TABLE_URI
    assert s.storage.queue_uri == QUEUE_URI
    assert s.storage.client_id == CLIENT_ID
    assert s.servicebus is not None
    assert s.servicebus.uses_identity
    assert s.servicebus.namespace == NAMESPACE
    assert s.servicebus.client_id == CLIENT_ID


def test_identity_without_client_id_means_default_credential() -> None:
    env = without(identity_env(), "SasStorage__clientId", "SasServiceBus__credential")
    env["SasServiceBus__clientId"] = ""

    s = settings.load(env)

    assert s.storage.client_id is None
    assert s.servicebus is not None
    assert s.servicebus.client_id is None


def test_credential_value_is_case_insensitive() -> None:
    s = settings.load(identity_env(SasStorage__credential="ManagedIdentity"))

    assert s.storage.client_id == CLIENT_ID


def test_connection_string_wins_over_identity_keys() -> None:
    s = settings.load(identity_env(SasStorage=AZURITE, SasServiceBus=SB_CS))

    assert s.storage.connection_string == AZURITE
    assert s.storage.table_uri is None
    assert s.servicebus is not None
    assert s.servicebus.connection_string == SB_CS
    assert s.servicebus.namespace is None


def test_storage_transport_ignores_service_bus_settings() -> None:
    env = identity_env(SAS_TRANSPORT="storage", SasServiceBus__fullyQualifiedNamespace="bad")

    assert settings.load(env).servicebus is None


# --- transport parsing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("servicebus", "servicebus"), ("storage", "storage"), (" Storage ", "storage"),
     ("SERVICEBUS", "servicebus")],
)  # fmt: skip
def test_transport_parsing(raw: str, expected: str) -> None:
    assert settings.transport_from({settings.TRANSPORT: raw}) == expected


def test_transport_defaults_to_servicebus() -> None:
    assert settings.transport_from({}) == "servicebus"
    env = without(identity_env(), settings.TRANSPORT)

    assert settings.load(env).transport == "servicebus"


@pytest.mark.parametrize("raw", ["kafka", " ", "service-bus", "queues"])
def test_unknown_transport_is_refused(raw: str) -> None:
    message = config_error(storage_env(SAS_TRANSPORT=raw))

    assert "SAS_TRANSPORT" in message


def test_an_empty_setting_is_an_unset_one() -> None:
    loaded = settings.load(identity_env(SAS_TRANSPORT="", SAS_TABLE_NAME=""))
    assert (loaded.transport, loaded.table_name) == ("servicebus", settings.DEFAULT_TABLE)


# --- errors name the key -------------------------------------------------------------------


@pytest.mark.parametrize("agent", HTTP_AGENTS)
@pytest.mark.parametrize("unset", ["missing", "empty"])
def test_an_agent_without_a_url_fails_alone_naming_the_setting(agent: str, unset: str) -> None:
    key = settings.remote_url_setting(agent)
    env = without(storage_env(), key) | ({key: ""} if unset == "empty" else {})
    loaded = settings.load(env)  # the other functions run
    others = [a for a in HTTP_AGENTS if a != agent]
    assert [e.agent for e in loaded.all_endpoints] == others
    with pytest.raises(ConfigurationError) as raised:
        loaded.endpoints_of(agent)
    assert str(raised.value).startswith(f"missing setting {key}: ")
    assert settings.remote_endpoints_setting(agent) in str(raised.value)


@pytest.mark.parametrize(
    "url", ["ftp://remote.example.com/x", "remote.example.com/x", "https://", "http:///path"]
)
def test_malformed_remote_url(url: str) -> None:
    message = config_error(storage_env(SAS_REMOTE_SHIPPING_URL=url))

    assert "SAS_REMOTE_SHIPPING_URL" in message


@pytest.mark.parametrize(
    "name",
    ["Sas-Orders", "sas_orders", "ab", "-sas-orders", "sas-orders-", "sas--orders", "a" * 64],
)
def test_invalid_queue_name(name: str) -> None:
    message = config_error(storage_env(SAS_QUEUE_REPLIES=name))

    assert "SAS_QUEUE_REPLIES" in message


def test_every_queue_is_named_from_one_prefix_unless_its_own_setting_names_it() -> None:
    overrides = {"SAS_QUEUE_ORDERS": "incoming", "SAS_QUEUE_AGENT_PAYMENT_LOW": "pay-later"}
    loaded = settings.load(storage_env(SAS_QUEUE_PREFIX="shop", SAS_QUEUE_REPLIES="", **overrides))
    assert loaded.queue(settings.QUEUE_REPLIES) == "shop-replies"  # empty: not set
    replies = {"high": "shop-replies-high", "normal": "shop-replies", "low": "shop-replies-low"}
    assert loaded.lanes(settings.QUEUE_REPLIES) == replies
    assert loaded.lanes(settings.QUEUE_ORDERS)["high"] == "incoming-high"  # follows its normal
    assert loaded.lane(settings.agent_queue_setting("payment"), "low") == "pay-later"
    assert loaded.queue(settings.QUEUE_ALERTS) == "shop-alerts"
    assert settings.DEFAULT_QUEUES[settings.QUEUE_ORDERS] == "sas-orders"


@pytest.mark.parametrize("prefix", ["Shop", "shop_", "-shop", "x" * 60])
def test_a_prefix_that_makes_an_invalid_queue_name_is_refused(prefix: str) -> None:
    assert "SAS_QUEUE_PREFIX" in config_error(storage_env(SAS_QUEUE_PREFIX=prefix))


def test_invalid_agent_queue_name() -> None:
    key = settings.agent_queue_setting("inventory")

    assert key in config_error(storage_env(**{key: "Inventory Queue"}))


@pytest.mark.parametrize("name", ["sas-orders", "1orders", "ab", "a" * 64, "sas orders", " "])
def test_invalid_table_name(name: str) -> None:
    assert "SAS_TABLE_NAME" in config_error(storage_env(SAS_TABLE_NAME=name))


def test_missing_storage_connection_names_both_forms() -> None:
    message = config_error(without(storage_env(), "SasStorage"))

    assert "SasStorage" in message
    assert "SasStorage__tableServiceUri" in message
    assert "SasStorage__queueServiceUri" in message


@pytest.mark.parametrize("missing", ["SasStorage__tableServiceUri", "SasStorage__queueServiceUri"])
def test_identity_storage_needs_both_endpoints(missing: str) -> None:
    assert missing in config_error(without(identity_env(), missing))


@pytest.mark.parametrize(
    ("key", "uri"),
    [
        ("SasStorage__tableServiceUri", "http://sasstore.table.core.windows.net"),
        ("SasStorage__queueServiceUri", "sasstore.queue.core.windows.net"),
        ("SasStorage__queueServiceUri", "ftp://sasstore.queue.core.windows.net"),
    ],
)
def test_storage_endpoint_must_be_https(key: str, uri: str) -> None:
    assert key in config_error(identity_env(**{key: uri}))


@pytest.mark.parametrize("value", ["systemassigned", "connectionstring", "managed identity"])
def test_bad_storage_credential(value: str) -> None:
    assert "SasStorage__credential" in config_error(identity_env(SasStorage__credential=value))


def test_bad_servicebus_credential() -> None:
    message = config_error(identity_env(SasServiceBus__credential="azurecli"))

    assert "SasServiceBus__credential" in message


def test_storage_value_that_is_not_a_connection_string() -> None:
    message = config_error(storage_env(SasStorage="https://sasstore.blob.core.windows.net"))

    assert "SasStorage" in message


def test_missing_servicebus_connection_names_both_forms() -> None:
    env = without(identity_env(), "SasServiceBus__fullyQualifiedNamespace")

    message = config_error(env)

    assert "SasServiceBus" in message
    assert "SasServiceBus__fullyQualifiedNamespace" in message


@pytest.mark.parametrize(
    "namespace",
    [
        "sb://sas-ns.servicebus.windows.net",
        "https://sas-ns.servicebus.windows.net/",
        "sas-ns",
        "sas-ns.servicebus.windows.net/",
        "sas ns.servicebus.windows.net",
        "sas-ns.servicebus.windows.net:5671",
    ],
)
def test_malformed_namespace(namespace: str) -> None:
    message = config_error(identity_env(SasServiceBus__fullyQualifiedNamespace=namespace))

    assert "SasServiceBus__fullyQualifiedNamespace" in message


def test_servicebus_value_that_is_not_a_connection_string() -> None:
    message = config_error(storage_env(SAS_TRANSPORT="servicebus", SasServiceBus="sas-ns"))

    assert "SasServiceBus" in message


def test_errors_never_echo_connection_strings() -> None:
    bad_storage = STORAGE_CS.replace("AccountName=", "Account=")
    bad_servicebus = SB_CS.replace("Endpoint=sb://", "Endpoint=amqps://")

    storage_message = config_error(storage_env(SasStorage=bad_storage))
    servicebus_message = config_error(
        storage_env(SAS_TRANSPORT="servicebus", SasServiceBus=bad_servicebus)
    )

    assert ACCOUNT_KEY not in storage_message
    assert SB_KEY not in servicebus_message


# --- gaps found in review, now closed ------------------------------------------------------


def test_storage_endpoint_without_host_is_refused() -> None:
    env = identity_env(SasStorage__tableServiceUri="https:", SasStorage__queueServiceUri="https://")

    assert "SasStorage__" in config_error(env)


def test_two_roles_on_one_queue_is_refused() -> None:
    message = config_error(storage_env(SAS_QUEUE_SCHEDULER="sas-orders"))

    assert "SAS_QUEUE_SCHEDULER" in message or "SAS_QUEUE_ORDERS" in message


def test_storage_queue_name_leaves_room_for_the_poison_suffix() -> None:
    message = config_error(storage_env(SAS_QUEUE_ORDERS="o" * 60))

    assert "SAS_QUEUE_ORDERS" in message


# --- managed identity only where <Conn>__credential says so (the Functions convention) -------


@pytest.mark.parametrize("connection", ["SasStorage", "SasServiceBus"])
def test_client_id_without_managed_identity_credential_is_refused(connection: str) -> None:
    env = without(identity_env(), f"{connection}__credential")

    message = config_error(env)

    assert f"{connection}__clientId" in message
    assert f"{connection}__credential" in message


def test_managed_identity_credential_is_carried_with_its_client_id() -> None:
    s = settings.load(identity_env())

    assert s.storage.credential == "managedidentity"
    assert s.storage.client_id == CLIENT_ID
    assert s.servicebus is not None
    assert s.servicebus.credential == "managedidentity"
    assert s.servicebus.client_id == CLIENT_ID


def test_managed_identity_without_client_id_is_the_system_assigned_one() -> None:
    s = settings.load(without(identity_env(), "SasStorage__clientId", "SasServiceBus__clientId"))

    assert (s.storage.credential, s.storage.client_id) == ("managedidentity", None)
    assert s.servicebus is not None
    assert (s.servicebus.credential, s.servicebus.client_id) == ("managedidentity", None)


def test_no_credential_setting_means_default_azure_credential() -> None:
    env = without(
        identity_env(),
        "SasStorage__credential",
        "SasStorage__clientId",
        "SasServiceBus__credential",
        "SasServiceBus__clientId",
    )

    s = settings.load(env)

    assert (s.storage.credential, s.storage.client_id) == (None, None)
    assert s.servicebus is not None
    assert (s.servicebus.credential, s.servicebus.client_id) == (None, None)


def test_credential_follows_the_connection_setting() -> None:
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    from sas.adapters.clients import credential

    s = settings.load(identity_env())
    user_assigned = credential(s.storage)
    default = credential(settings.Connection(setting="SasStorage", table_uri=TABLE_URI))
    system_assigned = credential(
        settings.Connection(setting="SasStorage", table_uri=TABLE_URI, credential="managedidentity")
    )

    assert isinstance(user_assigned, ManagedIdentityCredential)
    assert isinstance(system_assigned, ManagedIdentityCredential)
    assert isinstance(default, DefaultAzureCredential)
    assert not isinstance(default, ManagedIdentityCredential)


def test_credential_refuses_a_client_id_without_managed_identity() -> None:
    from sas.adapters.clients import credential

    connection = settings.Connection(setting="SasStorage", table_uri=TABLE_URI, client_id=CLIENT_ID)

    with pytest.raises(ConfigurationError, match="SasStorage__clientId"):
        credential(connection)


# --- clock skew allowance and reply-to prefixes ---------------------------------------------


def test_the_clock_skew_allowance_defaults_to_two_seconds_and_is_bounded() -> None:
    assert settings.load(storage_env()).clock_skew_seconds == 2.0
    assert settings.load(storage_env(SAS_CLOCK_SKEW_SECONDS="0.5")).clock_skew_seconds == 0.5
    for bad in ("-1", "soon", "11", "nan"):
        assert settings.CLOCK_SKEW_SECONDS in config_error(storage_env(SAS_CLOCK_SKEW_SECONDS=bad))


def test_reply_to_prefixes_default_to_status_and_never_cover_an_app_queue() -> None:
    assert settings.load(storage_env()).reply_to_prefixes == ("status-",)
    loaded = settings.load(storage_env(SAS_REPLY_TO_PREFIXES="status-, shop-"))
    assert loaded.reply_to_prefixes == ("status-", "shop-")
    assert "sas-orders" in config_error(storage_env(SAS_REPLY_TO_PREFIXES="sas-"))
    # A prefix that covers only a poison queue of the app's.
    assert "'sas-orders-poison'" in config_error(storage_env(SAS_REPLY_TO_PREFIXES="sas-orders-p"))
    for bad in ("Status-", "-x", "st/", " , "):
        assert settings.REPLY_TO_PREFIXES in config_error(storage_env(SAS_REPLY_TO_PREFIXES=bad))

"""Which app settings the CLI runs with: it reads the app's store and queues itself, through the
app's own services, so it needs the same settings the function app has.

In order: ``--settings FILE``; else the environment, when it names the app's storage; else the
settings the last local run gave its dev host (``.sas-run/local.settings.json``, written by
``sas_local/stack.py``); else Azurite on its standard development ports.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from sas import settings as app_settings
from sas.settings import HTTP_AGENTS

LOCAL_RUN_SETTINGS = Path(".sas-run") / "local.settings.json"

# Azurite's documented development account; its key is public, the same on every machine
# (the local tooling, which does not ship with the CLI, starts Azurite with the same one).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_DEVELOPMENT = (
    f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
    f"BlobEndpoint=http://127.0.0.1:10000/{AZURITE_ACCOUNT};"
    f"QueueEndpoint=http://127.0.0.1:10001/{AZURITE_ACCOUNT};"
    f"TableEndpoint=http://127.0.0.1:10002/{AZURITE_ACCOUNT};"
)

# The operator never calls a remote service, but the app's settings insist on each URL.
UNUSED_REMOTE_URL = "http://127.0.0.1:9"

_IDENTITY_SUFFIXES = ("__credential", "__clientId")


class SettingsFileError(ValueError):
    """The settings file cannot be read or has neither shape the CLI knows."""


@dataclass(frozen=True)
class Source:
    values: dict[str, str]
    """What to put into the process environment before the app reads its settings."""
    description: str
    replaces_environment: bool = True
    """The app's own settings already in the environment go first: a connection string left in
    the shell must never win over the file's endpoints (and point a purge at another app)."""


def choose(path: Path | None, env: Mapping[str, str], cwd: Path) -> Source:
    if path is not None:
        return Source(_without_managed_identity(read_file(path)), f"settings file {path}")
    if _names_storage(env):
        return Source({}, "the environment", replaces_environment=False)
    local = cwd / LOCAL_RUN_SETTINGS
    if local.is_file():
        return Source(read_file(local), f"the local run's settings ({LOCAL_RUN_SETTINGS})")
    return Source(
        {app_settings.TRANSPORT: "storage", app_settings.STORAGE_CONNECTION: AZURITE_DEVELOPMENT},
        "Azurite's development endpoints (127.0.0.1:10000-10002)",
    )


def apply(source: Source, env: MutableMapping[str, str] | None = None) -> None:
    """Into the environment (``os.environ`` by default), where the app's settings are read."""
    target = os.environ if env is None else env
    if source.replaces_environment:
        for key in [key for key in target if _is_app_setting(key)]:
            del target[key]
    target.update(source.values)
    for agent in HTTP_AGENTS:
        if not (
            target.get(app_settings.remote_url_setting(agent))
            or target.get(app_settings.remote_endpoints_setting(agent))
        ):
            target[app_settings.remote_url_setting(agent)] = UNUSED_REMOTE_URL


def read_file(path: Path) -> dict[str, str]:
    """A local.settings.json (``{"Values": {...}}``) or what ``az functionapp config
    appsettings list`` prints (``[{"name": ..., "value": ...}, ...]``)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsFileError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SettingsFileError(f"{path} is not JSON: {exc}") from None
    if isinstance(document, dict) and isinstance(document.get("Values"), dict):
        pairs = list(document["Values"].items())
    elif isinstance(document, list) and all(
        isinstance(item, dict) and "name" in item and "value" in item for item in document
    ):
        pairs = [(item["name"], item["value"]) for item in document]
    else:
        raise SettingsFileError(
            f'{path}: expected {{"Values": {{...}}}} or [{{"name": ..., "value": ...}}, ...]'
        )
    values: dict[str, str] = {}
    for name, value in pairs:
        if value is None:  # az lists a value it may not show you as null: leave it unset
            continue
        if not isinstance(name, str) or not isinstance(value, str | int | float | bool):
            raise SettingsFileError(f"{path}: setting {name!r} is not a name with a plain value")
        values[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return values


_APP_SETTING_PREFIXES = (
    app_settings.STORAGE_CONNECTION,
    app_settings.SERVICEBUS_CONNECTION,
    "SAS_",
)


def _is_app_setting(key: str) -> bool:
    return key.startswith(_APP_SETTING_PREFIXES)


def _names_storage(env: Mapping[str, str]) -> bool:
    prefix = app_settings.STORAGE_CONNECTION
    return any(key == prefix or key.startswith(prefix + "__") for key in env)


def _without_managed_identity(values: dict[str, str]) -> dict[str, str]:
    """The app's own settings name its managed identity, which exists only inside Azure: the
    operator signs in as themself instead (DefaultAzureCredential: ``az login``, ...)."""
    return {k: v for k, v in values.items() if not k.endswith(_IDENTITY_SUFFIXES)}

"""The app's settings a user gives a local run (`make run`): the ``Values`` of the
``local.settings.json`` beside the app, when there is one, then the environment's app settings
(``SAS_*`` and the Python agents' own), which win, as with the Functions host.

The local stack (sas_local/stack.py) takes them over its defaults, but keeps what it runs on
(its Azurite, Storage Queues, an instance id per process). An HTTP agent given a URL (or
endpoints) calls it, and the simulator does not play that service; a URL on the simulator's
usual address (``http://127.0.0.1:7081/<agent>``, as local.settings.example.json has it) means
the simulator, and the stack's own plays it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

from sas import settings as app_settings
from sas.declared import registry
from sas_local.devhost.config import load_settings

SETTINGS_FILE = "local.settings.json"
SIMULATOR_PORT = 7081
"""Where `python -m sas_local.simulator` listens unless told otherwise."""
OWNED = frozenset(
    {
        app_settings.TRANSPORT,
        app_settings.STORAGE_CONNECTION,
        app_settings.INSTANCE_ID,
        "AzureWebJobsStorage",
    }
)
"""What the stack runs on: never the user's (a Service Bus, another Azurite, one id for all)."""
OWNED_PREFIXES = (
    f"{app_settings.STORAGE_CONNECTION}__",
    app_settings.SERVICEBUS_CONNECTION,
    "AzureWebJobsStorage__",
)


def read(path: Path, environ: Mapping[str, str], *, explicit: bool = False) -> dict[str, str]:
    """The user's settings: the file at ``path`` (absent: none, unless ``explicit``), then
    ``environ``'s app settings; DevHostError for a file that cannot be read, naming it."""
    declared = set(registry().settings)
    chosen = {k: v for k, v in environ.items() if k.startswith("SAS_") or k in declared}
    return load_settings(path, chosen, explicit=explicit)


def given(user: Mapping[str, str]) -> dict[str, str]:
    """What the stack takes of them: all but what it owns, the URLs meaning the simulator and
    the empty ones (an empty setting is an unset one)."""
    return {
        key: value
        for key, value in user.items()
        if value.strip()
        and key not in OWNED
        and not key.startswith(OWNED_PREFIXES)
        and not (key.startswith("SAS_REMOTE_") and key.endswith("_URL") and _simulator(value))
    }


def own_services(user: Mapping[str, str], agents: Sequence[str]) -> dict[str, str]:
    """Of ``agents``, those the user gives a service of their own: agent -> the setting."""
    taken = given(user)
    found = {}
    for agent in agents:
        for key in (
            app_settings.remote_endpoints_setting(agent),
            app_settings.remote_url_setting(agent),
        ):
            if key in taken:
                found[agent] = key
                break
    return found


def _simulator(url: str) -> bool:
    try:
        parsed = urlparse(url)
        return parsed.hostname in ("127.0.0.1", "localhost") and parsed.port == SIMULATOR_PORT
    except ValueError:
        return False

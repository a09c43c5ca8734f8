"""Create the table and queues the app uses (locally; in Azure the Bicep creates them).

Run: `python -m sas.devtools.provision` with the same settings as the app.
"""

from __future__ import annotations

from contextlib import suppress

from azure.core.exceptions import ResourceExistsError

from sas import settings as settings_module
from sas.adapters.clients import queue_service_client, table_service_client


def provision(settings: settings_module.Settings, extra_queues: tuple[str, ...] = ()) -> None:
    table_service_client(settings.storage).create_table_if_not_exists(settings.table_name)
    queues = queue_service_client(settings.storage)
    for name in (*settings.queues.values(), *extra_queues):
        with suppress(ResourceExistsError):
            queues.create_queue(name)


def main() -> None:
    provision(settings_module.load())
    print("provisioned table and queues")


if __name__ == "__main__":
    main()

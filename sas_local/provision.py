"""Create the tables and queues the app uses (locally; in Azure the Bicep creates them).

Run: `python -m sas_local.provision` with the same settings as the app.
"""

from __future__ import annotations

import argparse
import os
from contextlib import suppress
from pathlib import Path

from azure.core.exceptions import ResourceExistsError

from sas import settings as settings_module
from sas.adapters.clients import queue_service_client, table_service_client
from sas_local.devhost.config import load_settings


def provision(settings: settings_module.Settings, extra_queues: tuple[str, ...] = ()) -> None:
    tables = table_service_client(settings.storage)
    for table in settings.tables:
        tables.create_table_if_not_exists(table)
    queues = queue_service_client(settings.storage)
    for name in (*settings.queues.values(), *extra_queues):
        with suppress(ResourceExistsError):
            queues.create_queue(name)


def main() -> None:
    parser = argparse.ArgumentParser(description="Create the table and queues on Azurite.")
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        help="a local.settings.json whose Values are used (environment variables win)",
    )
    args = parser.parse_args()
    values = load_settings(args.settings, os.environ, explicit=args.settings is not None)
    settings = settings_module.load(values)
    provision(settings)
    print(f"provisioned tables {', '.join(settings.tables)} and {len(settings.queues)} queues")


if __name__ == "__main__":
    main()

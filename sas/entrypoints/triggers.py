"""Trigger registration that follows SAS_TRANSPORT: Service Bus in Azure, Storage Queues locally.

Read once at import time from the environment (no I/O). Queue names are `%Setting%`
expressions resolved by the host, so no queue name is written in code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import azure.functions as func

from sas import settings

TRANSPORT_IN_USE = settings.transport_from(os.environ)
"""The transport this process registers triggers for, read once at import (no I/O)."""


def queue_trigger(bp: func.Blueprint, queue_setting: str) -> Callable[[Any], Any]:
    if TRANSPORT_IN_USE == "servicebus":
        return bp.service_bus_queue_trigger(
            arg_name="msg",
            queue_name=f"%{queue_setting}%",
            connection=settings.SERVICEBUS_CONNECTION,
        )
    return bp.queue_trigger(
        arg_name="msg", queue_name=f"%{queue_setting}%", connection=settings.STORAGE_CONNECTION
    )

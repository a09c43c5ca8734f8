"""Trigger registration that follows the environment, read once at import (no I/O):
``SAS_TRANSPORT`` picks Service Bus (Azure) or Storage Queues (Azurite), and each trigger's
queue is named from ``SAS_QUEUE_PREFIX`` or its own setting (``settings.queue_names``), so a
deployment sets no queue name unless it wants another. A bad value fails indexing, naming its
key."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import azure.functions as func

from sas import settings

TRANSPORT_IN_USE = settings.transport_from(os.environ)
"""The transport this process registers triggers for."""

QUEUE_NAMES = settings.queue_names(os.environ)
"""The queue each trigger reads, by its setting key."""


def queue_trigger(bp: func.Blueprint, queue_setting: str) -> Callable[[Any], Any]:
    queue = QUEUE_NAMES[queue_setting]
    if TRANSPORT_IN_USE == "servicebus":
        return bp.service_bus_queue_trigger(
            arg_name="msg", queue_name=queue, connection=settings.SERVICEBUS_CONNECTION
        )
    return bp.queue_trigger(
        arg_name="msg", queue_name=queue, connection=settings.STORAGE_CONNECTION
    )

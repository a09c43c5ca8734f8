"""Settings (environment over local.settings.json) and host.json options for the dev host."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCAL_MAX_POLLING_INTERVAL = 1.0  # seconds; Azure's default is 1 min, too slow for local runs
MIN_POLLING_INTERVAL = 0.1
"""The first wait after an empty receive, in seconds: the Functions host's
(``QueuePollingIntervals.Minimum``)."""
POLLING_JITTER = 0.2
"""What each wait adds to the first one is drawn within this fraction either side of the
back-off, as the host's randomized exponential back-off draws it: workers that found a lane
empty together do not poll it together."""
EXIT_CONFIG = 2  # the user must fix a setting, host.json or the app's declarations
LEASE_SECONDS = 300  # visibility timeout while a message is being processed

_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.(\d{1,7}))?$")


class DevHostError(Exception):
    """A configuration problem the user must fix; the message says which key and where."""


def parse_timespan(value: str, key: str) -> float:
    """Parse a .NET TimeSpan (``[d.]hh:mm:ss[.fffffff]``) as host.json uses it, in seconds."""
    match = _TIMESPAN.match(value.strip())
    if match is None:
        raise DevHostError(f"host.json {key}: expected a TimeSpan like '00:00:02', got {value!r}")
    days, hours, minutes, seconds, fraction = match.groups()
    total = int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + int(seconds)
    return total + (float(f"0.{fraction}") if fraction else 0.0)


def load_settings(
    path: Path | None, environ: Mapping[str, str], *, explicit: bool = False
) -> dict[str, str]:
    """Merge ``Values`` of local.settings.json with the environment; the environment wins.

    A missing file means "environment only", unless the user named it explicitly.
    """
    merged: dict[str, str] = {}
    if path is not None and path.is_file():
        try:
            document = json.loads(path.read_text(encoding="utf-8-sig"))
        except (OSError, ValueError) as exc:
            raise DevHostError(f"cannot read settings file {path}: {exc}") from None
        if not isinstance(document, dict):
            raise DevHostError(f"settings file {path}: expected a JSON object")
        if document.get("IsEncrypted"):
            raise DevHostError(f"settings file {path}: encrypted settings are not supported")
        values = document.get("Values") or {}
        if not isinstance(values, dict):
            raise DevHostError(f"settings file {path}: 'Values' must be an object")
        for key, value in values.items():
            merged[str(key)] = value if isinstance(value, str) else json.dumps(value)
    elif path is not None and explicit:
        raise DevHostError(f"settings file {path} does not exist")
    merged.update(environ)
    return merged


@dataclass(frozen=True)
class QueueOptions:
    """host.json ``extensions.queues`` with the Functions defaults (polling made local-friendly)."""

    batch_size: int = 16
    new_batch_threshold: int = 8
    max_polling_interval: float = LOCAL_MAX_POLLING_INTERVAL
    visibility_timeout: float = 0.0
    max_dequeue_count: int = 5
    message_encoding: str = "base64"

    @property
    def min_polling_interval(self) -> float:
        return min(MIN_POLLING_INTERVAL, self.max_polling_interval)

    @property
    def max_in_flight(self) -> int:
        return self.batch_size + self.new_batch_threshold


@dataclass(frozen=True)
class HostConfig:
    queues: QueueOptions = QueueOptions()
    route_prefix: str = "api"


def _int(section: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DevHostError(
            f"host.json extensions.queues.{key}: expected {low}..{high}, got {value!r}"
        )
    return value


def _timespan(section: Mapping[str, Any], key: str, default: float) -> float:
    value = section.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise DevHostError(f"host.json extensions.queues.{key}: expected a TimeSpan string")
    return parse_timespan(value, f"extensions.queues.{key}")


def parse_host_config(document: Mapping[str, Any]) -> HostConfig:
    extensions = document.get("extensions") or {}
    queues = extensions.get("queues") or {}
    http = extensions.get("http") or {}
    if not isinstance(queues, dict) or not isinstance(http, dict):
        raise DevHostError("host.json: extensions.queues and extensions.http must be objects")
    batch_size = _int(queues, "batchSize", 16, 1, 32)
    threshold = _int(queues, "newBatchThreshold", batch_size // 2, 0, 1000)
    encoding = str(queues.get("messageEncoding", "base64")).lower()
    if encoding not in ("base64", "none"):
        raise DevHostError(
            f"host.json extensions.queues.messageEncoding: expected 'base64' or 'none', "
            f"got {encoding!r}"
        )
    polling = _timespan(queues, "maxPollingInterval", LOCAL_MAX_POLLING_INTERVAL)
    options = QueueOptions(
        batch_size=batch_size,
        new_batch_threshold=threshold,
        max_polling_interval=max(polling, 0.01),
        visibility_timeout=_timespan(queues, "visibilityTimeout", 0.0),
        max_dequeue_count=_int(queues, "maxDequeueCount", 5, 1, 1_000_000),
        message_encoding=encoding,
    )
    prefix = http.get("routePrefix", "api")
    if not isinstance(prefix, str):
        raise DevHostError("host.json extensions.http.routePrefix must be a string")
    return HostConfig(queues=options, route_prefix=prefix.strip("/"))


def load_host_config(app_dir: Path) -> HostConfig:
    """Read ``host.json`` next to the app (absent: all defaults)."""
    path = app_dir / "host.json"
    if not path.is_file():
        return HostConfig()
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as exc:
        raise DevHostError(f"cannot read {path}: {exc}") from None
    if not isinstance(document, dict):
        raise DevHostError(f"{path}: expected a JSON object")
    return parse_host_config(document)

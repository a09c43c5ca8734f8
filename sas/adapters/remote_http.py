"""HTTP client for remote services (payments, shipping, inventory) over httpx.

Classifies failures: timeouts, connection errors, 408, 425, 429, 5xx and a 2xx that is not a
JSON object are transient; any other 4xx is a business refusal (non-transient). The
Idempotency-Key header makes retries and duplicate deliveries safe at the provider.

No transient fault here is the order's own (``order_scoped``): a status cannot tell one order's
fault from the service's, and 408, 425, 429 and 5xx speak of the service, so each counts toward
its circuit breaker. An order's own bad data is a 4xx: a refusal, which the breaker counts as
the service answering.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import httpx

from sas.domain.errors import PermanentRemoteError, TransientRemoteError

_TRANSIENT_STATUS = frozenset({408, 425, 429})
MAX_RETRY_AFTER = 3600.0
"""A provider's hint beyond an hour is no hint for a step with a deadline."""


def quiet_request_log() -> None:
    """httpx logs every request at INFO (method, full URL, status): a record per remote call
    that the Functions host would ship to Application Insights beside the step's own
    ``sas.step_replied``, with whatever the URL carries. Left at WARNING unless someone set a
    level for it on purpose."""
    httpx_log = logging.getLogger("httpx")
    if httpx_log.level == logging.NOTSET:
        httpx_log.setLevel(logging.WARNING)


class HttpRemoteService:
    def __init__(self, base_urls: Mapping[str, str], client: httpx.Client | None = None) -> None:
        self._base_urls = dict(base_urls)
        self._client = client or httpx.Client(
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32)
        )

    def perform(
        self,
        agent: str,
        action: str,
        *,
        idempotency_key: str,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        url = f"{self._base_urls[agent]}/{action}"
        try:
            response = self._client.post(
                url,
                json=payload,
                headers={"Idempotency-Key": idempotency_key},
                timeout=httpx.Timeout(timeout),
            )
        except httpx.TimeoutException:
            raise TransientRemoteError(f"{agent}.{action}: timed out") from None
        except httpx.TransportError as exc:
            raise TransientRemoteError(f"{agent}.{action}: {type(exc).__name__}") from None
        status = response.status_code
        if status >= 500 or status in _TRANSIENT_STATUS:
            raise TransientRemoteError(
                f"{agent}.{action}: HTTP {status}", retry_after=_retry_after(response)
            )
        if status >= 400:
            raise PermanentRemoteError(f"{agent}.{action}: HTTP {status} {_detail(response)}")
        try:
            body = response.json()
        except (ValueError, RecursionError):  # not JSON, or nested deeper than json can parse
            raise TransientRemoteError(f"{agent}.{action}: reply is not JSON") from None
        if not isinstance(body, dict):
            raise TransientRemoteError(f"{agent}.{action}: reply is not a JSON object")
        return body

    def close(self) -> None:
        self._client.close()


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date, or garbage: fall back to our own backoff
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except (ValueError, RecursionError):
        return ""
    detail = body.get("detail") if isinstance(body, dict) else None
    return str(detail)[:200] if detail else ""

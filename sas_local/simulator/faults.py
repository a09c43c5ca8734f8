"""Fault injection for the simulator: what to break, and deterministic dice to decide when.

Every decision is a hash of (seed, decision kind, service, action, idempotency key[, call n])
rather than a draw from a shared RNG, so a given seed produces the same faults for the same
requests however concurrent callers interleave. Permanent refusals leave out the call number:
retries of one step must get the same business answer.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from sas.domain.wire import STEP_NAME


class ServiceFaults(BaseModel):
    """Per-service override; a field left out falls back to the global value."""

    model_config = ConfigDict(extra="forbid")

    transient_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    permanent_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    undo_permanent_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    slow_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    slow_seconds: float | None = Field(default=None, ge=0.0, le=600.0)


class EndpointFaults(BaseModel):
    """One named endpoint (``/endpoints/<name>/<service>/<action>``): every endpoint shares the
    one ledger, as regional endpoints of one provider share its idempotency records."""

    model_config = ConfigDict(extra="forbid")

    capacity: int | None = Field(default=None, ge=1, le=10_000)
    """Calls it takes at once; one more is answered 429 (Retry-After: 1) and applies nothing."""
    down: bool = False
    """Every call is answered 503 and applies nothing."""
    latency_seconds: float = Field(default=0.0, ge=0.0, le=60.0)
    """How long each call holds its place (after the effect is applied)."""


class FaultConfig(BaseModel):
    """The whole fault configuration; `PUT /faults` replaces it and restarts the outage clock."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    transient_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of calls answered 503/429 without applying anything."""
    throttle_share: float = Field(default=0.25, ge=0.0, le=1.0)
    """Of the transient failures, the share answered 429 with `Retry-After: 1` instead of 503."""
    permanent_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of do-keys refused for good (402/422); the same key always gets the same answer."""
    undo_permanent_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Like permanent_rate, for undo keys. 0 by default: compensation is expected to succeed."""
    slow_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of successful calls that apply the effect, then answer `slow_seconds` late."""
    slow_seconds: float = Field(default=20.0, ge=0.0, le=600.0)
    """Longer than the agents' call timeout by default, so the reply arrives too late."""
    outage_service: str | None = Field(default=None, pattern=STEP_NAME.end_of_text)
    outage_start: float = Field(default=0.0, ge=0.0)
    """Seconds after the faults were set (simulator start or `PUT /faults`)."""
    outage_seconds: float = Field(default=0.0, ge=0.0)
    per_service: dict[str, ServiceFaults] = Field(default_factory=dict)
    endpoints: dict[str, EndpointFaults] = Field(default_factory=dict)
    """Named endpoints' limits and faults; an endpoint not named here has none."""

    def for_service(self, service: str) -> FaultConfig:
        """This config with the service's overrides folded in."""
        override = self.per_service.get(service)
        if override is None:
            return self
        return self.model_copy(update=override.model_dump(exclude_none=True))

    def in_outage(self, service: str, set_at: datetime, now: datetime) -> bool:
        if service != self.outage_service or self.outage_seconds <= 0:
            return False
        start = set_at + timedelta(seconds=self.outage_start)
        return start <= now < start + timedelta(seconds=self.outage_seconds)


def chance(seed: int, *parts: object) -> float:
    """A uniform number in [0, 1) fixed by the seed and the parts; `rate` 1 always hits."""
    text = "|".join(str(part) for part in (seed, *parts))
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def refusal(service: str, undo: bool) -> tuple[int, str]:
    """The business refusal a provider would plausibly give (all permanent 4xx)."""
    if undo:
        return 422, f"{service}: undo refused"
    if service == "payment":
        return 402, "card declined"
    if service == "inventory":
        return 422, "out of stock"
    if service == "shipping":
        return 422, "address undeliverable"
    return 422, f"{service}: request refused"

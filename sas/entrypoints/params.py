"""What several routes of the HTTP API take alike: who acts, how many, how old."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import Header, Query
from pydantic import AfterValidator, AwareDatetime

from sas.services.operator import EARLIEST, LATEST, MAX_QUERY_LIMIT

# Who is signed in, where App Service authentication is on: it sets this header (and strips one
# a caller sends). Without it the header is as trustworthy as the body's ``actor``, no more.
SignedIn = Annotated[
    str | None, Header(alias="x-ms-client-principal-name", include_in_schema=False)
]

Limit = Annotated[int, Query(ge=1, le=MAX_QUERY_LIMIT, description="at most this many")]
ActorQuery = Annotated[
    str,
    Query(min_length=1, max_length=100, description="who acts (a signed-in user overrides it)"),
]
MAX_OFFSET = 1_000_000
"""How far a page may start: every match is read to sort them anyway."""
MAX_AGE_SECONDS = 10 * 366 * 86400
"""Ten years: older or newer than that filters nothing more, and keeps datetimes in range."""


def actor_of(signed_in: str | None, claimed: str) -> str:
    """The audit trail's actor: the signed-in user, else what the caller says."""
    name = (signed_in or "").strip()
    return name[:100] if name else claimed


def seconds(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)


def _in_range(at: datetime) -> datetime:
    try:
        if EARLIEST <= at <= LATEST:
            return at
    except OverflowError:  # an offset that takes it past what a datetime holds
        pass
    raise ValueError(f"must be from {EARLIEST.year} to {LATEST.year}")


Instant = Annotated[AwareDatetime, AfterValidator(_in_range)]
"""An instant with its zone, in the years a query takes."""

"""The simulator's books: applied effects, undo records and per-service counters.

Pure state, no HTTP and no locking: the app serialises calls into it. Idempotency is scoped
by (service, action, idempotency key), like a provider that keys requests per endpoint.

Do-after-undo rule: once an undo has been recorded for a do-key (whether it undid an applied
effect or found nothing and was a no-op), that key is *closed*: any later do with it is
refused 409 and applies nothing. So an undo that overtakes a late or retried do still leaves
the books right, every do-key is applied at most once, and a compensated order's effects stay
undone — all checkable from the ledger alone.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sas.domain.wire import Mode

Kind = Mode
UndoOutcome = Literal["undone", "noop"]
Key = tuple[str, str, str]
"""(service, action, idempotency key)"""


class Entry(BaseModel):
    """One ledger line. Do-effects carry undone_at/undone_by; undos carry original_* + outcome."""

    model_config = ConfigDict(frozen=True)

    effect_id: str
    kind: Kind
    service: str
    action: str
    idempotency_key: str
    order_id: str | None
    applied_at: datetime
    undone_at: datetime | None = None
    undone_by: str | None = None
    original_action: str | None = None
    original_key: str | None = None
    outcome: UndoOutcome | None = None

    def response(self) -> dict[str, Any]:
        """The reply body; derived only from fields fixed at creation, so replays match it."""
        body: dict[str, Any] = {
            "effect_id": self.effect_id,
            "kind": self.kind,
            "service": self.service,
            "action": self.action,
        }
        if self.kind == "undo":
            body |= {"outcome": self.outcome, "original_key": self.original_key}
        return body


class ServiceStats(BaseModel):
    calls: int = 0
    applied: int = 0
    """Do-effects applied (first call of a key that got through)."""
    replays: int = 0
    transient_failures: int = 0
    """503s and 429s injected by transient_rate (429s are also counted in `throttled`)."""
    throttled: int = 0
    permanent_failures: int = 0
    """Business refusals injected by permanent_rate / undo_permanent_rate."""
    refused_after_undo: int = 0
    """Do-calls refused 409 because their key had already been undone (see module doc)."""
    slow: int = 0
    outage_rejections: int = 0
    undos_applied: int = 0
    undos_noop: int = 0
    bad_requests: int = 0


class Books:
    def __init__(self) -> None:
        self._entries: dict[Key, Entry] = {}
        self._closed: dict[Key, str] = {}
        self._calls: Counter[Key] = Counter()
        self._called_at: dict[str, list[datetime]] = {}
        self._stats: dict[str, ServiceStats] = {}

    def stats(self, service: str) -> ServiceStats:
        return self._stats.setdefault(service, ServiceStats())

    def all_stats(self) -> dict[str, ServiceStats]:
        return dict(sorted(self._stats.items()))

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def next_call(self, key: Key, at: datetime) -> int:
        """How many calls this key had before this one (a per-key dice index)."""
        seen = self._calls[key]
        self._calls[key] = seen + 1
        self._called_at.setdefault(key[2], []).append(at)
        return seen

    def called_at(self) -> dict[str, list[datetime]]:
        """When each idempotency key was called: whether an attempt reached the remote."""
        return {key: list(times) for key, times in self._called_at.items()}

    def find(self, key: Key) -> Entry | None:
        return self._entries.get(key)

    def closed_by(self, key: Key) -> str | None:
        """The undo key that closed this do-key, if any."""
        return self._closed.get(key)

    def record_do(self, key: Key, order_id: str | None, now: datetime) -> Entry:
        service, action, idempotency_key = key
        entry = Entry(
            effect_id=uuid.uuid4().hex,
            kind="do",
            service=service,
            action=action,
            idempotency_key=idempotency_key,
            order_id=order_id,
            applied_at=now,
        )
        self._entries[key] = entry
        self.stats(service).applied += 1
        return entry

    def record_undo(
        self,
        key: Key,
        order_id: str | None,
        original_action: str,
        original_key: str,
        now: datetime,
    ) -> Entry:
        service, action, undo_key = key
        target = (service, original_action, original_key)
        original = self._entries.get(target)
        outcome: UndoOutcome = "noop"
        if original is not None and original.kind == "do" and original.undone_at is None:
            self._entries[target] = original.model_copy(
                update={"undone_at": now, "undone_by": undo_key}
            )
            outcome = "undone"
        self._closed.setdefault(target, undo_key)
        entry = Entry(
            effect_id=uuid.uuid4().hex,
            kind="undo",
            service=service,
            action=action,
            idempotency_key=undo_key,
            order_id=order_id,
            applied_at=now,
            original_action=original_action,
            original_key=original_key,
            outcome=outcome,
        )
        self._entries[key] = entry
        stats = self.stats(service)
        if outcome == "undone":
            stats.undos_applied += 1
        else:
            stats.undos_noop += 1
        return entry

"""The operators' audit log: one row per action, apart from what it acted on (a purge leaves
it), newest first."""

from __future__ import annotations

import logging
from dataclasses import replace

from sas.domain.model import AuditEntry
from sas.services.ports import StateStore

log = logging.getLogger(__name__)

MAX_ACTOR = 100
MAX_TARGET = 300
MAX_TEXT = 1000
"""What an entry keeps of an actor's name, a target's id, a reason and a detail (a filter is cut
alike, so a long name is found again)."""


def record(store: StateStore, *entries: AuditEntry) -> None:
    """Kept once the action took effect: a failure here loses the entries (logged), never the
    action, which the order's own history records too."""
    if not entries:
        return
    kept = [
        replace(
            entry,
            actor=entry.actor[:MAX_ACTOR],
            target=entry.target[:MAX_TARGET],
            reason=None if entry.reason is None else entry.reason[:MAX_TEXT],
            detail=None if entry.detail is None else entry.detail[:MAX_TEXT],
        )
        for entry in entries
    ]
    try:
        store.append_audit(kept)
    except Exception:  # the action is done: telling the operator it failed would be wrong
        log.exception("sas.audit_write_failed", extra={"entries": len(entries)})

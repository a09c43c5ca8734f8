"""The operators' audit log: one row per action, apart from what it acted on (a purge leaves
it), newest first."""

from __future__ import annotations

import logging

from sas.domain.model import AuditEntry
from sas.services.ports import StateStore

log = logging.getLogger(__name__)


def record(store: StateStore, *entries: AuditEntry) -> None:
    """Kept once the action took effect: a failure here loses the entries (logged), never the
    action, which the order's own history records too."""
    if not entries:
        return
    try:
        store.append_audit(entries)
    except Exception:  # the action is done: telling the operator it failed would be wrong
        log.exception("sas.audit_write_failed", extra={"entries": len(entries)})

"""Operator alerts with a lifecycle: each alert sent is kept open until an operator
acknowledges it or its order leaves the trouble it was sent for (resubmitted, closed,
cancelled, terminated, purged), which is found when the open ones are read. Open alerts are
shown grouped by workflow, step and reason: one group per cause."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from sas.domain.errors import ConcurrencyConflict, InvalidMessage
from sas.domain.model import AlertRecord, AuditEntry, OrderState, ProcessState, Versioned
from sas.domain.wire import MISSING_ALERT_PREFIX
from sas.services import audit
from sas.services.ports import StateStore

log = logging.getLogger(__name__)

MAX_NOTE = 500
MAX_ACKNOWLEDGE = 100


@dataclass(frozen=True)
class AlertGroup:
    """Open alerts of one cause, oldest first."""

    workflow: str
    step: str
    reason: str
    alerts: list[AlertRecord]


def still_owed(record: AlertRecord, state: OrderState | None) -> bool:
    """The order is still in the trouble the alert was sent for: in Error at that attempt, or
    waiting for its workflow version."""
    if state is None:
        return False
    if record.alert_id.startswith(MISSING_ALERT_PREFIX):
        return state.waiting is not None and not state.is_terminal
    return state.process_state is ProcessState.ERROR and state.attempt == record.attempt


def open_groups(store: StateStore, now: datetime) -> list[AlertGroup]:
    """The open alerts by cause, the group with the oldest alert first. One whose order left
    its trouble is cleared on the way (a conditional write; whoever writes first decides)."""
    states: dict[str, OrderState | None] = {}
    groups: dict[tuple[str, str, str], list[AlertRecord]] = {}
    for kept in store.list_alerts():
        record = kept.value
        if record.order_id not in states:
            found = store.get_state(record.order_id)
            states[record.order_id] = None if found is None else found.value
        if not still_owed(record, states[record.order_id]):
            _clear(store, kept, now)
            continue
        groups.setdefault((record.workflow, record.step, record.reason), []).append(record)
    return [AlertGroup(*key, alerts) for key, alerts in groups.items()]


def acknowledge(
    store: StateStore,
    now: datetime,
    alert_ids: Sequence[str],
    *,
    actor: str,
    note: str | None = None,
) -> dict[str, str]:
    """Acknowledge each alert (``acknowledged``, or why not), audited one by one."""
    if not 1 <= len(alert_ids) <= MAX_ACKNOWLEDGE:
        raise InvalidMessage(f"acknowledge 1 to {MAX_ACKNOWLEDGE} alerts at once")
    said = (note or "").strip()[:MAX_NOTE] or None
    outcomes: dict[str, str] = {}
    for alert_id in dict.fromkeys(alert_ids):
        outcomes[alert_id] = _acknowledge_one(store, now, alert_id, actor, said)
    return outcomes


def _acknowledge_one(
    store: StateStore, now: datetime, alert_id: str, actor: str, note: str | None
) -> str:
    kept = store.get_alert(alert_id)
    if kept is None:
        return "not found"
    record = kept.value
    if not record.is_open:
        return "acknowledged already" if record.acknowledged_at else "cleared already"
    done = replace(record, acknowledged_by=actor[: audit.MAX_ACTOR], acknowledged_at=now, note=note)
    if not _written(store, kept, done):
        return "changed meanwhile: try again"
    audit.record(store, AuditEntry(now, actor, "acknowledge", alert_id, note, record.reason))
    log.info("sas.alert_acknowledged", extra={"alert_id": alert_id, "actor": actor[:100]})
    return "acknowledged"


def _clear(store: StateStore, kept: Versioned[AlertRecord], now: datetime) -> None:
    _written(store, kept, replace(kept.value, cleared_at=now))


def _written(store: StateStore, kept: Versioned[AlertRecord], new: AlertRecord) -> bool:
    try:
        store.update_alert(new, kept.etag)
    except ConcurrencyConflict:
        return False
    return True

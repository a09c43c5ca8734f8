"""What the CLI prints: rich tables for people, and with --json the very documents the HTTP API
returns for the same question (its views), so a script can move between the two."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from sas.domain.breaker import BreakerStatus
from sas.domain.model import AuditEntry, OrderState, ProcessState
from sas.domain.parked import ParkedMessage
from sas.entrypoints.health_api import HealthView
from sas.entrypoints.http_api import AuditView
from sas.entrypoints.order_views import OrderView, StateView
from sas.entrypoints.parked_api import ParkedView
from sas.services.alert_book import AlertGroup
from sas.services.health import HealthReport
from sas.services.operator import OrderDetail


def print_json(console: Console, document: Any) -> None:
    console.print_json(json.dumps(document, default=str), indent=2)


def audit_document(entry: AuditEntry) -> dict[str, Any]:
    return AuditView(**vars(entry)).model_dump(mode="json")


def state_document(state: OrderState) -> dict[str, Any]:
    return StateView.of(state).model_dump(mode="json")


def detail_document(detail: OrderDetail) -> dict[str, Any]:
    return OrderView.of_detail(detail).model_dump(mode="json")


def parked_document(message: ParkedMessage, age_seconds: float | None) -> dict[str, Any]:
    """What GET /api/parked shows of one message."""
    return ParkedView.of(message, age_seconds).model_dump(mode="json")


WHOLE_COLUMNS = frozenset({"order", "id"})
"""Never shortened, whatever the terminal's width: an operator copies an id to act on it."""


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    cells = [[_cell(cell) for cell in row] for row in rows]
    shown = Table(title=Text(title), title_justify="left")  # user text in it: never markup
    for index, column in enumerate(columns):
        if column in WHOLE_COLUMNS:
            widest = max((len(row[index]) for row in cells), default=0)
            shown.add_column(column, no_wrap=True, min_width=max(widest, len(column)))
        else:
            shown.add_column(column, overflow="fold")  # wrapped when short of room, never cut
    for row in cells:
        shown.add_row(*row)
    return shown


def _cell(value: Any) -> Text:
    """A table cell as plain text: what the app stored (a reason, a result) is never markup."""
    if value is None:
        return Text("")
    if isinstance(value, Text):
        return value
    if isinstance(value, datetime):
        return Text(at(value))
    return Text(str(value))


def at(moment: datetime | None) -> str:
    """Every time the CLI shows, as the dashboard shows it: to the second, in UTC, saying so."""
    if moment is None:
        return ""
    try:
        utc = moment.astimezone(UTC) if moment.tzinfo is not None else moment
    except OverflowError:  # no UTC time exists for it (year 1 with an offset): as it came
        return moment.isoformat()
    return utc.strftime("%Y-%m-%d %H:%M:%S UTC")


def step_name(state: OrderState) -> str:
    """A step as the dashboard names it too: ``charge``, or ``charge (undo)`` being undone."""
    name = str(StateView.of(state).step)
    return f"{name} (undo)" if state.mode == "undo" else name


def state_name(state: OrderState) -> str:
    """A state as the dashboard names it too: ``Pending (undo)`` for an undo step waiting."""
    name = state.process_state.value
    undoing = state.process_state is ProcessState.PENDING and state.mode == "undo"
    return f"{name} (undo)" if undoing else name


def _state_at_step(state: OrderState) -> str:
    """``Processing at charge``, ``Compensating at charge (undo)``, ``Pending (undo) at charge``:
    the undo said once."""
    name = state_name(state)
    step = str(StateView.of(state).step) if name.endswith("(undo)") else step_name(state)
    return f"{name} at {step}"


def states_table(title: str, states: Sequence[OrderState]) -> Table:
    columns = ("order", "state", "priority", "step", "attempt", "failures", "updated", "last error")
    rows = [
        (s.order_id, state_name(s), s.priority, step_name(s), s.attempt, s.failure_count,
         s.updated_at, s.last_error)
        for s in states
    ]  # fmt: skip
    return table(title, columns, rows)


def status(state: OrderState) -> RenderableType:
    view = StateView.of(state).model_dump()
    lines = [
        f"[bold]{state.order_id}[/] {_state_at_step(state)}, "
        f"attempt {state.attempt}, failures {state.failure_count}, "
        f"priority {state.priority}",
        f"workflow {state.workflow} v{state.version}; submitted {at(state.submitted_at)}, "
        f"updated {at(state.updated_at)}"
        + (f", finished {at(state.finished_at)}" if state.finished_at else ""),
    ]
    if state.locked_by or state.complete_by:
        lines.append(f"held by {state.locked_by or '-'} until {at(state.complete_by) or '-'}")
    if state.not_before:
        lines.append(f"not before {at(state.not_before)}")
    if state.waiting:
        lines.append(f"waiting: {state.waiting}")
    # Shown only when the app records one (tracing may be off).
    if view.get("trace_id"):
        lines.append(f"trace id {view['trace_id']}")
    shown: list[RenderableType] = [Text.from_markup(line) for line in lines]
    if state.last_error:
        shown.append(Text(f"last error: {state.last_error}"))
    return Group(*shown)


def timeline(detail: OrderDetail) -> RenderableType:
    history = [
        (h.at, h.kind, h.step, h.mode, h.attempt, h.endpoint, h.actor, h.detail)
        for h in detail.history
    ]
    events = ("at", "event", "step", "mode", "attempt", "endpoint", "by", "detail")
    steps = [
        (s.index, s.name, s.attempt, s.completed_at, Text(json.dumps(s.result)))
        for s in detail.steps
    ]
    return Group(
        status(detail.state),
        Text(f"input: {json.dumps(detail.order.details)}"),  # data, never markup
        table("history", events, history),
        table("completed steps", ("#", "step", "attempt", "at", "result"), steps),
    )


def counts_table(counts: Mapping[ProcessState, int]) -> Table:
    return table(
        "orders by state",
        ("state", "orders"),
        [(state.value, counts.get(state, 0)) for state in ProcessState],
    )


def failures_table(failures: Sequence[OrderState]) -> Table:
    rows = [(s.updated_at, s.order_id, state_name(s), step_name(s), s.last_error) for s in failures]
    return table("recent failures", ("at", "order", "state", "step", "last error"), rows)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m"
    if whole < 172800:
        return f"{whole // 3600}h"
    return f"{whole // 86400}d"


def body_preview(text: str | None) -> str:
    return (text if text is not None else "<binary>")[:60]


def parked_table(title: str, documents: Sequence[Mapping[str, Any]]) -> Table:
    """Parked messages as ``parked_document`` shows them, numbered (the ids follow the table,
    whole, to be copied)."""
    columns = ("#", "by", "parked", "queue", "age", "deliveries", "reason", "body")
    rows = [
        (
            number,
            m["parked_by"],
            _parsed(m["parked_at"]),
            m["queue"],
            age(m["age_seconds"]),
            m["delivery_count"],
            m["reason"],
            body_preview(m["body_text"]),
        )
        for number, m in enumerate(documents, 1)
    ]
    return table(title, columns, rows)


def _parsed(moment: str | None) -> datetime | None:
    return None if moment is None else datetime.fromisoformat(moment)


def health_document(report: HealthReport) -> dict[str, Any]:
    """What GET /api/health/report shows."""
    return HealthView.of(report).model_dump(mode="json")


def health(report: HealthReport, alerts_queue: str) -> RenderableType:
    """Throughput (the buckets where anything happened), endpoints, then the waiting alerts."""
    minutes = int(report.bucket.total_seconds() // 60)
    rate = "-" if report.failure_rate is None else f"{report.failure_rate:.1%}"
    submitted = sum(b.submitted for b in report.buckets)
    summary = (
        f"since {at(report.since)}: {submitted} submitted, {report.finished} finished, "
        f"{report.failed} failed (failure rate {rate})"
    )
    busy = [b for b in report.buckets if b.submitted or b.finished]
    columns = (
        "from", "submitted", "processed", "compensated", "error", "closed", "cancelled",
        "terminated",
    )  # fmt: skip
    rows = [(b.start, b.submitted, *(b.finished.get(s, 0) for s in _FINISHED)) for b in busy]
    endpoints = [
        (
            e.target,
            e.breaker.value,
            f"{e.failures}/{e.calls}",
            e.opened_until if e.breaker is not BreakerStatus.CLOSED else None,
            f"{e.in_flight}/{e.capacity}" if e.capacity is not None else e.in_flight,
            e.processes,
        )
        for e in report.endpoints
    ]
    waiting = "?" if report.alerts_waiting is None else report.alerts_waiting
    missing = [
        Text(f"{w.orders} order(s) wait: {w.reason}: deploy it again, or close them")
        for w in report.waiting
    ]
    if report.saturated:
        missing.insert(0, Text(saturation(report.retries_held_back or 0), style="bold"))
    return Group(
        Text(summary),
        *missing,
        table(f"orders per {minutes} min (only those with any)", columns, rows),
        table(
            "remote endpoints",
            ("endpoint", "breaker", "failed/calls 30 s", "open until", "in flight", "processes"),
            endpoints,
        ),
        alert_groups(report.open_alerts, f"; {waiting} message(s) in {alerts_queue}"),
    )


def alert_groups(groups: Sequence[AlertGroup], more: str = "") -> Table:
    """Open alerts, a row per cause: how many, since when, and the ids to acknowledge."""
    rows = [
        (
            g.workflow or "-",
            g.step or "-",
            g.reason,
            len(g.alerts),
            g.alerts[0].at,
            g.alerts[-1].at,
            " ".join(a.alert_id for a in g.alerts[:5]) + (" ..." if len(g.alerts) > 5 else ""),
        )
        for g in groups
    ]
    columns = ("workflow", "step", "reason", "alerts", "first", "last", "ids")
    return table(
        f"open alerts, by cause: {sum(len(g.alerts) for g in groups)}{more}", columns, rows
    )


def saturation(held_back: int) -> str:
    return (
        f"saturated: {held_back} expired step(s) waited for the retry budget in the last "
        "minute (no failure counted; they are retried as work finishes)"
    )


_FINISHED = (
    ProcessState.PROCESSED,
    ProcessState.COMPENSATED,
    ProcessState.ERROR,
    ProcessState.CLOSED,
    ProcessState.CANCELLED,
    ProcessState.TERMINATED,
)

"""What `make run` prints at the end, to be read at a glance: how the orders ended (per
workflow), what went wrong and what the app did about it, what the ledgers prove, and latency
by priority with the comparison that is fair to high priority."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from sas.domain.messages import OrderSubmitted
from sas.domain.model import ProcessState
from sas_local.ledger import LedgerReport

MEANING = {
    ProcessState.PROCESSED: "every step done",
    ProcessState.COMPENSATED: "could not finish: every effect undone",
    ProcessState.ERROR: "stopped for an operator (an alert each): not finished, not undone",
    ProcessState.CLOSED: "settled by an operator",
}


@dataclass(frozen=True)
class DemoRun:
    batch: Sequence[OrderSubmitted]
    """In the order they were sent."""
    outcomes: Mapping[str, ProcessState]
    latency: Mapping[str, float]
    """Seconds from each order's own send to its final status."""
    elapsed: float
    history: Counter[str]
    """History rows by kind, over every order."""
    ledger: LedgerReport
    alerts: int
    crash: str
    status_events: int
    python_injected: Mapping[str, int]
    endpoints: Mapping[str, Mapping[str, int]]


def render(run: DemoRun) -> RenderableType:
    return Group(_outcomes(run), _trouble(run), _proof(run), _latency(run))


def _outcomes(run: DemoRun) -> Table:
    orders = len(run.batch)
    rate = f"{orders / run.elapsed:.1f} orders/s" if run.elapsed else "-"
    table = Table(
        title=f"sas demo: {orders} orders in {timedelta(seconds=round(run.elapsed))} ({rate})",
        title_justify="left",
    )
    workflows = list(dict.fromkeys(order.workflow for order in run.batch))
    table.add_column("ended")
    for name in workflows:
        table.add_column(name, justify="right")
    table.add_column("all", justify="right")
    table.add_column("meaning")
    by_workflow = {name: Counter[ProcessState]() for name in workflows}
    for order in run.batch:
        by_workflow[order.workflow][run.outcomes[order.order_id]] += 1
    for state in ProcessState:
        counts = [by_workflow[name][state] for name in workflows]
        if sum(counts):
            meaning = MEANING.get(state, "not finished")
            table.add_row(state.value, *map(str, counts), str(sum(counts)), meaning)
    return table


def _trouble(run: DemoRun) -> Table:
    table = _two_columns("what went wrong, and what the app did")
    report, history = run.ledger, run.history
    table.add_row(
        "injected at the remote services",
        f"{report.transient_failures} transient errors ({report.throttled} of them 429s), "
        f"{report.permanent_failures} refusals, {report.slow_responses} answers past the "
        f"deadline, {report.outage_rejections} calls refused during the outage",
    )
    if run.python_injected:
        table.add_row(
            "injected in the Python actions",
            ", ".join(
                f"{n} {kind.removeprefix('python_').replace('_', ' ')}"
                for kind, n in sorted(run.python_injected.items())
            ),
        )
    table.add_row("agent worker killed", run.crash)
    recoveries = sum(n for kind, n in history.items() if kind.startswith("expired_"))
    table.add_row(
        "steps past their deadline (Supervisor)",
        f"{recoveries}: {history['expired_retry']} tried again, "
        f"{history['expired_compensate']} undone, {history['expired_error']} left in Error",
    )
    table.add_row("steps refused for good", str(history["refused"]))
    table.add_row("late or duplicate replies ignored", str(history["reply_dropped"]))
    table.add_row("operator alerts", f"{run.alerts} (one per order in Error)")
    for name, stats in sorted(run.endpoints.items()):
        table.add_row(
            f"payment endpoint {name}",
            f"{stats['calls']} calls, at most {stats['max_in_flight']} at once, "
            f"{stats['saturated']} refused as full, {stats['down_rejections']} refused as down",
        )
    return table


def _proof(run: DemoRun) -> Table:
    report = run.ledger
    table = _two_columns("what the ledgers prove")
    services = ", ".join(f"{name} {n}" for name, n in sorted(report.by_service.items()))
    table.add_row("effects applied / undone", f"{report.effects} / {report.undone} ({services})")
    table.add_row("repeated calls answered from the ledger", str(report.replays))
    table.add_row("effects left applied in Error orders", str(report.outstanding_in_error))
    table.add_row("status events received", str(run.status_events))
    table.add_row(
        "check",
        "ok: no effect applied twice, every compensated order undone"
        if report.ok
        else f"{len(report.problems)} problem(s)",
    )
    return table


def _latency(run: DemoRun) -> RenderableType:
    table = _two_columns("latency, from each order's send to its end (p50 / p95)")
    latencies = list(run.latency.values())
    table.add_row("all", _p50_p95(latencies))
    for priority in ("high", "normal", "low"):
        found = [run.latency[o.order_id] for o in _sent(run, priority)]
        if found:
            table.add_row(priority, _p50_p95(found))
    high = _sent(run, "high")
    normal = _sent(run, "normal")
    if high and normal:
        # High orders are sent last, into the backlog the others made: the fair comparison is
        # with the normal orders sent just before them, which met the same backlog.
        last = [run.latency[o.order_id] for o in normal[-len(high) :]]
        table.add_row(f"normal, the last {len(last)} sent (just before high)", _p50_p95(last))
    note = Text(
        "High-priority orders are sent last, into the backlog the others made, and take queues "
        "of their own; a Storage queue found empty is polled less and less often, up to "
        "maxPollingInterval (host.json: 2 s) per hop, while the busy normal queues are read at "
        "once. In a run this short that wait can cost more than the backlog it skips: compare "
        "with the normal orders sent just before. Faults are drawn from the seed per "
        "call: the same seed answers the same call the same way, but how many calls a run makes "
        "depends on timing (retries, expiries, the crash), so the counts vary between runs.",
        style="dim",
    )
    return Group(table, note)


def _sent(run: DemoRun, priority: str) -> list[OrderSubmitted]:
    return [o for o in run.batch if o.priority == priority and o.order_id in run.latency]


def _two_columns(title: str) -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    return table


def _p50_p95(values: list[float]) -> str:
    return f"{percentile(values, 50):.1f} s / {percentile(values, 95):.1f} s ({len(values)})"


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def describe_faults(remote: Mapping[str, object], python: Mapping[str, object]) -> list[str]:
    """The injected faults in words, for the start of the run."""

    def share(config: Mapping[str, object], key: str) -> str:
        return f"{float(str(config.get(key, 0))):.0%}"

    lines = [
        f"faults at the remote services (seed {remote.get('seed')}): "
        f"{share(remote, 'transient_rate')} of calls fail for a while, "
        f"{share(remote, 'permanent_rate')} are refused, "
        f"{share(remote, 'undo_permanent_rate')} of undos are refused (Error), "
        f"{share(remote, 'slow_rate')} answer after {remote.get('slow_seconds')} s "
        f"(past the step's deadline); {remote.get('outage_service')} is down for "
        f"{remote.get('outage_seconds')} s after {remote.get('outage_start')} s",
    ]
    endpoints = remote.get("endpoints")
    if isinstance(endpoints, Mapping):
        down = [
            name for name, how in endpoints.items() if isinstance(how, Mapping) and how.get("down")
        ]
        if down:
            lines.append(f"endpoints down for the whole run: {', '.join(map(str, down))}")
    if python:
        lines.append(
            f"faults in the Python actions (seed {python.get('seed')}): "
            f"{share(python, 'transient_rate')} fail for a while, "
            f"{share(python, 'lost_reply_rate')} lose their reply after the effect, "
            f"{share(python, 'slow_rate')} run past the deadline, "
            f"{share(python, 'permanent_rate')} are refused"
        )
    return lines

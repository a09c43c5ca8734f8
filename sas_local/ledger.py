"""Reads the simulated remote service's ledger, and the Python agents' effects (rows of their
tables: ``app_effects``), and checks effects against order outcomes.

The ledger (sas_local/simulator/books.py) lists do-entries (`undone_at`/`undone_by` once undone) and
undo-entries (`original_action`/`original_key`, outcome `undone` or `noop`). The checks:

- no do-effect applied twice for one (order, service, action), none undone twice;
- a Processed order has exactly one do-effect per workflow step, and none of them undone;
- a Compensated or Cancelled order has every applied do-effect undone;
- an Error order is reported with its applied-and-not-undone count, not failed: an operator
  owns it now (resubmit or compensate by hand);
- an entry for an order that is not in the outcomes is a problem.

Orders still in flight (Pending, Processing, Compensating) are only checked for duplicates.
States are compared by value so this works whichever ProcessState members exist.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import httpx
from azure.data.tables import TableServiceClient

from sas.domain.model import ProcessState
from sas.domain.workflow import Workflow

Entry = Mapping[str, object]

# Simulator counter -> LedgerReport field (summed over services).
_COUNTERS = {
    "transient_failures": "transient_failures",
    "throttled": "throttled",
    "permanent_failures": "permanent_failures",
    "refused_after_undo": "refused_after_undo",
    "slow": "slow_responses",
    "outage_rejections": "outage_rejections",
}


@dataclass(frozen=True)
class LedgerReport:
    effects: int
    """Do-effects applied (each counted once, undone or not)."""
    by_service: Mapping[str, int]
    """Do-effects applied per service."""
    replays: int
    problems: list[str] = field(default_factory=list)
    undone: int = 0
    """Do-effects later undone by a compensating action."""
    undos_noop: int = 0
    """Undo calls that found nothing to undo (the do had never been applied)."""
    transient_failures: int = 0
    """Injected 503/429 answers (429s also counted in `throttled`)."""
    throttled: int = 0
    permanent_failures: int = 0
    """Injected business refusals."""
    refused_after_undo: int = 0
    """Late do-calls refused because their key had already been undone."""
    slow_responses: int = 0
    outage_rejections: int = 0
    error_orders: Mapping[str, int] = field(default_factory=dict)
    """Error order -> its do-effects applied and not undone (for the operator, not a problem)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def outstanding_in_error(self) -> int:
        return sum(self.error_orders.values())


def fetch_ledger(simulator_url: str) -> dict[str, object]:
    response = httpx.get(f"{simulator_url}/ledger", timeout=10)
    response.raise_for_status()
    ledger: dict[str, object] = response.json()
    return ledger


def app_effects(connection_string: str, tables: Iterable[str]) -> list[dict[str, object]]:
    """The Python agents' effects as ledger entries: each row of their tables one effect,
    PartitionKey the order, RowKey the idempotency key (as workflows/workspace.py keeps them)."""
    service = TableServiceClient.from_connection_string(connection_string)
    return [
        {
            "kind": "do",
            "service": row.get("Agent"),
            "action": row.get("Action"),
            "idempotency_key": row["RowKey"],
            "order_id": row["PartitionKey"],
        }
        for table in tables
        for row in service.get_table_client(table).list_entities()
    ]


def configure_faults(simulator_url: str, faults: Mapping[str, object]) -> dict[str, object]:
    """Replace the simulator's fault config (fields as `sas_local.simulator.FaultConfig`)."""
    response = httpx.put(f"{simulator_url}/faults", json=dict(faults), timeout=10)
    response.raise_for_status()
    config: dict[str, object] = response.json()
    return config


def check_effects(
    ledger: Mapping[str, object],
    outcomes: Mapping[str, ProcessState],
    workflow: Workflow | Mapping[str, Workflow],
) -> LedgerReport:
    """Check the ledger against the final (or current) state of each order; see module doc.
    ``workflow``: every order's, or each order's by its id."""
    entries = _entries(ledger.get("effects"))
    dos = [e for e in entries if e.get("kind", "do") != "undo"]  # old ledgers had no kind
    undos = [e for e in entries if e.get("kind") == "undo"]
    problems = _duplicates(dos, undos)

    by_order: dict[str, list[Entry]] = defaultdict(list)
    for entry in dos:
        by_order[str(entry.get("order_id"))].append(entry)
    error_orders: dict[str, int] = {}
    for order_id, state in outcomes.items():
        applied = by_order.get(order_id, [])
        name = _state_name(state)
        if name == "Processed":
            steps_of = workflow if isinstance(workflow, Workflow) else workflow[order_id]
            problems += _processed_problems(order_id, applied, steps_of)
        elif name in ("Compensated", "Cancelled"):
            problems += [
                f"{order_id}: {_label(e)} applied but not undone (order {name})"
                for e in applied
                if not _undone(e)
            ]
        elif name == "Error":
            error_orders[order_id] = sum(not _undone(e) for e in applied)

    strangers = {str(e.get("order_id")) for e in entries} - set(outcomes)
    problems.extend(f"effect for unknown order {order}" for order in sorted(strangers))
    totals = _counter_totals(ledger.get("stats"))
    replays = ledger.get("replays")
    return LedgerReport(
        effects=len(dos),
        by_service=dict(Counter(str(e.get("service")) for e in dos)),
        replays=replays if isinstance(replays, int) else totals.pop("replays", 0),
        problems=problems,
        undone=sum(_undone(e) for e in dos),
        undos_noop=sum(e.get("outcome") == "noop" for e in undos),
        error_orders=error_orders,
        **{field_: totals.get(counter, 0) for counter, field_ in _COUNTERS.items()},
    )


def _duplicates(dos: list[Entry], undos: list[Entry]) -> list[str]:
    applied = Counter((str(e.get("order_id")), _label(e)) for e in dos)
    problems = [
        f"{order}: {label} applied {count} times"
        for (order, label), count in applied.items()
        if count > 1
    ]
    undone = Counter(
        (str(e.get("order_id")), str(e.get("service")), str(e.get("original_key")))
        for e in undos
        if e.get("outcome") == "undone"
    )
    problems += [
        f"{order}: {service} effect {key} undone {count} times"
        for (order, service, key), count in undone.items()
        if count > 1
    ]
    return problems


def _processed_problems(order_id: str, applied: list[Entry], workflow: Workflow) -> list[str]:
    per_step = Counter(_label(e) for e in applied)
    problems = [
        f"{order_id}: {step.agent}.{step.action} not applied exactly once"
        for step in workflow.steps
        if per_step[f"{step.agent}.{step.action}"] != 1
    ]
    problems += [
        f"{order_id}: {_label(e)} undone but order Processed" for e in applied if _undone(e)
    ]
    return problems


def _entries(raw: object) -> list[Entry]:
    if not isinstance(raw, Iterable) or isinstance(raw, str | bytes | Mapping):
        return []
    return [e for e in raw if isinstance(e, Mapping)]


def _counter_totals(raw: object) -> Counter[str]:
    """Sum the simulator's per-service counters; an older simulator without them gives zeros."""
    totals: Counter[str] = Counter()
    if isinstance(raw, Mapping):
        for counters in raw.values():
            if isinstance(counters, Mapping):
                totals.update({k: v for k, v in counters.items() if isinstance(v, int)})
    return totals


def _state_name(state: object) -> str:
    return str(getattr(state, "value", state))


def _label(entry: Entry) -> str:
    return f"{entry.get('service')}.{entry.get('action')}"


def _undone(entry: Entry) -> bool:
    return entry.get("undone_at") is not None

"""`python -m sas_local.skew`: the same orders under hosts whose clocks are off.

Runs one batch of orders through the local stack (agents in a dev host of their own) once per
case: no host off, then one host's clock off by a number of seconds (``sas_local.host_clock``),
with the same seeded remote faults, so each order meets the same answers in every case. Prints,
per case, how each order ended, what differs from the case with no host off, the agents' give-ups
and late replies, the steps expired, and the clock reports the app logged (``sas.clock_offset``).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient

from sas import settings as settings_module
from sas.domain.model import TERMINAL_STATES
from sas_local.devhost.worker import PRELOAD_ENV
from sas_local.host_clock import OFFSET_ENV
from sas_local.stack import LocalStack

TERMINAL = frozenset(state.value for state in TERMINAL_STATES)
FAULTS = {
    "seed": 7,
    "transient_rate": 0.1,
    "permanent_rate": 0.1,
    "slow_rate": 0.2,
    "slow_seconds": 8.0,
}
"""Transient faults an agent retries within its deadline, business refusals, and answers that
take 8 s of a step's 15: each order meets the same answers whatever the timing (the simulator's
dice are per key and call), and every step fits its whole budget."""
CASES: dict[str, tuple[str, float]] = {
    "no host off": ("devhost", 0.0),
    "Scheduler 9 s behind": ("devhost", -9.0),
    "Scheduler 9 s ahead": ("devhost", 9.0),
    "agents 30 s behind": ("agents", -30.0),
    "agents 30 s ahead": ("agents", 30.0),
}
"""Case -> (the dev host whose clock is off: the Scheduler's, Supervisor's and submission's, or
the agents'; seconds)."""
_REPORT = re.compile(r"sas\.clock_offset host=(\S+) offset=(\S+)s")


@dataclass
class SkewRun:
    case: str
    host: str
    offset: float
    outcomes: dict[str, str]
    seconds: float
    gave_up: int = 0
    late: int = 0
    """Replies an agent suppressed because its call ended past the deadline."""
    arrived_expired: int = 0
    """Requests an agent dropped unread: past their deadline on arrival."""
    expired: int = 0
    """Steps the Supervisor expired."""
    clock_reports: list[tuple[str, float]] = field(default_factory=list)
    """(host, offset) of every ``sas.clock_offset`` warning logged."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def order_body(order_id: str) -> str:
    order = {
        "type": "OrderSubmitted",
        "order_id": order_id,
        "details": {
            "customer_id": "skew",
            "currency": "EUR",
            "address": "1 Clock Street",
            "lines": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 1999}],
        },
    }
    return base64.b64encode(json.dumps(order).encode()).decode()


def run(
    case: str,
    host: str,
    offset: float,
    *,
    orders: int,
    allowance: float = 10.0,
    timeout: float = 240.0,
    log_dir: Path | None = None,
) -> SkewRun:
    """One batch, ``host``'s clock ``offset`` seconds off, every allowance ``allowance``."""
    logs = log_dir or Path(tempfile.mkdtemp(prefix="sas-skew-"))
    skewed = {PRELOAD_ENV: "sas_local.host_clock", OFFSET_ENV: f"{offset:g}"} if offset else {}
    started = time.monotonic()
    with LocalStack.start(
        workers=1,
        log_dir=logs,
        agents_apart=True,
        env_overrides={settings_module.CLOCK_SKEW_SECONDS: f"{allowance:g}"},
        host_env={host: skewed},
    ) as stack:
        httpx.put(f"{stack.simulator_url}/faults", json=FAULTS, timeout=30).raise_for_status()
        conn = stack.azurite.connection_string
        queue = QueueClient.from_connection_string(conn, stack.settings.queue("SAS_QUEUE_ORDERS"))
        table = TableClient.from_connection_string(conn, stack.settings.table_name)
        ids = [f"skew-{n:03d}" for n in range(orders)]
        for order_id in ids:
            queue.send_message(order_body(order_id))
        outcomes = _wait_for_outcomes(table, ids, timeout)
        expired = sum(
            1
            for _ in table.query_entities(
                "Kind ge 'expired_' and Kind lt 'expired`'", select=["Kind"]
            )
        )
    seconds = round(time.monotonic() - started, 1)
    events = _log_events(logs)
    return SkewRun(
        case,
        host,
        offset,
        outcomes,
        seconds,
        gave_up=events["sas.agent_gave_up"],
        late=events["sas.step_reply_suppressed_late"],
        arrived_expired=events["sas.step_request_expired"],
        expired=expired,
        clock_reports=_clock_reports(logs),
    )


def _wait_for_outcomes(table: TableClient, ids: list[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    outcomes: dict[str, str] = {}
    while time.monotonic() < deadline:
        query = "RowKey eq 'state'"
        rows = table.query_entities(query, select=["PartitionKey", "ProcessState"])
        outcomes = {r["PartitionKey"]: r["ProcessState"] for r in rows}
        if len(outcomes) == len(ids) and set(outcomes.values()) <= TERMINAL:
            break
        time.sleep(1.0)
    return {order_id: outcomes.get(order_id, "missing") for order_id in ids}


def _log_lines(logs: Path) -> list[str]:
    lines: list[str] = []
    for path in sorted(logs.glob("*/*.log")):
        lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    return lines


def _log_events(logs: Path) -> Counter[str]:
    wanted = ("sas.agent_gave_up", "sas.step_reply_suppressed_late", "sas.step_request_expired")
    found: Counter[str] = Counter()
    for line in _log_lines(logs):
        for event in wanted:
            if event in line:
                found[event] += 1
    return found


def _clock_reports(logs: Path) -> list[tuple[str, float]]:
    return [
        (match.group(1), float(match.group(2)))
        for line in _log_lines(logs)
        if (match := _REPORT.search(line))
    ]


def compare(runs: list[SkewRun]) -> list[dict[str, object]]:
    """Each case against the first: the orders that ended otherwise."""
    base = runs[0].outcomes
    rows = []
    for r in runs:
        differ = sorted(o for o, ps in r.outcomes.items() if base.get(o) != ps)
        rows.append(
            {
                "case": r.case,
                "outcomes": dict(Counter(r.outcomes.values())),
                "ended otherwise": differ,
                "gave up": r.gave_up,
                "late": r.late,
                "arrived expired": r.arrived_expired,
                "expired": r.expired,
                "clock reports": r.clock_reports,
                "seconds": r.seconds,
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sas_local.skew", description=__doc__)
    p.add_argument("--orders", type=int, default=24)
    p.add_argument("--allowance", type=float, default=10.0, help="SAS_CLOCK_SKEW_SECONDS")
    args = p.parse_args()
    runs = [
        run(case, host, offset, orders=args.orders, allowance=args.allowance)
        for case, (host, offset) in CASES.items()
    ]
    rows = compare(runs)
    print(json.dumps(rows, indent=2))
    print(
        "\n| case | outcomes | ended otherwise | agent give-ups | late replies | expired "
        "| clock reports |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        outcomes = ", ".join(f"{n} {ps}" for ps, n in sorted(row["outcomes"].items()))  # type: ignore[attr-defined]
        reports = "; ".join(f"{h} {o:+.1f} s" for h, o in row["clock reports"])  # type: ignore[attr-defined]
        print(
            f"| {row['case']} | {outcomes} | {len(row['ended otherwise'])} "  # type: ignore[arg-type]
            f"| {row['gave up']} | {row['late']} | {row['expired']} | {reports or '-'} |"
        )


if __name__ == "__main__":
    main()

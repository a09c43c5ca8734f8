"""Recovery latency: from the deadline of a step whose agent died to its re-dispatch.

The whole local stack (Azurite, the simulator, the dev host with its Supervisor timer on the
local period). The inventory service is down for a little longer than one step budget, so the
first attempt of every order's first step gets no answer and sends no reply, exactly as if its
agent had been killed holding the request; the Supervisor must notice the passed deadline
and have the step dispatched again. Measured from each order's history: the second claim's
time minus the first attempt's deadline (first claim + the step budget).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient

from sas import settings as settings_module
from sas_local.bench.e2e import _body
from sas_local.processes import REPO_ROOT
from sas_local.stack import LocalStack

BUDGET_S = 15.0  # the order workflow's step budget (sas/domain/workflow.py)


def measure(
    *, orders: int, log_dir: Path, app_root: Path | None = None, timeout: float = 120.0
) -> dict[str, Any]:
    with LocalStack.start(workers=1, log_dir=log_dir, app_root=app_root or REPO_ROOT) as stack:
        conn = stack.azurite.connection_string
        faults = {"outage_service": "inventory", "outage_start": 0, "outage_seconds": BUDGET_S + 1}
        httpx.put(f"{stack.simulator_url}/faults", json=faults, timeout=10).raise_for_status()
        queue = QueueClient.from_connection_string(conn, stack.settings.queues["SAS_QUEUE_ORDERS"])
        table = TableClient.from_connection_string(conn, stack.settings.table_name)
        ids = [f"rec-{n:03d}" for n in range(orders)]
        for order_id in ids:
            queue.send_message(_body(order_id))
        latencies: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(latencies) < len(ids):
            time.sleep(1.0)
            for order_id in ids:
                if order_id not in latencies:
                    found = _latency(table, order_id)
                    if found is not None:
                        latencies[order_id] = found
        period = _period(stack.env.get(settings_module.SUPERVISOR_SCHEDULE, ""))
        skew = stack.settings.clock_skew_seconds
    values = sorted(latencies.values())
    return {
        "orders": orders,
        "recovered": len(values),
        "budget_s": BUDGET_S,
        "period_s": period,
        "clock_skew_s": skew,
        "reply_in_flight_s": reply_in_flight_s(app_root or REPO_ROOT),
        "target_s": BUDGET_S + period + 1,
        "p50_s": round(statistics.median(values), 2) if values else None,
        "max_s": round(values[-1], 2) if values else None,
        "latencies_s": [round(v, 2) for v in values],
    }


_IN_FLIGHT = re.compile(r"reply_in_flight: timedelta = timedelta\(seconds=([0-9.]+)\)")


def reply_in_flight_s(app_root: Path) -> float | None:
    """The commit's hold for a reply a host has taken (``RetryPolicy.reply_in_flight``), from
    its source: the commit measured may not be the one running this (None: it has none)."""
    source = (app_root / "sas/domain/transitions.py").read_text(encoding="utf-8")
    found = _IN_FLIGHT.search(source)
    return float(found.group(1)) if found else None


def _latency(table: TableClient, order_id: str) -> float | None:
    claims = {}
    for row in table.query_entities(
        "PartitionKey eq @pk and Kind eq 'claimed'", parameters={"pk": order_id}
    ):
        claims[int(row["Attempt"])] = row["At"]
    if 1 not in claims or 2 not in claims:
        return None
    seconds: float = (claims[2] - claims[1]).total_seconds()
    return seconds - BUDGET_S


def _period(schedule: str) -> float:
    """Seconds between ticks of a six-field cron ``*/N * * * * *``."""
    head = schedule.split(" ")[0]
    return float(head[2:]) if head.startswith("*/") else float("nan")


if __name__ == "__main__":  # a quick look on its own: python -m sas_local.bench.recovery
    import tempfile

    print(json.dumps(measure(orders=3, log_dir=Path(tempfile.mkdtemp())), indent=2))

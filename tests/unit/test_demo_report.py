"""What `make run` prints at its end (sas_local/demo_report.py): plain words a person reads at
a glance, outcomes per workflow, and the latency comparison that is fair to high priority."""

from __future__ import annotations

import io
from collections import Counter

from rich.console import Console

from sas.domain.model import ProcessState
from sas_local.demo import FAULTS, PYTHON_FAULTS, demo_order, demo_workspace
from sas_local.demo_report import DemoRun, describe_faults, render
from sas_local.ledger import LedgerReport


def printed(run: DemoRun) -> str:
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    console.print(render(run))
    return console.export_text()


def a_run() -> DemoRun:
    orders = [demo_order(i, "t") for i in range(6)]
    workspaces = [demo_workspace(i, "t") for i in range(6, 8)]
    high = [o.model_copy(update={"priority": "high"}) for o in (demo_order(8, "t"),)]
    batch = [*orders, *workspaces, *high]
    outcomes = {o.order_id: ProcessState.PROCESSED for o in batch}
    outcomes[orders[0].order_id] = ProcessState.COMPENSATED
    outcomes[workspaces[0].order_id] = ProcessState.ERROR
    # Normal orders sent first finish fast; the last one and the high one met the backlog.
    latency = {o.order_id: 1.0 for o in batch}
    latency[workspaces[-1].order_id] = 9.0
    latency[high[0].order_id] = 4.0
    return DemoRun(
        batch=batch,
        outcomes=outcomes,
        latency=latency,
        elapsed=10.0,
        history=Counter({"expired_retry": 2, "expired_compensate": 1, "reply_dropped": 3}),
        ledger=LedgerReport(
            effects=20,
            by_service={"payment": 8, "inventory": 12},
            replays=2,
            undone=1,
            transient_failures=5,
            throttled=2,
        ),
        alerts=1,
        crash="killed worker 2",
        status_events=30,
        python_injected={"python_transient": 2, "python_lost_reply": 1},
        endpoints={"north": {"calls": 9, "max_in_flight": 3, "saturated": 0, "down_rejections": 0}},
    )


def test_the_summary_is_words_and_numbers_never_python_reprs():
    text = printed(a_run())
    assert "ProcessState" not in text and "{" not in text and "['" not in text
    assert "9 orders in 0:00:10 (0.9 orders/s)" in text
    assert "3: 2 tried again, 1 undone, 0 left in Error" in text
    assert "5 transient errors (2 of them 429s)" in text
    assert "1 lost reply, 2 transient" in text
    assert "(inventory 12, payment 8)" in text


def test_outcomes_are_counted_per_workflow_with_what_each_means():
    rows = {
        line.split("│")[1].strip(): line for line in printed(a_run()).splitlines() if "│" in line
    }
    processed = [cell.strip() for cell in rows["Processed"].split("│")[2:5]]
    assert processed == ["6", "1", "7"]  # order (high one included), workspace, all
    assert "stopped for an operator" in rows["Error"]
    assert "Pending" not in rows  # a state nobody is in is left out


def test_high_priority_is_compared_with_the_normal_orders_sent_just_before_it():
    text = printed(a_run())
    assert "normal, the last 1 sent (just before high)" in text
    line = next(line for line in text.splitlines() if "just before high" in line)
    assert "9.0 s / 9.0 s (1)" in line
    assert "sent last, into the backlog the others made" in text


def test_the_faults_are_described_in_words():
    lines = describe_faults(FAULTS, PYTHON_FAULTS)
    assert lines[0].startswith("faults at the remote services (seed 7): 10% of calls fail")
    assert "payment is down for 8.0 s after 4.0 s" in lines[0]
    assert lines[1] == "endpoints down for the whole run: west"
    assert "5% lose their reply after the effect" in lines[2]
    assert describe_faults(FAULTS, {})[-1] == "endpoints down for the whole run: west"

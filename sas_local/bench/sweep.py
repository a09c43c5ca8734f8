"""The Supervisor's sweep: its time over N in-flight orders, alone and beside finished history.

In-flight orders are written as the submission writes them (order, state Pending with a pickup
deadline in the future, history, and the in-flight marker), so a sweep reads each and finds it
healthy: the steady-state cost of a tick. Finished orders are written as a finished order's
partition looks (order, a Processed state, history) with no marker. The sweep is the product's
own ``Supervisor.sweep`` (median of 3 runs).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sas import bootstrap
from sas import settings as settings_module
from sas.domain.model import HistoryEntry, OrderRecord, ProcessState
from sas.domain.transitions import initial_state
from sas.domain.workflow import ORDER_WORKFLOW
from sas_local.stack import app_env


def _timed_sweeps(runs: int = 3) -> float:
    supervisor = bootstrap.supervisor()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        report = supervisor.sweep()
        times.append(time.perf_counter() - started)
        if report.total() - report["healthy"]:
            raise RuntimeError(f"the benchmark's orders should all be healthy: {dict(report)}")
    return round(statistics.median(times), 3)


def _write(count: int, prefix: str, *, finished: bool, threads: int = 16) -> None:
    store = bootstrap.store()
    now = datetime.now(UTC)

    def one(n: int) -> None:
        order_id = f"{prefix}-{n:06d}"
        state = initial_state(order_id, ORDER_WORKFLOW, reply_to=None, now=now)
        if finished:
            state = replace(
                state,
                process_state=ProcessState.PROCESSED,
                complete_by=None,
                finished_at=now,
                step_index=len(ORDER_WORKFLOW.steps) - 1,
                attempt=3,
            )
        else:
            # A pickup deadline far enough ahead that no sweep of the benchmark expires it.
            state = replace(state, complete_by=now + timedelta(hours=1))
            store.touch_live(order_id, now)
        store.create_order(
            OrderRecord(order_id, ORDER_WORKFLOW.name, {"bench": True}, "bench", now),
            state,
            HistoryEntry(order_id, now, "submitted", attempt=0),
        )

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(count)))


def measure(
    connection_string: str,
    *,
    live: int,
    finished: int,
    log: Callable[[str, float], None],
    started: float,
    more_live: int | None = None,
) -> dict[str, Any]:
    os.environ.update(app_env(connection_string, "http://127.0.0.1:9"))
    bootstrap.reset()
    from sas_local.provision import provision

    provision(settings_module.load(dict(os.environ)))
    _write(live, "live", finished=False)
    alone = _timed_sweeps()
    log(f"sweep: {live} in flight alone {alone}s; writing {finished} finished orders", started)
    _write(finished, "done", finished=True)
    beside = _timed_sweeps()
    result: dict[str, Any] = {
        "live": live,
        "finished": finished,
        "sweep_s_live_only": alone,
        "sweep_s_with_finished": beside,
        "ratio": round(beside / alone, 2) if alone else None,
    }
    if more_live:
        _write(more_live - live, "more", finished=False)
        result[f"sweep_s_{more_live}_live"] = _timed_sweeps()
    return result

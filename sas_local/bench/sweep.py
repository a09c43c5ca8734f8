"""The Supervisor's sweep: its time over N in-flight orders, alone and beside finished history.

In-flight orders are written with a deadline an hour ahead (order, state, history, and the
in-flight marker), so a sweep finds them healthy. Two cases: their markers not due (a tick's
usual work: one query), and all due (the sweep reads each and re-arms it). Finished orders are
written as a finished order's partition looks (order, a Processed state, history) with no
marker. The sweep is the product's own ``Supervisor.sweep``: the median of 25 runs when no
marker is due (a few milliseconds each: fewer would be noise, rounding included) and of 3 when
every one is (each run re-arms them all).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from sas import bootstrap
from sas import settings as settings_module
from sas.domain.errors import AlreadyExists
from sas.domain.model import HistoryEntry, OrderRecord, ProcessState
from sas.domain.transitions import initial_state
from sas.services import supervisor as supervising
from sas_local.bench.resets import retried
from sas_local.stack import app_env
from workflows.order import ORDER_WORKFLOW

RUNS_NOT_DUE = 25
RUNS_ALL_DUE = 3

AUTOSAVE_S = 5.0
"""Azurite writes its whole table database to disk this long after a change (LokiJS autosave),
on its one thread: a pause that grows with the data (about half a second beside 100,000
finished orders here). Azure Table Storage has nothing like it."""


def _settle(timeout: float = 120.0) -> None:
    """Wait until Azurite has answered promptly for longer than its autosave interval: any
    save the writes before caused is over, so a timed sweep measures the sweep."""
    store = bootstrap.store()
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        asked = time.perf_counter()
        store.get_state("bench-probe")  # a point read of nothing
        if time.perf_counter() - asked > 0.05:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > AUTOSAVE_S + 1:
            return
        time.sleep(0.05)


def _timed_sweeps(make_due: Callable[[], None] | None = None, *, settle: bool) -> float:
    """Median seconds of one sweep (unrounded); ``make_due``: run before each (untimed), so
    every in-flight marker is due (the sweep re-arms what it finds healthy). Timed once Azurite
    has settled after the last writes (see ``_settle``; not in the quick run)."""
    ctx = bootstrap.context()
    runs = RUNS_NOT_DUE if make_due is None else RUNS_ALL_DUE
    times = []
    for run in range(runs):
        if make_due is not None:
            make_due()
        if settle and (make_due is not None or run == 0):
            _settle()
        started = time.perf_counter()
        report = supervising.sweep(ctx)
        times.append(time.perf_counter() - started)
        if report.total() - report["healthy"]:
            raise RuntimeError(f"the benchmark's orders should all be healthy: {dict(report)}")
    return statistics.median(times)


_LIVE_IDS: list[str] = []


def _all_due(threads: int = 16) -> None:
    store, now = bootstrap.store(), datetime.now(UTC)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda order: retried(partial(store.touch_live, order, now, now)), _LIVE_IDS))


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
            # A pickup deadline far enough ahead that no sweep of the benchmark expires it;
            # its marker due as late (made due on purpose where a part says so).
            state = replace(state, complete_by=now + timedelta(hours=1))
            retried(lambda: store.touch_live(order_id, now, now + timedelta(hours=1)))
            _LIVE_IDS.append(order_id)
        record = OrderRecord(order_id, ORDER_WORKFLOW.name, {"bench": True}, "bench", now)
        history = HistoryEntry(order_id, now, "submitted", attempt=0)
        retried(lambda: store.create_order(record, state, history), landed=(AlreadyExists,))

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
    settle: bool = True,
) -> dict[str, Any]:
    """Each sweep twice: as a tick mostly finds the index (no marker due: one query), and with
    every in-flight marker due (a read and a re-arm each: the most a sweep does without
    recovering anything)."""
    os.environ.update(app_env(connection_string, "http://127.0.0.1:9"))
    bootstrap.reset()
    from sas_local.provision import provision

    provision(settings_module.load(dict(os.environ)))
    _LIVE_IDS.clear()
    _write(live, "live", finished=False)
    alone, alone_due = _timed_sweeps(settle=settle), _timed_sweeps(_all_due, settle=settle)
    log(f"sweep: {live} in flight alone {alone:.4f}s ({alone_due:.3f}s all due)", started)
    _write(finished, "done", finished=True)
    beside, beside_due = _timed_sweeps(settle=settle), _timed_sweeps(_all_due, settle=settle)
    result: dict[str, Any] = {
        "live": live,
        "finished": finished,
        "runs": RUNS_NOT_DUE,
        "runs_all_due": RUNS_ALL_DUE,
        "sweep_s_live_only": _seconds(alone),
        "sweep_s_with_finished": _seconds(beside),
        "ratio": round(beside / alone, 2) if alone else None,
        "sweep_s_live_only_all_due": _seconds(alone_due),
        "sweep_s_with_finished_all_due": _seconds(beside_due),
        "ratio_all_due": round(beside_due / alone_due, 2) if alone_due else None,
        "period_s": _period_seconds(),
    }
    if more_live:
        _write(more_live - live, "more", finished=False)
        result[f"sweep_s_{more_live}_live"] = _seconds(_timed_sweeps(settle=settle))
        result[f"sweep_s_{more_live}_live_all_due"] = _seconds(
            _timed_sweeps(_all_due, settle=settle)
        )
    return result


def _seconds(value: float) -> float:
    """To a tenth of a millisecond (the not-due sweep takes a few)."""
    return round(value, 4)


def _period_seconds() -> float:
    """The Supervisor's period in the local stack (a six-field cron: ``*/N * * * * *``)."""
    schedule = os.environ.get(settings_module.SUPERVISOR_SCHEDULE, "")
    head = schedule.split(" ")[0]
    return float(head[2:]) if head.startswith("*/") else float("nan")

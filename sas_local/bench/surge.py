"""`python -m sas_local.bench.surge`: surges past what the machine processes (docs/benchmarks.md,
"Surges"). Part of `make bench`; alone, it replaces only the surge part of the results.

Each run starts a stack of its own and first measures what it processes: a calibration burst,
in orders per minute from its first send to its last finish. Then a probe order every few seconds
for the rest of the run, and the surge: ``multiple`` times that rate, sent evenly over one
minute. In the slow-remote run the payment service answers every call three step budgets late
for that minute (the effect applied, the answer too late for the agent's call). Once every
surge order finished, the probes go on a while, calm, then stop.

Per run: goodput per minute (Processed by their ``FinishedAt``) from the surge's start, its
best minute and the minute after the surge; p50/p95 of the surge's orders from sending to
finishing; expiries, split into counted failures, those taken as the load's (not counted), and
those of an attempt no agent had started (time spent queued recovered as a failure: the number
that must be none); remote calls answered from a key already applied; how the orders ended;
how long after the last surge order finished the probes' latency was back to its calm median.
Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, Self

import httpx
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient

from sas import settings as settings_module
from sas.adapters.storage_queues import first_calls_alone, sent
from sas.domain.wire import LIVE_PARTITION, idempotency_key, live_table_name, start_row_key
from sas_local.bench import cpu
from sas_local.bench.e2e import _body, _percentile, spinning
from sas_local.processes import REPO_ROOT
from sas_local.stack import LocalStack

STEP_BUDGET_S = 15.0
"""The order workflow's step budget (workflows/order.py): the slow remote answers 3x late."""
SLOW_SERVICE = "payment"
CALM_RATIO = 1.5
PROBE_WINDOW = 5
"""Probes in a row whose median says whether latency is normal (10 s at one every 2 s)."""
"""A probe is back to normal within this multiple of the calm median (or a second more)."""


@dataclass(frozen=True)
class Surge:
    label: str
    multiple: float
    workers: int = 2
    hogs: int = 0
    slow_remote: bool = False


@dataclass(frozen=True)
class Plan:
    surges: tuple[Surge, ...]
    calibration: int
    """Orders of the calibration burst."""
    window_s: float = 60.0
    """How long the surge is offered (and the remote slow)."""
    probe_every_s: float = 2.0
    calm_before_s: float = 20.0
    """Probes alone before the surge: their median is the calm latency."""
    calm_after_s: float = 120.0
    """Probes after the last surge order finished."""
    timeout_s: float = 3600.0


PLANS = {
    "full": Plan(
        (
            Surge("1x", 1),
            Surge("2x", 2),
            Surge("4x", 4),
            Surge("10x", 10),
            Surge("4x, 1 worker", 4, workers=1),
            Surge("4x, 4 workers", 4, workers=4),
            Surge("4x, 2 CPU hogs", 4, hogs=2),
            Surge("2x, slow payment", 2, slow_remote=True),
        ),
        calibration=300,
    ),
    "quick": Plan(  # past 1x a surge drains in minutes per minute offered: kept to 2x, 30 s
        (Surge("2x", 2), Surge("2x, slow payment", 2, slow_remote=True)),
        calibration=150,
        window_s=30.0,
        calm_after_s=60.0,
        timeout_s=1800.0,
    ),
    "smoke": Plan(
        (Surge("2x", 2),),
        calibration=10,
        window_s=5.0,
        probe_every_s=1.0,
        calm_before_s=3.0,
        calm_after_s=5.0,
        timeout_s=300.0,
    ),
}


def run_plan(plan: Plan, *, log_dir: Path, log: Callable[[str], None]) -> list[dict[str, Any]]:
    from sas_local.bench.__main__ import commit_of  # the bench's one rule for naming a commit

    results = []
    for number, surge in enumerate(plan.surges):
        log(f"surge {surge.label}")
        measured = run(surge, plan, log_dir=log_dir / f"surge-{number}")
        results.append({"commit": commit_of(REPO_ROOT), **measured})
    return results


def run(surge: Surge, plan: Plan, *, log_dir: Path) -> dict[str, Any]:
    with (
        LocalStack.start(workers=surge.workers, log_dir=log_dir) as stack,
        spinning(surge.hogs),
    ):
        conn = stack.azurite.connection_string
        orders = QueueClient.from_connection_string(
            conn, stack.settings.queue(settings_module.QUEUE_ORDERS)
        )
        table = TableClient.from_connection_string(conn, stack.settings.table_name)
        live = TableClient.from_connection_string(conn, live_table_name(stack.settings.table_name))
        done = _Done(table, live)
        calibration = [f"cal-{n:05d}" for n in range(plan.calibration)]
        sent_at = _send_paced(orders, calibration, seconds=0.0)
        done.wait(calibration, plan.timeout_s)
        per_minute = _rate_per_minute(_finished(table, calibration), sent_at)
        count = max(1, round(per_minute * surge.multiple * plan.window_s / 60))
        surge_ids = [f"s-{n:05d}" for n in range(count)]
        processes = {"devhost": stack.hosts[0].pid} if len(stack.hosts) == 1 else {}
        cpu_before = cpu.snapshot(processes)
        with _Probes(orders, plan.probe_every_s) as probes, _Backlog(orders) as backlog:
            time.sleep(plan.calm_before_s)
            surge_start = datetime.now(UTC)
            slow = _slow_remote(stack.simulator_url, plan.window_s) if surge.slow_remote else None
            sent_at |= _send_paced(orders, surge_ids, seconds=plan.window_s)
            if slow is not None:
                slow.join()
            done.wait(surge_ids, plan.timeout_s)
            time.sleep(plan.calm_after_s)
        done.wait(list(probes.sent), plan.timeout_s)
        sent_at |= probes.sent
        cpu_used = cpu.per_order_ms(cpu_before, cpu.snapshot(processes), count + len(probes.sent))
        states = _states(table, [*surge_ids, *probes.sent])
        stats = httpx.get(f"{stack.simulator_url}/stats", timeout=60).json()
        calls = httpx.get(f"{stack.simulator_url}/calls", timeout=60).json()
        expiries = _expiries(table, states, calls)
    return {
        **asdict(surge),
        "calibrated_per_minute": round(per_minute, 1),
        "offered": count,
        "window_s": plan.window_s,
        **_outcome(surge_ids, list(probes.sent), states, sent_at, surge_start, plan.window_s),
        "expiries": expiries,
        "extra_remote_calls": sum(int(s["replays"]) for s in stats.values()),
        "slow_calls": sum(int(s["slow"]) for s in stats.values()),
        "devhost_cpu_ms_per_order": cpu_used.get("devhost"),
        "taken_in_after_s": backlog.taken_in_after(surge_start),
    }


class _Done:
    """Waits until orders of one id prefix finished: first until the in-flight index holds none
    of them (one request per look), then until each one's state row says so."""

    def __init__(self, table: TableClient, live: TableClient) -> None:
        self._table, self._live = table, live

    def wait(self, ids: Sequence[str], timeout: float) -> None:
        deadline, left = time.monotonic() + timeout, list(ids)
        prefix = ids[0].split("-")[0] + "-" if ids else ""
        query = (
            f"PartitionKey eq '{LIVE_PARTITION}' and RowKey ge '{prefix}' "
            f"and RowKey lt '{prefix[:-1]}.'"
        )
        while left and time.monotonic() < deadline:
            time.sleep(1.0)
            if next(iter(self._live.query_entities(query, select=["RowKey"])), None) is not None:
                continue
            finished = _finished(self._table, left)
            left = [i for i in left if i not in finished]


class _Background:
    """``_loop`` on a thread of its own while the block runs (it stops once ``_stop`` is set)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        raise NotImplementedError


class _Backlog(_Background):
    """The orders queue's length every few seconds while the block runs: when the surge was
    all taken in (the hosts had received every order sent to the queue)."""

    EVERY_S = 2.0
    TAKEN_IN = 2
    """At most this many queued (the probes') counts as taken in."""

    def __init__(self, queue: QueueClient) -> None:
        super().__init__()
        self._queue = queue
        self.lengths: list[tuple[datetime, int]] = []

    def _loop(self) -> None:
        while not self._stop.wait(self.EVERY_S):
            with contextlib.suppress(Exception):  # a missed sample is a gap, not a failure
                length = self._queue.get_queue_properties().approximate_message_count
                self.lengths.append((datetime.now(UTC), length or 0))

    def taken_in_after(self, start: datetime) -> float | None:
        """Seconds from ``start`` until the queue was short again after its longest."""
        after = [(at, n) for at, n in self.lengths if at >= start]
        if not after:
            return None
        peak = max(range(len(after)), key=lambda i: after[i][1])
        short = next((at for at, n in after[peak:] if n <= self.TAKEN_IN), None)
        return None if short is None else round((short - start).total_seconds())


class _Probes(_Background):
    """One order every ``every`` seconds while the block runs; when each was sent."""

    def __init__(self, queue: QueueClient, every: float) -> None:
        super().__init__()
        self._queue, self._every = queue, every
        self.sent: dict[str, datetime] = {}

    def _loop(self) -> None:
        number = 0
        while not self._stop.is_set():
            order_id = f"p-{number:05d}"
            self.sent |= _send_paced(self._queue, [order_id], seconds=0.0)
            number += 1
            self._stop.wait(self._every)


def _send_paced(queue: QueueClient, ids: Sequence[str], *, seconds: float) -> dict[str, datetime]:
    """Send ``ids`` spread evenly over ``seconds`` (0: at once); when each was sent."""
    start, gap = time.monotonic(), seconds / max(len(ids), 1)
    sent_at: dict[str, datetime] = {}

    def one(numbered: tuple[int, str]) -> None:
        index, order_id = numbered
        time.sleep(max(0.0, start + index * gap - time.monotonic()))
        sent_at[order_id] = datetime.now(UTC)
        send = partial(queue.send_message, _body(order_id))
        first_calls_alone("send_message", send, decoded=sent)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, enumerate(ids)))
    return sent_at


def _slow_remote(simulator_url: str, seconds: float) -> threading.Thread:
    """The payment service answers three step budgets late for ``seconds``, from now."""
    slow = {"per_service": {SLOW_SERVICE: {"slow_rate": 1.0, "slow_seconds": 3 * STEP_BUDGET_S}}}

    def episode() -> None:
        httpx.put(f"{simulator_url}/faults", json=slow, timeout=10).raise_for_status()
        time.sleep(seconds)
        httpx.put(f"{simulator_url}/faults", json={}, timeout=10).raise_for_status()

    thread = threading.Thread(target=episode, daemon=True)
    thread.start()
    return thread


def _finished(table: TableClient, ids: Iterable[str]) -> dict[str, datetime]:
    return {
        order_id: state["FinishedAt"]
        for order_id, state in _states(table, ids).items()
        if state.get("FinishedAt") is not None
    }


def _rate_per_minute(finished: dict[str, datetime], sent_at: dict[str, datetime]) -> float:
    """Orders per minute from the first send to the last finish."""
    if not finished:
        return 0.0
    span = (max(finished.values()) - min(sent_at[i] for i in finished)).total_seconds()
    return 60 * len(finished) / max(span, 1.0)


def _states(table: TableClient, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    columns = ["ProcessState", "FinishedAt", "Incarnation"]

    def one(order_id: str) -> tuple[str, dict[str, Any] | None]:
        try:
            return order_id, dict(table.get_entity(order_id, "state", select=columns))
        except ResourceNotFoundError:
            return order_id, None

    with ThreadPoolExecutor(8) as pool:
        return {i: state for i, state in pool.map(one, ids) if state is not None}


def _expiries(
    table: TableClient, states: dict[str, dict[str, Any]], calls: dict[str, list[str]]
) -> dict[str, int]:
    """The expiries of the surge's and the probes' orders: counted, taken as the load's, and
    of an attempt no agent started: no start recorded (an agent that starts within the claim's
    slack writes none) and no call of its key between its claim and its expiry (``calls``: when
    the simulator saw each idempotency key). Its time went in queues."""
    found: Counter[str] = Counter()
    query = "Kind ge 'expired_' and Kind lt 'expired`'"
    columns = ["PartitionKey", "Kind", "Step", "Attempt", "Mode", "Detail", "At"]
    for row in table.query_entities(query, select=columns):
        state = states.get(row["PartitionKey"])
        if state is None:  # a calibration order's
            continue
        found["all"] += 1
        found["not_counted" if "not counted" in (row.get("Detail") or "") else "counted"] += 1
        if row.get("Step") is None:
            continue
        key = idempotency_key(
            row["PartitionKey"],
            state.get("Incarnation") or "",
            row["Step"],
            row.get("Mode") or "do",
        )
        claimed = table.query_entities(
            "PartitionKey eq @pk and Kind eq 'claimed' and Attempt eq @attempt",
            parameters={"pk": row["PartitionKey"], "attempt": int(row["Attempt"])},
            select=["At"],
        )
        since = min((c["At"] for c in claimed), default=None)
        made = [datetime.fromisoformat(at) for at in calls.get(key, [])]
        called = since is not None and any(since <= at <= row["At"] for at in made)
        try:  # a start recorded: an agent took it (and maybe found the breaker open)
            start = table.get_entity(row["PartitionKey"], start_row_key(key, int(row["Attempt"])))
            recorded = not start.get("Abandoned")
        except ResourceNotFoundError:
            recorded = False
        found["never_started"] += not (called or recorded)
    return {kind: found[kind] for kind in ("all", "counted", "not_counted", "never_started")}


def _outcome(
    surge_ids: list[str],
    probe_ids: list[str],
    states: dict[str, dict[str, Any]],
    sent_at: dict[str, datetime],
    surge_start: datetime,
    window_s: float,
) -> dict[str, Any]:
    def latency(order_id: str) -> float | None:
        finished = states.get(order_id, {}).get("FinishedAt")
        return None if finished is None else (finished - sent_at[order_id]).total_seconds()

    ended = Counter(states[i]["ProcessState"] if i in states else "not accepted" for i in surge_ids)
    latencies = [s for s in map(latency, surge_ids) if s is not None]
    done = [states[i]["FinishedAt"] for i in surge_ids if latency(i) is not None]
    unfinished = len(surge_ids) - len(done)
    drained = max(done) if done else None
    minutes = _per_minute(
        [
            s["FinishedAt"]
            for s in states.values()
            if s.get("ProcessState") == "Processed" and s.get("FinishedAt") is not None
        ],
        surge_start,
    )
    window_end = surge_start + timedelta(seconds=window_s)
    busy_after = drained is not None and drained >= window_end + timedelta(minutes=1)
    processed = [s["FinishedAt"] for s in states.values() if s.get("ProcessState") == "Processed"]
    minute_after = sum(window_end <= at < window_end + timedelta(minutes=1) for at in processed)
    best = max(minutes, default=0)
    calm = [latency(i) for i in probe_ids if sent_at[i] < surge_start]
    calm_p50 = statistics.median([s for s in calm if s is not None]) if any(calm) else None
    return {
        "ended": dict(ended),
        "p50_s": round(statistics.median(latencies), 1) if latencies else None,
        "p95_s": _percentile(latencies, 95),
        "goodput_per_minute": minutes,
        "best_minute": best,
        "minute_after": minute_after if busy_after else None,
        "drained_after_s": (
            None
            if drained is None or unfinished
            else round((drained - surge_start).total_seconds())
        ),
        "unfinished": unfinished,
        "calm_probe_p50_s": None if calm_p50 is None else round(calm_p50, 2),
        "normal_again_s": _normal_again(
            [(sent_at[i], latency(i)) for i in probe_ids], calm_p50, drained
        ),
    }


def _per_minute(finishes: list[datetime], start: datetime) -> list[int]:
    """Orders finished in each whole minute from ``start``, up to the last one."""
    minutes = [int((at - start).total_seconds() // 60) for at in finishes if at >= start]
    counted = Counter(minutes)
    return [counted[m] for m in range(max(minutes, default=-1) + 1)]


def _normal_again(
    probes: Sequence[tuple[datetime, float | None]],
    calm_p50: float | None,
    drained: datetime | None,
) -> float | None:
    """Seconds from ``drained`` (the last surge order finished) until the probes' latency is
    normal again: from then on, the median of every ``PROBE_WINDOW`` probes sent in a row is
    within ``CALM_RATIO`` of the calm median (or a second more). One probe alone varies with
    the hosts' polling (up to 2 s a hop), which the median of a few absorbs; a probe that never
    finished counts as slow. None when the run cannot tell."""
    if calm_p50 is None or drained is None:
        return None
    limit = max(calm_p50 * CALM_RATIO, calm_p50 + 1.0)
    ordered = sorted(probes, key=lambda probe: probe[0])
    size = min(PROBE_WINDOW, len(ordered))
    slow_until = None
    for first in range(len(ordered) - size + 1):
        window = ordered[first : first + size]
        took = statistics.median(math.inf if t is None else t for _, t in window)
        if took > limit:
            slow_until = window[-1][0]
    if slow_until is None or slow_until < drained:
        return 0.0
    return round((slow_until - drained).total_seconds(), 1)


def main(argv: Sequence[str] | None = None) -> int:
    from sas_local.bench.__main__ import write  # the page and its chart: one writer

    p = argparse.ArgumentParser(prog="python -m sas_local.bench.surge", description=__doc__)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true")
    size.add_argument("--smoke", action="store_true")
    p.add_argument("--only", nargs="+", metavar="LABEL", help="run only these surges")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "docs")
    p.add_argument("--name", default="benchmarks")
    args = p.parse_args(argv)
    plan = PLANS["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.only:
        unknown = set(args.only) - {s.label for s in plan.surges}
        if unknown:
            p.error(f"no such surge: {', '.join(sorted(unknown))}")
        plan = replace(plan, surges=tuple(s for s in plan.surges if s.label in args.only))
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"surge +{time.monotonic() - started:.0f}s {message}", file=sys.stderr, flush=True)

    measured = run_plan(plan, log_dir=Path(tempfile.mkdtemp(prefix="sas-surge-")), log=log)
    results_path = args.out / f"{args.name}.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"commits": {}}
    kept = {r["label"]: r for r in results.get("surges", []) if args.only}
    kept |= {r["label"]: r for r in measured}
    results["surges"] = list(kept.values())
    print(json.dumps(measured, indent=2, default=str))
    if results.get("commits"):
        results_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        write(results, args.out, args.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

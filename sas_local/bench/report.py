"""The benchmark's results as a markdown section and a PNG chart."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from sas_local.bench import cost
from sas_local.bench import rates as rates_module

KINDS = (
    "table.transaction",
    "table.point_read",
    "table.query",
    "table.insert",
    "table.upsert",
    "table.update",
    "table.delete",
    "queue.send",
    "queue.receive",
    "queue.delete",
)
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def _table_requests(per_order: dict[str, float]) -> float:
    return round(sum(v for k, v in per_order.items() if k.startswith("table.")), 2)


def markdown(results: dict[str, Any], *, chart_name: str | None) -> str:
    measured_kinds = [k for k in KINDS if k in results["rates"]]
    lines = [
        f"Measured {results['when']} on {results['machine']}"
        + (f" — `--{results.get('size', 'quick')}` run" if results["quick"] else "")
        + ".",
        "",
        "**Raw rates** (requests/s from 4 processes of 4 threads, this run's Azurite, measured "
        "before and after the end-to-end runs; the limits use each kind's better figure):",
        "",
        "| Measured | " + " | ".join(measured_kinds) + " |",
        "|---|" + "---|" * len(measured_kinds),
    ]
    runs = results.get("rate_runs") or [results["rates"]]
    labels = ["first", "last"] if len(runs) == 2 else [str(n + 1) for n in range(len(runs))]
    for label, run in zip(labels, runs, strict=True):
        lines.append(
            f"| {label} | "
            + " | ".join(f"{run[k]:g}" if k in run else "-" for k in measured_kinds)
            + " |"
        )
    lines += [
        "| **used** | " + " | ".join(f"**{results['rates'][k]:g}**" for k in measured_kinds) + " |",
        "",
    ]
    for commit, measured in results["commits"].items():
        lines += [
            f"**Requests per order, commit `{commit}`** (exact; receives: one per message "
            "delivered, which the limit counts at the host's batch of "
            f"{rates_module.HOST_BATCH}; the sweep's share is off the order's path):",
            "",
            "| Workflow | Table requests | of which | Queue sends | Deletes | Receives "
            "| Supervisor at the end | Limit from raw rates (orders/s) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, variant in measured["counts"]["variants"].items():
            per = variant["per_order"]
            detail = ", ".join(
                f"{per[k]:g} {k.split('.')[1].replace('_', ' ')}"
                for k in KINDS
                if k.startswith("table.") and k in per
            )
            at_end = ", ".join(
                f"{v:g} {k.split('.')[1].replace('_', ' ')}"
                for k, v in variant["supervisor_at_end"].items()
            )
            breaker = per.get("breaker.read", 0) + per.get("breaker.write", 0)
            if breaker:
                detail += f" (+ {breaker:.2g} circuit-breaker reads, cached per process)"
            if per.get("clock.read"):
                detail += f" (+ {per['clock.read']:.2g} clock calibration, once per process)"
            lines.append(
                f"| {name} | **{_table_requests(per):g}** | {detail} "
                f"| {per.get('queue.send', 0):g} | {per.get('queue.delete', 0):g} "
                f"| {per.get('queue.receive', 0):g} | {at_end} "
                f"| {variant['limit_orders_per_s']} |"
            )
        sweep = measured["counts"].get("sweep_per_live_order", {})
        due = measured["counts"].get("sweep_per_due_live_order")
        lines += [
            "",
            "A sweep costs, per in-flight order and tick: "
            + ", ".join(f"{v:g} {k}" for k, v in sweep.items())
            + (
                "; per in-flight order whose marker is due (a read and a re-arm): "
                + ", ".join(f"{v:g} {k}" for k, v in due.items())
                if due
                else ""
            )
            + ".",
            "",
            f"**End to end, commit `{commit}`** (a burst of N orders, happy path, no status "
            "subscriber):",
            "",
            "| Orders | Workers | Finished (Processed) | Orders/s | p50 s | p95 s | p99 s "
            "| % of the 3-step limit | Expiries | Replies dropped / thrown away / extra calls "
            "| Supervisor reads / marker transactions per order "
            "| CPU ms/order: dev host / Azurite / simulator | Cores busy |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        limit = _three_step_limit(measured)
        for run in median_runs(measured["e2e"]):
            share = _share_of(limit, run)
            lines.append(
                f"| {run['orders']} | {run['workers']} | {_ended(run)} "
                f"| {_each(run, 'orders_per_s')} | {run['p50_s']:g} | {run['p95_s']:g} "
                f"| {run['p99_s']:g} | {share} | {_each(run, 'expiries')} "
                f"| {_replies_cell(run)} | {_supervision_cell(run)} "
                f"| {_cpu_cell(run)} | {_cores_busy(run)} |"
            )
        lines += [
            "",
            "Cores busy: orders/s times the CPU an order cost the dev host, Azurite and the "
            f"simulator together (this machine: {results['machine']}); a little high, as the "
            "CPU is counted until the queues are quiet, a few seconds past the last finish.",
            "",
        ]
        if any(len(runs) > 1 for runs in _by_configuration(measured["e2e"]).values()):
            lines += [
                "Each row is the run of median throughput; in brackets, every run's figure in "
                "the order they ran.",
                "",
            ]
        lines += _flex_lines(measured)
        recovered = measured.get("recovery")
        if recovered:
            lines += [
                f"**Recovery, commit `{commit}`**: an agent dies holding a step's request; "
                "from that step's deadline to its re-dispatch, over "
                f"{recovered['recovered']} of {recovered['orders']} orders: median "
                f"{recovered['p50_s']} s, worst {recovered['max_s']} s (target: at most the "
                f"step budget {recovered['budget_s']:g} s + the period {recovered['period_s']:g}"
                f" s + 1 s = {recovered['target_s']:g} s; it is the skew allowance "
                f"{recovered['clock_skew_s']:g} s + up to one period + the first retry's "
                f"backoff + one hop{_in_flight(recovered)}).",
                "",
            ]
    sweep = results.get("sweep")
    if sweep:
        lines += [
            f"**Supervisor sweep** (median of {sweep.get('runs', 3)}): "
            f"{sweep['live']} in flight alone {sweep['sweep_s_live_only']} s; "
            f"beside {sweep['finished']:,} finished orders {sweep['sweep_s_with_finished']} s "
            f"(ratio {sweep['ratio']})"
            + "".join(
                f"; {k.split('_')[2]} in flight {v} s"
                for k, v in sweep.items()
                if k.startswith("sweep_s_") and k.endswith("_live")
            )
            + "."
            + (
                " **With every marker due** (each order read and re-armed; median of "
                f"{sweep.get('runs_all_due', 3)}): "
                f"{sweep['live']} alone {sweep['sweep_s_live_only_all_due']} s, beside the "
                f"finished {sweep['sweep_s_with_finished_all_due']} s "
                f"(ratio {sweep['ratio_all_due']})"
                + "".join(
                    f"; {k.split('_')[2]} in flight {v} s"
                    for k, v in sweep.items()
                    if k.startswith("sweep_s_") and k.endswith("_live_all_due")
                )
                + f". The Supervisor's period here: {sweep.get('period_s', '?')} s."
                if "sweep_s_live_only_all_due" in sweep
                else ""
            ),
            "",
        ]
    lines += _side_by_side(results)
    lines += _scenarios(results)
    lines += _surges(results.get("surges") or [])
    lines += _costs(results)
    if chart_name:
        lines += [f"![Throughput and latency per worker count]({chart_name})", ""]
    return "\n".join(lines)


def _scenarios(results: dict[str, Any]) -> list[str]:
    """Parts 6 and 7: priorities under a backlog, and one of two endpoints down."""
    lines: list[str] = []
    ranked = results.get("priorities")
    if ranked:
        lines += [
            f"**Priorities** (a backlog of {ranked['backlog']:,} normal orders queued at once; "
            f"{ranked['urgent']} high-priority orders queued 2 s later, behind it; latency from "
            "sending to finishing):",
            "",
            "| Priority | Orders finished | p50 s | p95 s |",
            "|---|---|---|---|",
        ]
        for name in ("high", "normal"):
            row = ranked[name]
            lines.append(f"| {name} | {row['finished']} | {row['p50_s']} | {row['p95_s']} |")
        lines.append("")
    routed = results.get("endpoints")
    if routed:
        lines += [
            "**One of two endpoints down** (payment on two endpoints sharing one ledger, "
            f"capacity {routed['capacity']} calls each, {routed['latency_s']:g} s per call; "
            "the same number of orders with both up, then with west answering 503):",
            "",
            "| Endpoints | Orders | Finished | Processed | Orders/s | p50 s | Calls west / north "
            "| Steps deferred | Expiries |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for label, run in routed["runs"].items():
            calls = run["calls"]
            lines.append(
                f"| {label} | {run['orders']} | {run['finished']} | {run['processed']} "
                f"| {run['orders_per_s']} | {run['p50_s']} | {calls['west']} / {calls['north']} "
                f"| {run['deferred']} | {run['expiries']} |"
            )
        lines.append("")
    return lines


def _surges(runs: list[dict[str, Any]]) -> list[str]:
    """Part 8: surges past what the machine processes (sas_local/bench/surge.py)."""
    if not runs:
        return []
    lines = [
        "**Surges** (each on a stack of its own: a calibration burst gives what it processes "
        "per minute, then a surge of that many times it is offered evenly (for a minute in the "
        "full run), with a probe order every few seconds throughout; in the "
        "slow-payment run every payment call answers 3 step budgets late during the surge; "
        "goodput is Processed orders per minute from the surge's start, the minute after the "
        "surge counted only while work was still queued; taken in: when the hosts had received "
        "every surge order from the orders queue; probes are normal again, counted from "
        "the last surge order's finish, once the median of every five in a row is within 1.5 "
        "times the calm median (or a second more); expiries are counted / taken as the "
        "load's / of an attempt that called nothing (no agent started it, or its circuit was "
        "open)):",
        "",
        "| Surge | Workers | CPU hogs | Per minute calibrated | Orders offered | Goodput per "
        "minute | Best / minute after | p50 / p95 s | Taken in after s | Drained after s | "
        "Probes normal again "
        "s after | Expiries | Extra remote calls | Ended |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        e = run["expiries"]
        after = run["minute_after"]
        ratio = "-" if after is None else f"{after} ({after / max(run['best_minute'], 1):.0%})"
        ended = ", ".join(f"{n:,} {state}" for state, n in sorted(run["ended"].items()))
        lines.append(
            f"| {run['label']} (`{run.get('commit', '?')}`) | {run['workers']} | {run['hogs']} "
            f"| {run['calibrated_per_minute']:g} | {run['offered']:,} in {run['window_s']:g} s "
            f"| {' '.join(str(n) for n in run['goodput_per_minute'])} "
            f"| {run['best_minute']} / {ratio} | {run['p50_s']} / {run['p95_s']} "
            f"| {_or_dash(run.get('taken_in_after_s'))} | {_or_dash(run['drained_after_s'])} "
            f"| {_or_dash(run['normal_again_s'])} "
            f"| {e['all']} ({e['counted']} / {e['not_counted']} / {e['never_started']}) "
            f"| {run['extra_remote_calls']} | {ended} |"
        )
    return [*lines, ""]


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _costs(results: dict[str, Any]) -> list[str]:
    """What an order costs in Azure, from the measured commit's counts (the first commit)."""
    counts = next(iter(results["commits"].values()))["counts"]
    if "invocations" not in counts["variants"].get(cost.VARIANT, {}):
        return [
            "**What an order costs in Azure**: not in this run (its counts predate the timing "
            "of each function invocation); run `make bench`.",
            "",
        ]
    return cost.invocation_lines(counts) + cost.cost_lines(counts, busy=busy_cpu(results))


def busy_cpu(results: dict[str, Any]) -> cost.EndToEndCpu | None:
    """The dev host's CPU per order in the measured commit's largest one-worker burst."""
    runs = next(iter(results["commits"].values())).get("e2e", [])
    alone = [
        r
        for r in runs
        if r["workers"] == 1
        and r.get("layout", "shared") == "shared"
        and (r.get("cpu_ms_per_order") or {}).get("devhost") is not None
    ]
    if not alone:
        return None
    largest = max(r["orders"] for r in alone)
    figures = sorted(r["cpu_ms_per_order"]["devhost"] for r in alone if r["orders"] == largest)
    return cost.EndToEndCpu(figures[len(figures) // 2], largest)


def chart(results: dict[str, Any], path: Path) -> Path | None:
    """Throughput and p50 latency per worker count, per commit and batch, with the limit."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (throughput, latency) = plt.subplots(1, 2, figsize=(10, 5))
    for commit, measured in results["commits"].items():
        medians = median_runs(measured["e2e"])
        batches = sorted({run["orders"] for run in medians})
        color = None  # each commit's limit in the colour of its first line
        for batch in batches:
            runs = [run for run in medians if run["orders"] == batch]
            workers = [run["workers"] for run in runs]
            label = f"{commit}, {batch} orders"
            (line,) = throughput.plot(
                workers, [run["orders_per_s"] for run in runs], "o-", label=label
            )
            color = color or line.get_color()
            latency.plot(workers, [run["p50_s"] for run in runs], "o-", label=label)
        limit = _three_step_limit(measured)
        if limit:
            throughput.axhline(
                limit, linestyle="--", color=color, label=f"{commit}: limit from raw rates"
            )
    throughput.set_xlabel("dev-host workers")
    throughput.set_ylabel("orders/s")
    throughput.set_title("Throughput (3-step orders)")
    latency.set_xlabel("dev-host workers")
    latency.set_ylabel("p50 latency, s")
    latency.set_title("Latency of a burst")
    every_workers = sorted(
        {run["workers"] for measured in results["commits"].values() for run in measured["e2e"]}
    )
    for axis in (throughput, latency):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
        axis.set_ylim(bottom=0)
        axis.set_xticks(every_workers)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def into_document(document: Path, section: str) -> None:
    """Replace the generated section of ``document`` (between the bench markers)."""
    text = document.read_text()
    head, found, rest = text.partition(BEGIN)
    if not found:
        raise ValueError(f"{document} has no {BEGIN} marker")
    _, found_end, tail = rest.partition(END)
    if not found_end:
        raise ValueError(f"{document} has no {END} marker")
    document.write_text(f"{head}{BEGIN}\n{section}\n{END}{tail}")


def _supervision_cell(run: dict[str, Any]) -> str:
    reads, moves = run.get("sweep_reads_per_order"), run.get("marker_moves_per_order")
    if reads is None:
        return "-"
    return f"{reads:g} / {moves:g}"  # both counted, or neither


_CPU_PARTS = ("devhost", "azurite", "simulator")


def _cpu_used(run: dict[str, Any]) -> dict[str, float] | None:
    """CPU ms per order of each part, or None if the run did not measure all of them."""
    used: dict[str, float] = run.get("cpu_ms_per_order") or {}
    return used if all(name in used for name in _CPU_PARTS) else None


def _flex_lines(measured: dict[str, Any]) -> list[str]:
    """The same bursts with each function in processes of its own, as Flex Consumption runs
    them (one worker each), beside the shared-process rows above."""
    runs = measured.get("e2e_flex") or []
    if not runs:
        return []
    lines = [
        "**The same bursts, Flex layout** (every function in a dev host of its own, one "
        "worker each; the dev hosts' CPU summed):",
        "",
        "| Orders | Dev hosts | Finished (Processed) | Orders/s | p50 s | p95 s | Expiries "
        "| CPU ms/order: dev hosts / Azurite / simulator |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run['orders']} | {run.get('hosts', '-')} | {_ended(run)} "
            f"| {run['orders_per_s']:g} | {run['p50_s']:g} | {run['p95_s']:g} "
            f"| {run['expiries']} | {_cpu_cell(run)} |"
        )
    return [*lines, ""]


def _ended(run: dict[str, Any]) -> str:
    """Orders that ended, and how many of them Processed: on the happy path every one should;
    any other end there is the machine's overload turned into failed steps."""
    processed = run.get("processed")
    return f"{run['finished']}" if processed is None else f"{run['finished']} ({processed})"


def _cpu_cell(run: dict[str, Any]) -> str:
    used = _cpu_used(run)
    return "-" if used is None else " / ".join(f"{used[name]:g}" for name in _CPU_PARTS)


def _devhost_cpu(run: dict[str, Any]) -> str:
    used = _cpu_used(run)
    return "-" if used is None else f"{used['devhost']:g}"


def _replies_cell(run: dict[str, Any]) -> str:
    """Replies the fence dropped; of them, those whose step was not done when they came (the
    step ran again or was undone); and the remote calls answered from a key already applied."""
    return " / ".join(
        _each(run, key) for key in ("replies_dropped", "replies_thrown_away", "extra_remote_calls")
    )


def _cores_busy(run: dict[str, Any]) -> str:
    """How many cores the run kept busy: its orders/s times the CPU an order cost the dev
    host, Azurite and the simulator (the benchmark's own process not included)."""
    used = _cpu_used(run)
    if used is None:
        return "-"
    return f"{run['orders_per_s'] * sum(used[name] for name in _CPU_PARTS) / 1000:.2f}"


def _in_flight(recovered: dict[str, Any]) -> str:
    held = recovered.get("reply_in_flight_s")
    if not held:
        return ""
    return f" + the hold for a reply a host has taken, `RetryPolicy.reply_in_flight`, {held:g} s"


def _three_step_limit(measured: dict[str, Any]) -> float | None:
    """The orders/s the raw rates allow a 3-step order without a status subscriber."""
    variant = measured["counts"]["variants"].get("3-step, no status subscriber", {})
    limit: float | None = variant.get("limit_orders_per_s")
    return limit


def _share_of(limit: float | None, run: dict[str, Any]) -> str:
    return f"{100 * run['orders_per_s'] / limit:.0f} %" if limit else "-"


def _by_configuration(runs: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """The end-to-end runs by (orders, workers), each group in the order they ran."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[(run["orders"], run["workers"])].append(run)
    return dict(sorted(groups.items()))


def median_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run per (orders, workers): the one of median throughput (the lower middle of an
    even count), with ``each``: every run of that configuration, in the order they ran."""
    medians = []
    for group in _by_configuration(runs).values():
        ranked = sorted(group, key=lambda run: run["orders_per_s"])
        medians.append({**ranked[(len(ranked) - 1) // 2], "each": group})
    return medians


def _each(run: dict[str, Any], key: str, *, total: bool = False) -> str:
    """The median run's figure (``total``: the sum over every run), and every run's in
    brackets when there were several."""
    each = run.get("each") or [run]
    value = run.get(key)
    if total:
        values = [r.get(key) for r in each]
        value = None if None in values else sum(values)
    shown = "-" if value is None else f"{value:g}"
    if len(each) < 2:
        return shown
    return f"{shown} ({', '.join('-' if r.get(key) is None else f'{r[key]:g}' for r in each)})"


def _side_by_side(results: dict[str, Any]) -> list[str]:
    """With ``--compare``: each configuration's median throughput for both commits and their
    ratio, and the finished steps each run threw away (replies dropped by the fence)."""
    commits = list(results["commits"].items())
    if len(commits) != 2:
        return []
    (new, measured_new), (old, measured_old) = commits
    limit = _three_step_limit(measured_new)
    olds = {(r["orders"], r["workers"]): r for r in median_runs(measured_old["e2e"])}
    news = median_runs(measured_new["e2e"])
    repeats = max((len(run["each"]) for run in news), default=1)
    how = [
        "each configuration run for both commits back to back"
        if results.get("interleaved")
        else "",
        f"the run of median throughput of {repeats}" if repeats > 1 else "",
    ]
    lines = [
        "**Side by side**" + (f" ({'; '.join(h for h in how if h)})" if any(how) else "") + ":",
        "",
        f"| Orders | Workers | `{old}` orders/s | `{new}` orders/s | ratio "
        f"| `{new}` % of the 3-step limit "
        f"| replies thrown away in all runs, `{old}` / `{new}` "
        f"| dev-host CPU ms/order, `{old}` / `{new}` |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in news:
        before = olds.get((run["orders"], run["workers"]))
        if before is None:
            continue
        times = "-"
        if before["orders_per_s"]:
            times = f"{run['orders_per_s'] / before['orders_per_s']:.2f}\N{MULTIPLICATION SIGN}"
        share = _share_of(limit, run)
        lines.append(
            f"| {run['orders']} | {run['workers']} | {_each(before, 'orders_per_s')} "
            f"| {_each(run, 'orders_per_s')} | {times} "
            f"| {share} | {_each(before, 'replies_thrown_away', total=True)} "
            f"/ {_each(run, 'replies_thrown_away', total=True)} "
            f"| {_devhost_cpu(before)} / {_devhost_cpu(run)} |"
        )
    return [*lines, ""]

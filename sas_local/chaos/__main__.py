"""`python -m sas_local.chaos`: run a chaos campaign, print and write its JSON report.

Exits 1 if the checker found any violation (or the drain timed out), 0 otherwise."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from sas_local.chaos.campaign import Options, run_campaign
from sas_local.chaos.inject import BROKEN


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sas_local.chaos", description=__doc__)
    p.add_argument("--orders", type=int, default=300, help="orders to submit (default 300)")
    p.add_argument("--seed", type=int, default=1, help="seed of every fault decision (default 1)")
    p.add_argument("--workers", type=int, default=2, help="core dev host workers (default 2)")
    p.add_argument(
        "--supervisors", type=int, default=2, help="supervisor instances, >= 2 (default 2)"
    )
    p.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--logs", type=Path, default=None, help="process logs (default: a temp dir)")
    p.add_argument("--drain-timeout", type=float, default=None, help="seconds (default scales)")
    p.add_argument("--no-faults", action="store_true", help="the same run without any fault")
    p.add_argument(
        "--layout",
        choices=("agents apart", "flex"),
        default="agents apart",
        help="the agents in a dev host of their own (default), or flex: every function apart",
    )
    p.add_argument(
        "--broken",
        action="append",
        choices=sorted(BROKEN),
        default=[],
        help="run a deliberately broken build (checker self-test); repeatable",
    )
    return p


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through Campaign.run, which stops every process it began


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    if args.orders < 1 or args.workers < 1 or args.supervisors < 1:
        parser().error("--orders, --workers and --supervisors must be at least 1")
    report = run_campaign(
        Options(
            orders=args.orders,
            seed=args.seed,
            workers=args.workers,
            supervisors=args.supervisors,
            report=args.report,
            log_dir=args.logs,
            drain_timeout=args.drain_timeout,
            faults=not args.no_faults,
            broken=tuple(args.broken),
            layout=args.layout,
        )
    )
    print(json.dumps(report, indent=2))
    verdict = "OK" if not report["violation_count"] and report["drained"] else "FAILED"
    print(
        f"chaos {verdict}: seed {report['seed']}, {report['orders']} orders, "
        f"{report['violation_count']} violation(s) {report['violations_by_kind']}, "
        f"{report['throughput_orders_per_s']} orders/s, {report['seconds']['total']} s",
        file=sys.stderr,
    )
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m sas_local.bench.loaded`: one burst on a loaded machine, for the reply rule.

Runs a burst of orders through the whole local stack while processes spin on every CPU, and
prints what recovery cost: steps expired, replies dropped, replies thrown away before their
step was done (finished steps run again for want of them), and remote calls answered from a
key already applied. ``--compare REV`` runs the same burst for another commit first.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from sas_local.bench import e2e
from sas_local.bench.__main__ import _short, commit_of, worktree
from sas_local.processes import REPO_ROOT


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sas_local.bench.loaded", description=__doc__)
    p.add_argument("--orders", type=int, default=1000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="spinning processes")
    p.add_argument("--compare", metavar="REV", help="run this commit's burst first")
    p.add_argument("--timeout", type=float, default=1800.0)
    args = p.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="sas-loaded-"))
    results = []
    if args.compare:
        with worktree(_short(args.compare)) as root:
            results.append(burst(root, _short(args.compare), args, logs / "old"))
    results.append(burst(REPO_ROOT, commit_of(REPO_ROOT), args, logs / "new"))
    print(json.dumps(results, indent=2))
    print(
        "\n| commit | orders x workers | CPU hogs | orders/s | p95 s | expired | dropped "
        "| thrown away | extra remote calls | Processed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['commit']} | {r['orders']:,} x {r['workers']} | {r['cpu_hogs']} "
            f"| {r['orders_per_s']} | {r['p95_s']} | {r['expiries']} | {r['replies_dropped']} "
            f"| {r['replies_thrown_away']} | {r['extra_remote_calls']} | {r['processed']} |"
        )


def burst(root: Path, commit: str, args: argparse.Namespace, logs: Path) -> dict[str, object]:
    return e2e.run(
        commit=commit,
        app_root=root,
        workers=args.workers,
        orders=args.orders,
        timeout=args.timeout,
        log_dir=logs,
        count_supervision=False,
        cpu_hogs=args.hogs,
    ).as_dict()


if __name__ == "__main__":
    main()

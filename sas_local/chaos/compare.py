"""`python -m sas_local.chaos.compare A.json B.json`: how many orders ended differently in two
campaign reports (``ended_by_order``), and how, e.g. two runs of one seed.

The seed fixes each order's faults (refusals, crashes, outages are drawn per key or on a seeded
schedule); what it cannot fix is timing. Orders whose outcome differs between two runs of one
seed show how much timing, rather than the faults, decides an outcome. Operators' cancels are
aimed at whichever order is live when one is due, so the differences that involve no
``Cancelled`` are also counted: what timing decided for the same faults."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

CANCELLED = "Cancelled"


def differences(first: Mapping[str, str], second: Mapping[str, str]) -> Counter[tuple[str, str]]:
    """``(outcome in first, outcome in second)`` for each order of either whose outcome
    differs (``missing`` where a report has no such order)."""
    found: Counter[tuple[str, str]] = Counter()
    for order_id in sorted(set(first) | set(second)):
        a, b = first.get(order_id, "missing"), second.get(order_id, "missing")
        if a != b:
            found[(a, b)] += 1
    return found


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sas_local.chaos.compare", description=__doc__)
    p.add_argument("first", type=Path)
    p.add_argument("second", type=Path)
    args = p.parse_args(argv)
    reports = [json.loads(path.read_text(encoding="utf-8")) for path in (args.first, args.second)]
    if any("ended_by_order" not in report for report in reports):
        p.error("a report without ended_by_order (made before reports had it)")
    first, second = (report["ended_by_order"] for report in reports)
    found = differences(first, second)
    print(f"{sum(found.values())} of {len(set(first) | set(second))} orders ended differently")
    uncancelled = sum(n for pair, n in found.items() if CANCELLED not in pair)
    print(f"{uncancelled} of them Cancelled in neither run")
    for (a, b), count in found.most_common():
        print(f"  {count:5d}  {a} -> {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

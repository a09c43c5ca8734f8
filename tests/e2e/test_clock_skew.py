"""The same orders end the same way whatever one host's clock says (sas_local/skew.py): the
Scheduler's host 9 s behind or ahead of the agents' with an allowance of 10 s, the agents' host
30 s off. Every role reads the store's time; the host 30 s off is named in a warning."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sas_local import skew

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ORDERS = 12


def test_one_host_off_changes_no_order_and_far_off_is_reported(tmp_path: Path) -> None:
    cases = [
        ("no host off", "devhost", 0.0),
        ("Scheduler 9 s behind", "devhost", -9.0),
        ("Scheduler 9 s ahead", "devhost", 9.0),
        ("agents 30 s ahead", "agents", 30.0),
    ]

    def one_case(n: int) -> skew.SkewRun:
        case, host, offset = cases[n]
        return skew.run(case, host, offset, orders=ORDERS, allowance=10, log_dir=tmp_path / str(n))

    # Two cases at a time, each a stack of its own: a case mostly waits on the 8 s answers.
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(one_case, range(len(cases))))
    baseline = runs[0].outcomes
    assert "missing" not in baseline.values() and set(baseline.values()) <= skew.TERMINAL
    for run in runs:
        assert run.outcomes == baseline, run.case
        assert run.arrived_expired == 0, run.case  # no request reached its agent past its deadline
    for run in runs[:3]:
        assert run.clock_reports == [], run.case  # within the allowance: nothing to report
    reports = runs[3].clock_reports
    assert reports and all(host.startswith("devhost-") for host, _ in reports)
    assert all(offset == pytest.approx(30, abs=1.5) for _, offset in reports)

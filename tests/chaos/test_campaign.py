"""The CI chaos campaign: 300 orders through the whole local stack under every fault kind.

Zero violations is the bar, and every fault kind must actually have been injected. The
5,000-order campaign is `make chaos`; its figures are in docs/reliability.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sas_local.chaos.campaign import FAULT_KINDS, Options, Profile, run_campaign

pytestmark = pytest.mark.chaos

ORDERS = 300
SEED = 2026


@pytest.mark.timeout(420)
def test_three_hundred_orders_under_every_fault_kind_end_with_no_violation(
    tmp_path: Path,
) -> None:
    report = run_campaign(
        Options(
            orders=ORDERS,
            seed=SEED,
            workers=2,
            supervisors=2,
            log_dir=tmp_path / "logs",
            report=tmp_path / "report.json",
            layout="flex",  # as Flex Consumption runs it: nothing shared between functions
            # The deploy restarts each of the 27 hosts once; one worker apiece halves what that
            # costs on 2 cores (a new deployment starts few instances and scales out).
            profile=Profile(deploy_workers=1),
        )
    )
    summary = json.dumps({k: v for k, v in report.items() if k != "violations"}, indent=1)
    assert report["violations"] == [], summary
    assert report["drained"], summary
    missing = [kind for kind in FAULT_KINDS if not report["faults"].get(kind)]
    assert missing == [], summary
    assert sum(report["outcomes"].values()) == ORDERS
    # The deploy brought v2, and old hosts met its orders (and put their messages back).
    assert report["bound_versions"].get("order v2", 0) > 0, summary
    assert report["faults"]["deploy.held"] > 0, summary

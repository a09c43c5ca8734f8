"""What the benchmark reads from the dev host's log: the orders the Supervisor read and the
transactions the Scheduler spent moving markers (sas_local/bench/e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sas_local.bench.e2e import _supervision_cost

pytestmark = pytest.mark.unit

LOG = "".join(
    f"2026-11-23 18:09:0{n},000 INFO [w{n % 2} {n}] {line}\n"
    for n, line in enumerate(
        (
            "sas.services.scheduler: sas.order_finished order_id=b-1",
            "sas.services.supervisor: sas.supervisor_sweep "
            "report={'healthy': 3, 'unindexed': 2} orders_read=5",
            "sas.services.supervisor: sas.supervisor_sweep "
            "report={'held_for_reply': 120} orders_read=120",
            "sas.services.marker_moves: sas.markers_moved count=1 moved=1 order_id=b-2",
            "sas.services.marker_moves: sas.markers_moved count=150 moved=149",
            "sas.services.marker_moves: sas.markers_settled count=30 moved=2 dropped=27 requests=2",
        )
    )
)


def test_reads_and_move_transactions_are_summed_over_every_worker_log(tmp_path: Path) -> None:
    (tmp_path / "devhost").mkdir()
    (tmp_path / "devhost" / "stderr.log").write_text(LOG)
    (tmp_path / "simulator").mkdir()
    (tmp_path / "simulator" / "stderr.log").write_text("sas.supervisor_sweep orders_read=999\n")
    assert _supervision_cost(tmp_path) == (125, 1 + 2 + 2)  # 2: one marker failed
    assert _supervision_cost(tmp_path / "simulator") == (0, 0)  # not a dev host log

"""The benchmark runs (``--smoke``: every part at its smallest) and reports every part; nothing
is timed here.

Its figures are read by people (docs/benchmarks.md); this test only keeps it from rotting and
checks what it reports is shaped right and self-consistent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sas_local.bench import rates, report
from sas_local.bench.__main__ import _short, parser, schedule
from sas_local.processes import REPO_ROOT

pytestmark = pytest.mark.bench


@pytest.mark.timeout(600)
def test_the_smallest_benchmark_reports_every_part(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sas_local.bench", "--smoke", "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "benchmarks.json").read_text())
    assert set(results["rates"]) >= {"table.transaction", "table.point_read", "queue.send"}
    assert all(rate > 0 for rate in results["rates"].values())
    first, last = results["rate_runs"]  # before and after the end-to-end runs
    assert results["rates"] == rates.best([first, last])
    (measured,) = results["commits"].values()
    variants = measured["counts"]["variants"]
    one, three = variants["1-step, no status subscriber"], variants["3-step, no status subscriber"]
    table = report._table_requests
    # Each step adds requests; a status subscriber adds sends, never table requests.
    assert table(three["per_order"]) > table(one["per_order"]) > 0
    subscribed = variants["3-step, with status subscriber"]["per_order"]
    assert subscribed["queue.send"] > three["per_order"]["queue.send"]
    assert three["limit_orders_per_s"] > 0
    # Each function's own CPU and wall time per invocation: the cost table's compute input.
    calls = three["invocations"]
    assert calls["submit"]["per_order"] == 1 and calls["on_reply"]["per_order"] == 3
    assert all(0 < c["cpu_ms"] <= c["wall_ms"] * 1.5 for c in calls.values())
    assert three["entities"]["entity.live"] >= 1  # the in-flight marker, counted by partition
    assert {run["workers"] for run in measured["e2e"]} == {1, 2}
    assert all(run["finished"] == run["orders"] for run in measured["e2e"])
    assert "e2e_flex" not in measured  # the smoke size leaves the Flex layout to tests/e2e
    assert results["sweep"]["live"] == 100 and results["sweep"]["sweep_s_live_only"] > 0
    assert results["sweep"]["sweep_s_live_only_all_due"] > 0
    assert all("replies_dropped" in run and "expiries" in run for run in measured["e2e"])
    # Counting the Supervisor's reads waits out the last markers: only in the full run.
    assert all(run["sweep_reads_per_order"] is None for run in measured["e2e"])
    recovery = measured["recovery"]
    assert recovery["recovered"] == recovery["orders"] and recovery["max_s"] > 0
    steps = variants["3-step, with status subscriber (steps events)"]["per_order"]
    assert steps["queue.send"] > subscribed["queue.send"]  # every step's events cost sends
    (surged,) = results["surges"]  # the smoke size: one small surge
    assert surged["offered"] > 0 and sum(surged["ended"].values()) == surged["offered"]
    assert surged["expiries"].keys() == {"all", "counted", "not_counted", "never_started"}
    assert sum(surged["goodput_per_minute"]) >= surged["ended"].get("Processed", 0)
    document = (tmp_path / "benchmarks.md").read_text()
    assert report.BEGIN in document and "Requests per order" in document
    assert "**Surges**" in document
    assert "What a 3-step order costs in Azure" in document and "Orders/s one unit" in document
    assert (tmp_path / "benchmarks.png").stat().st_size > 0


def test_the_limit_adds_up_each_request_s_share_of_the_store() -> None:
    limit = rates.order_limit({"table.point_read": 2, "queue.send": 1}, {
        "table.point_read": 100.0, "queue.send": 50.0
    })  # fmt: skip
    assert limit == 25.0  # 2/100 + 1/50 = 0.04 s of store time per order
    assert rates.order_limit({"table.merge": 1}, {"table.update": 10.0}) == 10.0
    assert rates.order_limit({"table.point_read": 1}, {}) is None


def test_the_limit_takes_each_kind_at_its_better_showing() -> None:
    runs = [{"queue.send": 300.0, "table.insert": 500.0}, {"queue.send": 450.0}]
    assert rates.best(runs) == {"queue.send": 450.0, "table.insert": 500.0}


def test_the_generated_section_replaces_only_what_lies_between_the_markers(
    tmp_path: Path,
) -> None:
    document = tmp_path / "doc.md"
    document.write_text(f"# Title\n\nkept\n\n{report.BEGIN}\nold\n{report.END}\n\nalso kept\n")
    report.into_document(document, "new figures")
    assert document.read_text() == (
        f"# Title\n\nkept\n\n{report.BEGIN}\nnew figures\n{report.END}\n\nalso kept\n"
    )
    document.write_text("no markers")
    with pytest.raises(ValueError, match="marker"):
        report.into_document(document, "x")


def _run(
    orders: int, workers: int, per_s: float, dropped: int = 0, *, cpu: bool = False
) -> dict[str, object]:
    measured = {"devhost": per_s * 10, "azurite": 1.0, "simulator": 1.0} if cpu else {}
    return {
        "orders": orders,
        "workers": workers,
        "finished": orders,
        "orders_per_s": per_s,
        "p50_s": 1.0,
        "p95_s": 2.0,
        "p99_s": 3.0,
        "replies_dropped": dropped,
        "replies_thrown_away": dropped,
        "extra_remote_calls": dropped,
        "cpu_ms_per_order": measured,
    }


def test_repeated_runs_are_shown_by_their_median_with_every_run_in_the_order_they_ran() -> None:
    runs = [_run(100, 1, 9.0), _run(100, 2, 5.0), _run(100, 1, 3.0), _run(100, 1, 6.0, 2)]
    one, two = report.median_runs(runs)
    assert (one["workers"], one["orders_per_s"], one["replies_dropped"]) == (1, 6.0, 2)
    assert [r["orders_per_s"] for r in one["each"]] == [9.0, 3.0, 6.0]
    assert report._each(one, "orders_per_s") == "6 (9, 3, 6)"
    assert report._each(two, "orders_per_s") == "5"  # a single run: no brackets


def test_side_by_side_divides_the_medians_of_each_configuration() -> None:
    counts = {"variants": {"3-step, no status subscriber": {"limit_orders_per_s": 20.0}}}
    results = {
        "interleaved": True,
        "commits": {
            "new": {"counts": counts, "e2e": [_run(100, 1, 12.0, cpu=True), _run(100, 1, 16.0)]},
            "old": {
                "counts": counts,
                "e2e": [_run(100, 1, 5.0, 3, cpu=True), _run(100, 1, 8.0, 1)],
            },
        },
    }
    lines = report._side_by_side(results)
    assert "back to back" in lines[0] and "median throughput of 2" in lines[0]
    (row,) = [line for line in lines if line.startswith("| 100 |")]
    assert "| 2.40\N{MULTIPLICATION SIGN} |" in row  # 12 / 5: the lower middle of two runs each
    assert "| 60 % |" in row and "4 (3, 1) / 0 (0, 0)" in row  # thrown away: every run's
    assert row.endswith("| 50 / 120 |")  # the dev host's CPU per order of each median run


def test_each_configuration_runs_for_both_commits_back_to_back_first_one_then_the_other() -> None:
    runs = schedule(["new", "old"], 2, [100, 1000], [1, 2])
    assert len(runs) == 2 * 2 * 2 * 2
    pairs = [runs[n : n + 2] for n in range(0, len(runs), 2)]
    assert all(a[:3] == b[:3] and {a[3], b[3]} == {"new", "old"} for a, b in pairs)
    first: dict[tuple[int, int], list[str]] = {}
    for (_, batch, workers, commit), _ in pairs:
        first.setdefault((batch, workers), []).append(commit)
    # From one configuration to the next, and for each from one repetition to the next.
    assert [firsts[0] for firsts in first.values()] == ["new", "old", "new", "old"]
    assert all(firsts[0] != firsts[1] for firsts in first.values())


@pytest.mark.parametrize(
    ("value", "said"), [("0", "at least 1"), ("-1", "at least 1"), ("two", "whole number")]
)
def test_repeat_must_be_a_whole_number_of_at_least_one(value: str, said: str, capsys) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--repeat", value])
    assert said in capsys.readouterr().err


def test_compare_names_a_commit_of_this_repository() -> None:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert _short("HEAD") == head  # what main compares with the commit being measured
    with pytest.raises(SystemExit, match="not a commit"):
        _short("no-such-revision")


def test_cores_busy_are_orders_per_second_times_the_cpu_each_order_cost() -> None:
    run: dict[str, object] = {
        **_run(1000, 4, 20.0),
        "cpu_ms_per_order": {"devhost": 50.0, "azurite": 40.0, "simulator": 2.5},
    }
    assert report._cores_busy(run) == "1.85"  # 20/s x 92.5 ms
    assert report._cores_busy(_run(1000, 4, 20.0)) == "-"  # CPU not measured: nothing made up

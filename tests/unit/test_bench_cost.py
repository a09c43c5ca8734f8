"""The cost table's arithmetic (sas_local/bench/cost.py) over counts of a known shape, and the
price file it reads: every entry sourced, every price not read from its vendor marked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sas_local.bench import cost, count, report

pytestmark = pytest.mark.unit

COUNTS = {
    "variants": {
        cost.VARIANT: {
            "per_order": {
                "table.point_read": 3.0,
                "table.transaction": 4.0,
                "table.upsert": 1.0,
                "queue.send": 7.0,
                "queue.receive": 7.0,
                "queue.delete": 7.0,
                "queue.peek": 1.0,
            },
            "supervisor_at_end": {"table.point_read": 1.0, "table.query": 1.0},
            "entities": {"entity.live": 1.0, "entity.order": 18.0, "entity.peeked_message": 2.0},
            "entities_at_end": {"entity.live": 2.0},
            "invocations": {
                "submit": {"per_order": 1.0, "cpu_ms": 10.0, "wall_ms": 20.0},
                "agent_a": {"per_order": 1.0, "cpu_ms": 5.0, "wall_ms": 10.0},
                "agent_b": {"per_order": 2.0, "cpu_ms": 5.0, "wall_ms": 10.0},
                "on_reply": {"per_order": 3.0, "cpu_ms": 10.0, "wall_ms": 20.0},
            },
        }
    },
    "sweep_per_due_live_order": {"table.point_read": 1.0},
    "sweep_entities_per_due_live_order": {"entity.live": 2.0},
}

PRICES = """
checked = "2026-01-01"
[entries.flex_execution]
usd = 0.5
per = 1_000_000
unit = "executions"
source = "https://example.com/a"
basis = "official"
[entries.flex_gb_s]
usd = 0.00001
unit = "GB-s"
source = "https://example.com/a"
basis = "official"
[entries.flex_memory_gb]
value = 2
unit = "GB"
source = "https://example.com/a"
basis = "official"
[entries.table_transaction]
usd = 0.001
per = 10_000
unit = "transactions"
source = "https://example.com/t"
basis = "secondary: somewhere"
[entries.queue_operation]
usd = 0.002
per = 10_000
unit = "operations"
source = "https://example.com/q"
basis = "official"
[entries.servicebus_operation]
usd = 1.0
per = 1_000_000
unit = "operations"
source = "https://example.com/sb"
basis = "official"
[entries.servicebus_standard_base]
usd = 10
unit = "month"
source = "https://example.com/sb"
basis = "official"
[entries.servicebus_premium_messaging_unit]
usd = 700
unit = "month"
source = "https://example.com/sb"
basis = "official"
[entries.dts_actions_per_order]
value = 7
unit = "actions"
source = "https://example.com/d"
basis = "official"
[entries.dts_consumption_action]
per = 1_000_000
unit = "actions"
source = "https://example.com/d"
basis = "no list price found"
[entries.dts_dedicated_capacity_unit]
unit = "month"
source = "https://example.com/d"
basis = "no list price found"
[entries.durable_functions_storage_operations_per_order]
value = 15
unit = "operations"
source = "https://example.com/df"
basis = "official"
[entries.temporal_actions_per_order]
value = 4
unit = "actions"
source = "https://example.com/t"
basis = "official"
[entries.temporal_action]
usd = 50
per = 1_000_000
unit = "actions"
source = "https://example.com/t"
basis = "official"
[entries.stepfunctions_transitions_per_order]
value = 3
unit = "transitions"
source = "https://example.com/s"
basis = "official"
[entries.stepfunctions_transition]
usd = 0.025
per = 1_000
unit = "transitions"
source = "https://example.com/s"
basis = "official"
[entries.storage_account_requests_per_s]
value = 20_000
unit = "requests/s"
source = "https://example.com/l"
basis = "official"
[entries.table_partition_entities_per_s]
value = 2_000
unit = "entities/s"
source = "https://example.com/l"
basis = "official"
[entries.queue_messages_per_s]
value = 2_000
unit = "messages/s"
source = "https://example.com/l"
basis = "official"
[entries.servicebus_standard_credits_per_s]
value = 1_000
unit = "credits/s"
source = "https://example.com/l"
basis = "official"
"""


@pytest.fixture
def prices(tmp_path: Path) -> Path:
    path = tmp_path / "prices.toml"
    path.write_text(PRICES)
    return path


def test_an_order_adds_up_every_invocation_and_request() -> None:
    order = cost.Order.of(COUNTS)
    assert order.executions == 7
    assert order.cpu_s == pytest.approx((10 + 5 + 10 + 30) / 1000)
    assert order.wall_s == pytest.approx((20 + 10 + 20 + 60) / 1000)
    assert order.agent_calls == 3
    assert order.table_requests == 10  # 8 on the path, 2 by the sweep that ends it
    assert order.queue_operations == 22
    assert (order.replies, order.live_entities, order.live_entities_per_look) == (3, 3, 2)


def row(lines: list[str], starts: str) -> list[str]:
    (found,) = [line for line in lines if line.startswith(f"| {starts}")]
    return [cell.strip() for cell in found.strip("|").split("|")]


def test_each_line_is_its_units_times_its_price(prices: Path) -> None:
    lines = cost.cost_lines(COUNTS, prices)
    assert row(lines, "Flex executions")[3] == "$3.50"  # 7 x $0.5 per million, a million times
    # 55 ms CPU x 2 GB x $0.00001 per GB-s, a million times; 110 ms of wall time likewise.
    assert row(lines, "Flex compute, busy")[3] == "$1.10"
    assert row(lines, "Flex compute, each invocation alone")[3] == "$2.20"
    assert row(lines, "Table transactions")[3] == "$1.00"  # 10 x $0.001 per 10,000
    assert row(lines, "Storage Queue operations")[3] == "$4.40"  # 22 x $0.002 per 10,000
    assert row(lines, "Service Bus Standard operations")[3] == "$22.00"
    total = next(line for line in lines if line.startswith("Per million orders"))
    assert "**$10.00 to $11.10** on Storage Queues" in total  # 3.5 + 1.1 or 2.2 + 1 + 4.4
    assert "**$27.60 to $28.70** on Service Bus Standard" in total


def test_the_anchors_and_the_limits_follow_their_figures(prices: Path) -> None:
    lines = cost.cost_lines(COUNTS, prices)
    assert row(lines, "Temporal Cloud")[2] == "$200.00"  # 4 actions x $50 per million
    assert row(lines, "Step Functions Standard")[2] == "$75.00"
    assert row(lines, "Durable Task Scheduler, Consumption")[2] == "no list price found"
    assert row(lines, "sas, Storage Queue transport")[2] == "$5.40"  # tables + queues
    assert row(lines, "One storage account, Service Bus transport")[3] == "2,000"  # 20,000 / 10
    # 10 table requests + 7 sends + 7 deletes + 1 peek = 25, + 7 receives (or 7/16 batched).
    assert row(lines, "One storage account, Storage Queue")[3] == "625 to 786"
    # 2,000 entities/s over 3 per order, or 3 + 2 looks of 2 entities each.
    assert re.fullmatch(r"667 \(.*\); 286 \(.*\)", row(lines, "The in-flight index")[3])
    # 2,000 messages/s over 3 replies, or over 9 operations if receives and deletes count.
    assert re.fullmatch(r"667 \(.*\); 222 \(.*\)", row(lines, "The replies queue")[3])
    # 7 sends + 7 receives + 2 messages peeked (more than the 1 peek): 16 credits.
    assert row(lines, "One Service Bus Standard namespace")[3] == "62"


def test_a_price_not_read_from_its_vendor_is_marked(prices: Path) -> None:
    lines = cost.cost_lines(COUNTS, prices)
    assert row(lines, "Table transactions")[4].endswith("⚠")
    assert not row(lines, "Storage Queue operations")[4].endswith("⚠")


def test_every_entry_of_the_price_file_is_sourced_and_used() -> None:
    checked, entries = cost.load()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", checked)
    for name, entry in entries.items():
        assert entry.source.startswith("https://"), name
        assert entry.basis, name
        priced = entry.usd is not None or entry.value is not None
        assert priced or entry.basis.startswith("no list price found"), name
    source = Path(cost.__file__).read_text()
    assert {name for name in entries if f'"{name}"' not in source} == set()


def test_the_counter_counts_a_transaction_s_entities_and_a_query_s_results() -> None:
    batch = (
        "--changeset\r\nPOST http://x/t HTTP/1.1\r\n\r\n{}\r\n"
        "--changeset\r\nMERGE http://x/t(PartitionKey='a',RowKey='b') HTTP/1.1\r\n\r\n"
    )
    counter = count.RequestCounter(table_port=1, queue_port=2)
    counter.live_partition = "~live"
    counter.counting = True
    counter.record("POST", "http://127.0.0.1:1/devstoreaccount1/$batch", {}, None, batch)
    counter.record(
        "GET",
        "http://127.0.0.1:1/devstoreaccount1/t()?$filter=PartitionKey%20eq%20'~live'",
        {},
        '{"value": [{}, {}, {}]}',
    )
    assert counter.counts["entity.order"] == 2
    assert counter.counts["entity.live"] == 3
    assert counter.counts["table.transaction"] == 1 and counter.counts["table.query"] == 1


def test_a_busy_instance_is_billed_the_end_to_end_cpu_when_measured(prices: Path) -> None:
    lines = cost.cost_lines(COUNTS, prices, busy=cost.EndToEndCpu(ms_per_order=120, orders=1000))
    busy = row(lines, "Flex compute, busy")
    assert "a burst of 1,000, end to end" in busy[0]
    # 120 ms CPU x 2 GB x $0.00001 per GB-s, a million times (not the functions' own 55 ms).
    assert busy[1:4:2] == ["120 ms CPU", "$2.40"]


def test_the_busy_cpu_is_the_largest_one_worker_bursts_median() -> None:
    def run(orders: int, workers: int, ms: float, layout: str = "shared") -> dict[str, object]:
        cpu = {"devhost": ms}
        return {"orders": orders, "workers": workers, "layout": layout, "cpu_ms_per_order": cpu}

    e2e = [run(100, 1, 90), run(1000, 1, 130), run(1000, 1, 120), run(1000, 1, 150)]
    e2e += [run(1000, 2, 500), run(5000, 1, 999, layout="flex")]
    results = {"commits": {"abc1234": {"e2e": e2e}}}
    assert report.busy_cpu(results) == cost.EndToEndCpu(ms_per_order=130, orders=1000)
    assert report.busy_cpu({"commits": {"abc1234": {"e2e": []}}}) is None

"""What a 3-step order costs in Azure and how many orders/s one unit of each resource allows.

Arithmetic only: the measured inputs are the benchmark's (requests, entities and each function
invocation's CPU and wall time per order, from ``count.py``); prices and documented targets come
from ``prices.toml``, each with its source. Nothing here is measured or assumed silently.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sas_local.bench.rates import HOST_BATCH

PRICES = Path(__file__).with_name("prices.toml")
VARIANT = "3-step, no status subscriber"
MILLION = 1_000_000


@dataclass(frozen=True)
class Entry:
    """A price (``usd`` per ``per`` units) or a documented figure (``value``), with its source."""

    unit: str
    source: str
    basis: str
    usd: float | None = None
    per: float = 1.0
    value: float | None = None

    def cost(self, units: float) -> float | None:
        """What ``units`` cost; None where no list price was found."""
        return None if self.usd is None else self.usd * units / self.per

    @property
    def official(self) -> bool:
        return self.basis.startswith("official")

    @property
    def figure(self) -> float:
        if self.value is None:
            raise ValueError(f"{self.unit}: a price, not a figure")
        return self.value


def load(path: Path = PRICES) -> tuple[str, dict[str, Entry]]:
    """The date the prices were read, and every entry by name."""
    data = tomllib.loads(path.read_text())
    entries = {name: Entry(**fields) for name, fields in data["entries"].items()}
    return str(data["checked"]), entries


@dataclass(frozen=True)
class Order:
    """What one order of the measured variant costs, from the counts."""

    executions: float
    cpu_s: float
    wall_s: float
    agent_calls: float
    table_requests: float
    sends: float
    receives: float
    deletes: float
    peeks: float
    peeked: float
    """Messages the peeks returned: Service Bus bills a credit for each."""
    replies: float
    live_entities: float
    live_entities_per_look: float

    @classmethod
    def of(cls, counts: dict[str, Any]) -> Order:
        variant = counts["variants"][VARIANT]
        per, at_end = variant["per_order"], variant["supervisor_at_end"]
        calls = variant["invocations"]
        due = counts.get("sweep_entities_per_due_live_order") or {}
        return cls(
            executions=sum(c["per_order"] for c in calls.values()),
            cpu_s=sum(c["per_order"] * c["cpu_ms"] for c in calls.values()) / 1000,
            wall_s=sum(c["per_order"] * c["wall_ms"] for c in calls.values()) / 1000,
            agent_calls=sum(c["per_order"] for name, c in calls.items() if "agent" in name),
            table_requests=_table(per) + _table(at_end),
            sends=per.get("queue.send", 0.0),
            receives=per.get("queue.receive", 0.0),
            deletes=per.get("queue.delete", 0.0),
            peeks=per.get("queue.peek", 0.0),
            peeked=variant["entities"].get("entity.peeked_message", 0.0),
            replies=calls.get("on_reply", {}).get("per_order", 0.0),
            live_entities=variant["entities"].get("entity.live", 0.0)
            + variant["entities_at_end"].get("entity.live", 0.0),
            live_entities_per_look=due.get("entity.live", 0.0),
        )

    @property
    def queue_operations(self) -> float:
        return self.sends + self.receives + self.deletes + self.peeks


def _table(counts: dict[str, float]) -> float:
    return sum(v for k, v in counts.items() if k.startswith("table."))


def _usd(amount: float | None) -> str:
    if amount is None:
        return "no list price found"
    return f"${amount:,.2f}" if amount >= 0.1 else f"${amount:,.3f}"


def _link(entry: Entry) -> str:
    return f"[source]({entry.source})" + ("" if entry.official else " ⚠")


def _unit_price(entry: Entry) -> str:
    """``$0.000026 per`` (``per 10,000``): the price as written, never in exponent form."""
    usd = f"{entry.usd or 0:.10f}".rstrip("0").rstrip(".")
    return f"${usd} per" + ("" if entry.per == 1 else f" {entry.per:,.0f}")


def _per_million(entry: Entry, units: float) -> float | None:
    cost = entry.cost(units)
    return None if cost is None else cost * MILLION


def invocation_lines(counts: dict[str, Any]) -> list[str]:
    """Each function's CPU and wall time per invocation in a 3-step order."""
    variant = counts["variants"][VARIANT]
    lines = [
        "**Each function invocation of a 3-step order** (its own code in one process, SDK calls "
        "included, the host's receive and delete not; wall time waits on Azurite and the "
        "simulator, which answers at once):",
        "",
        "| Function | Invocations per order | CPU ms each | Wall ms each |",
        "|---|---|---|---|",
    ]
    for name, spent in variant["invocations"].items():
        lines.append(
            f"| {name} | {spent['per_order']:g} | {spent['cpu_ms']:g} | {spent['wall_ms']:g} |"
        )
    sweep = variant.get("supervisor_at_end_ms")
    if sweep:
        lines.append(
            f"| supervise (the sweep that ends it) | 1 | {sweep['cpu_ms']:g} | "
            f"{sweep['wall_ms']:g} |"
        )
    return [*lines, ""]


def _cost_rows(
    order: Order, p: dict[str, Entry], busy: EndToEndCpu | None
) -> list[tuple[str, str, Entry, float]]:
    """(line, per order, its price, units per order) of each billed line. A busy instance's
    CPU is the end-to-end figure when there is one: it adds the host's receives and deletes,
    which the per-invocation timing leaves out."""
    memory = p["flex_memory_gb"].figure
    cpu_s, whose = (
        (order.cpu_s, "the functions' own")
        if busy is None
        else (busy.ms_per_order / 1000, f"a burst of {busy.orders:,}, end to end")
    )
    return [
        ("Flex executions", f"{order.executions:g}", p["flex_execution"], order.executions),
        (f"Flex compute, busy instance ({memory:g} GB x CPU time, {whose})",
         f"{cpu_s * 1000:.0f} ms CPU", p["flex_gb_s"], cpu_s * memory),
        (f"Flex compute, each invocation alone ({memory:g} GB x wall time at local latency)",
         f"{order.wall_s * 1000:.0f} ms", p["flex_gb_s"], order.wall_s * memory),
        ("Table transactions", f"{order.table_requests:g}", p["table_transaction"],
         order.table_requests),
        ("Storage Queue operations (Storage Queue transport)",
         f"{order.queue_operations:.3g}", p["queue_operation"], order.queue_operations),
        ("Service Bus Standard operations (Service Bus transport: a send, a receive and a "
         "complete per message)",
         f"{order.queue_operations:.3g}", p["servicebus_operation"], order.queue_operations),
    ]  # fmt: skip


@dataclass(frozen=True)
class EndToEndCpu:
    """The dev host's CPU per order in an end-to-end burst, one worker."""

    ms_per_order: float
    orders: int


def cost_lines(
    counts: dict[str, Any], path: Path = PRICES, *, busy: EndToEndCpu | None = None
) -> list[str]:
    """The cost and scale section of docs/benchmarks.md, for the measured counts (and the
    end-to-end CPU per order, when measured)."""
    checked, p = load(path)
    order = Order.of(counts)
    memory = p["flex_memory_gb"].figure
    rows = _cost_rows(order, p, busy)
    cpu = (
        "the CPU of the app's own functions, one order at a time"
        if busy is None
        else "the dev host's CPU per order in the end-to-end burst of "
        f"{busy.orders:,} orders on one worker"
    )
    lines = [
        f"**What a 3-step order costs in Azure** (per million orders; prices read {checked} "
        "into `sas_local/bench/prices.toml`, ⚠ where not from the vendor's own page; counts "
        f"and wall time measured above, one order at a time; {cpu}):",
        "",
        "| Line | Per order | Unit price | Per million orders | Source |",
        "|---|---|---|---|---|",
    ]
    amounts = []
    for name, count, entry, units in rows:
        amounts.append(_per_million(entry, units) or 0.0)
        price = f"{_unit_price(entry)} {entry.unit}"
        lines.append(f"| {name} | {count} | {price} | {_usd(amounts[-1])} | {_link(entry)} |")
    runs, on_cpu, alone, tables, on_queues, on_bus = amounts
    remote = _per_million(p["flex_gb_s"], order.agent_calls * 0.1 * memory)
    base = p["servicebus_standard_base"]
    trickle = _per_million(p["flex_gb_s"], order.executions * memory)
    lines += [
        "",
        f"Per million orders: **{_usd(runs + on_cpu + tables + on_queues)} to "
        f"{_usd(runs + alone + tables + on_queues)}** on Storage Queues, "
        f"**{_usd(runs + on_cpu + tables + on_bus)} to {_usd(runs + alone + tables + on_bus)}** on "
        f"Service Bus Standard, plus its base charge of {_usd(base.usd)} a month "
        f"({_link(base)}). Each agent invocation waits for its remote service, and Flex bills "
        f"the wait: 100 ms more per call adds up to {_usd(remote)} per million orders when "
        "each invocation has its instance alone, less as invocations share one. A trickle of "
        "orders costs more per order: an instance's activity bills at least 1 s, so an order "
        f"whose {order.executions:g} invocations each wake an instance bills "
        f"{order.executions * memory:g} GB-s ({_usd(trickle)} "
        "per million such orders). Left out: "
        "status subscribers' sends, circuit-breaker reads and the store clock's calibration "
        "(per process, not per order), the Supervisor's timer (one execution a period) and the "
        "hosts' polls of idle queues.",
        "",
    ]
    lines += _anchors(order, p, tables + on_queues, tables + on_bus)
    lines += _limits(order, p)
    return lines


def _anchors(order: Order, p: dict[str, Entry], on_queues: float, on_bus: float) -> list[str]:
    """The same order on the systems users compare this with: what each bills per order for
    orchestration state and messaging (each system's compute, like sas's Flex lines, apart)."""
    dts = p["dts_actions_per_order"].figure
    actions = p["temporal_actions_per_order"].figure
    transitions = p["stepfunctions_transitions_per_order"].figure
    df_operations = p["durable_functions_storage_operations_per_order"]
    dedicated = p["dts_dedicated_capacity_unit"]
    rows = [
        ("sas, Storage Queue transport", f"{order.table_requests:g} table requests + "
         f"{order.queue_operations:.3g} queue operations", on_queues, "measured above"),
        ("sas, Service Bus Standard transport", f"{order.table_requests:g} table requests + "
         f"{order.queue_operations:.3g} Service Bus operations", on_bus, "measured above"),
        ("Durable Functions, Azure Storage provider (at the queue price)",
         f"about {df_operations.figure:g} storage operations, plus idle polling",
         _per_million(p["queue_operation"], df_operations.figure), _link(df_operations)),
        ("Durable Task Scheduler, Consumption", f"{dts:g} actions",
         _per_million(p["dts_consumption_action"], dts), _link(p["dts_consumption_action"])),
        ("Durable Task Scheduler, Dedicated", f"{dts:g} actions; a unit serves 2,000/s",
         _per_million(dedicated, 0), _link(dedicated)),
        ("Temporal Cloud", f"{actions:g} actions",
         _per_million(p["temporal_action"], actions), _link(p["temporal_action"])),
        ("Step Functions Standard", f"{transitions:g} state transitions",
         _per_million(p["stepfunctions_transition"], transitions),
         _link(p["stepfunctions_transition"])),
    ]  # fmt: skip
    lines = [
        "**Beside the systems it is compared with** (orchestration state and messaging per "
        "million 3-step orders; each system's compute is extra, as sas's Flex lines are):",
        "",
        "| System | Billed per order | Per million orders | Source |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {what} | {_usd(usd)} | {src} |" for name, what, usd, src in rows]
    return [*lines, ""]


def _limits(order: Order, p: dict[str, Entry]) -> list[str]:
    """Orders/s one unit of each resource allows, from the documented targets."""
    account = p["storage_account_requests_per_s"]
    partition = p["table_partition_entities_per_s"]
    queue = p["queue_messages_per_s"]
    credits = p["servicebus_standard_credits_per_s"]
    batched = order.receives / HOST_BATCH
    on_queues = (order.table_requests + order.sends + order.deletes + order.peeks, batched)
    # A credit per message peeked (an empty peek counted as one); under a backlog one peek
    # returns up to 32 messages, so this is the figure of a system that keeps up.
    peek_credits = max(order.peeks, order.peeked)
    bus_credits = order.sends + order.receives + peek_credits
    look = order.live_entities_per_look
    rows = [
        ("One storage account, Storage Queue transport", f"{account.figure:,g} requests/s",
         f"{on_queues[0]:.3g} requests + {order.receives:g} receives "
         f"({batched:.2g} batched)",
         f"{account.figure / (on_queues[0] + order.receives):,.0f} to "
         f"{account.figure / (on_queues[0] + batched):,.0f}", _link(account)),
        ("One storage account, Service Bus transport", f"{account.figure:,g} requests/s",
         f"{order.table_requests:g} table requests",
         f"{account.figure / order.table_requests:,.0f}", _link(account)),
        ("The in-flight index partition", f"{partition.figure:,g} entities/s",
         f"{order.live_entities:g} entities, + {look:g} per look while in flight",
         f"{partition.figure / order.live_entities:,.0f} (finished by its first deadline); "
         f"{partition.figure / (order.live_entities + 2 * look):,.0f} (in flight at two looks, "
         "as in a 1,000-order burst)",
         _link(partition)),
        ("The replies queue", f"{queue.figure:,g} messages/s",
         f"{order.replies:g} messages ({3 * order.replies:g} operations with receive and delete)",
         f"{queue.figure / order.replies:,.0f} (messages); "
         f"{queue.figure / (3 * order.replies):,.0f} (if receives and deletes count)",
         _link(queue)),
        ("One Service Bus Standard namespace", f"{credits.figure:,g} credits/s",
         f"{bus_credits:.3g} credits ({order.sends:g} sends, {order.receives:g} receives, "
         f"{peek_credits:.2g} peeked; a peek under a backlog costs up to 32)",
         f"{credits.figure / bus_credits:,.0f}", _link(credits)),
    ]  # fmt: skip
    lines = [
        "**Orders/s one unit allows** (3-step orders; documented targets, this commit's counts):",
        "",
        "| Resource | Documented target | One order uses | Orders/s | Source |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    premium = p["servicebus_premium_messaging_unit"]
    lines += [
        "",
        f"One Service Bus Premium messaging unit ({_unit_price(premium)} {premium.unit}, "
        f"{_link(premium)}) has no per-operation quota; Microsoft gives no "
        "orders/s figure for it, so it is to be measured, not computed here.",
        "",
    ]
    return lines

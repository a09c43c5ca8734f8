"""The operator's queries and purge against Azurite: what the real store's queries find (counts
by state; orders by state, priority, age and last update) and what its purge deletes (dry run,
boundary, every row gone, never an Error or running order, a race lost). What the operator
decides alone (a bad query refused, a submission's lane): tests/unit/test_operator_decisions.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sas.adapters.table_store import TableStateStore
from sas.domain.model import AuditEntry, AuditQuery, HistoryEntry, ProcessState
from sas.services.operator import OrderQuery
from sas.testing import refuse
from tests.harness import World
from tests.unit.test_services import submitted

pytestmark = pytest.mark.integration


def _order(world: World, order_id: str, *, workflow: str = "order", priority: str = "normal"):
    world.submit(
        submitted(order_id).model_copy(update={"workflow": workflow, "priority": priority})
    )
    return order_id


def _rows(world: World, order_id: str) -> list[str]:
    assert isinstance(world.store, TableStateStore)
    table = world.store._table
    return [
        e["RowKey"]
        for e in table.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
    ]


@pytest.fixture
def mixed(world: World, strict: str) -> World:
    """Two Processed orders (one high), one Error (strict workflow, card declined), one
    Pending (submitted, never scheduled) of low priority, ten minutes apart."""
    _order(world, "done-a")
    world.run()
    world.clock.advance(600)
    _order(world, "done-b", priority="high")
    world.run()
    world.clock.advance(600)
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    _order(world, "broken", workflow=strict)
    world.run()
    world.clock.advance(600)
    _order(world, "waiting", priority="low")
    for lane in world.routes.all_lanes(world.routes.agents["inventory"]):
        world.bus.take(lane)
    return world


def test_counts_cover_every_state_with_zeros(mixed: World) -> None:
    counts = mixed.operator.counts()
    assert set(counts) == set(ProcessState)
    assert counts[ProcessState.PROCESSED] == 2
    assert counts[ProcessState.ERROR] == 1
    assert counts[ProcessState.COMPENSATED] == 0
    assert counts[ProcessState.PENDING] + counts[ProcessState.PROCESSING] == 1
    assert sum(counts.values()) == 4


def test_find_filters_by_state_priority_and_age(mixed: World) -> None:
    find = mixed.operator.find
    ids = lambda states: [s.order_id for s in states]  # noqa: E731
    assert ids(find(OrderQuery())) == ["waiting", "broken", "done-b", "done-a"]  # newest first
    assert ids(find(OrderQuery(state=ProcessState.PROCESSED))) == ["done-b", "done-a"]
    assert ids(find(OrderQuery(state=ProcessState.ERROR))) == ["broken"]
    assert ids(find(OrderQuery(priority="high"))) == ["done-b"]
    assert ids(find(OrderQuery(priority="low"))) == ["waiting"]
    assert ids(find(OrderQuery(priority="normal"))) == ["broken", "done-a"]
    # Submitted 30, 20, 10 and 0 minutes ago (by the operator's clock).
    assert ids(find(OrderQuery(older_than=timedelta(minutes=15)))) == ["done-b", "done-a"]
    assert ids(find(OrderQuery(newer_than=timedelta(minutes=15)))) == ["waiting", "broken"]
    both = OrderQuery(older_than=timedelta(minutes=5), newer_than=timedelta(minutes=25))
    assert ids(find(both)) == ["broken", "done-b"]
    assert ids(find(OrderQuery(limit=1))) == ["waiting"]
    assert find(OrderQuery(state=ProcessState.COMPENSATED)) == []


def test_purge_dry_run_lists_and_deletes_nothing(mixed: World) -> None:
    before = {oid: _rows(mixed, oid) for oid in ("done-a", "done-b", "broken", "waiting")}
    report = mixed.operator.purge(timedelta(minutes=15), dry_run=True)
    assert report.dry_run and report.purged == 0
    assert [s.order_id for s in report.candidates] == ["done-a", "done-b"]
    assert report.cutoff == mixed.clock.now() - timedelta(minutes=15)
    assert {oid: _rows(mixed, oid) for oid in before} == before


def test_purge_keeps_the_order_finished_exactly_at_the_cutoff(mixed: World) -> None:
    finished_b = mixed.state("done-b").finished_at
    assert finished_b is not None
    retention = mixed.clock.now() - finished_b  # cutoff == done-b's finish: not older, kept
    report = mixed.operator.purge(retention, dry_run=False)
    assert [s.order_id for s in report.candidates] == ["done-a"] and report.purged == 1
    assert _rows(mixed, "done-a") == []
    assert mixed.store.get_state("done-b") is not None
    # One microsecond more and it is older than the retention.
    report = mixed.operator.purge(retention - timedelta(microseconds=1), dry_run=False)
    assert [s.order_id for s in report.candidates] == ["done-b"] and report.purged == 1


def test_purge_deletes_every_row_and_never_error_or_running_orders(mixed: World) -> None:
    kept = {oid: _rows(mixed, oid) for oid in ("broken", "waiting")}
    assert len(_rows(mixed, "done-a")) > 5  # order, state, steps, history
    report = mixed.operator.purge(timedelta(0), dry_run=False)
    assert sorted(s.order_id for s in report.candidates) == ["done-a", "done-b"]
    assert report.purged == 2
    assert _rows(mixed, "done-a") == [] and _rows(mixed, "done-b") == []
    assert {oid: _rows(mixed, oid) for oid in kept} == kept
    assert mixed.operator.counts()[ProcessState.PROCESSED] == 0
    assert mixed.operator.purge(timedelta(0), dry_run=False).purged == 0


def test_purge_of_a_long_order_takes_several_transactions_and_leaves_nothing(world: World) -> None:
    _order(world, "long")
    world.run()
    state = world.state("long")
    for n in range(150):
        world.store.add_history(
            HistoryEntry(
                order_id="long",
                at=state.updated_at + timedelta(microseconds=n + 1),
                kind="note",
                attempt=state.attempt,
                step=None,
                mode="do",
                actor="test",
                detail=str(n),
            )
        )
    assert len(_rows(world, "long")) > 150
    world.clock.advance(1)
    report = world.operator.purge(timedelta(0), dry_run=False)
    assert report.purged == 1 and _rows(world, "long") == []


def test_purge_skips_an_order_whose_state_changed_since_it_was_read(world: World) -> None:
    _order(world, "raced")
    world.run()
    (stale,) = list(world.store.query_states(process_state=ProcessState.PROCESSED))
    fresh = world.store.get_state("raced")
    assert fresh is not None
    world.store.update_state(fresh.value, fresh.etag)  # someone wrote in between
    assert world.store.purge_order(stale) is False
    assert world.store.get_state("raced") is not None


def test_orders_updated_since_a_time_are_found_and_older_ones_not(mixed: World) -> None:
    """The health view's one query: by the state row's UpdatedAt, on the service."""
    now = mixed.clock.now()
    since = now - timedelta(minutes=15)
    found = {v.value.order_id for v in mixed.store.query_states(updated_after=since)}
    assert found == {"broken", "waiting"}
    everything = mixed.store.query_states(updated_after=now - timedelta(hours=2))
    assert {v.value.order_id for v in everything} == {"done-a", "done-b", "broken", "waiting"}


def test_purge_by_state_and_id_audits_each_and_the_audit_outlives_the_order(mixed: World):
    mixed.operator.close("broken", actor="alice", reason="refunded by hand")
    mixed.clock.advance(1)
    report = mixed.operator.purge(
        timedelta(0), states={ProcessState.CLOSED}, actor="bob", dry_run=False
    )
    assert [s.order_id for s in report.candidates] == ["broken"] and report.purged == 1
    assert _rows(mixed, "broken") == [] and mixed.store.get_state("done-a") is not None
    mixed.clock.advance(1)
    report = mixed.operator.purge(
        None, order_ids=["done-a", "nosuch", "waiting", "done-a"], actor="bob", dry_run=False
    )
    assert [s.order_id for s in report.candidates] == ["done-a"] and report.purged == 1
    assert report.unmatched == ["nosuch", "waiting"]  # no such order; not finished
    assert mixed.store.get_state("done-b") is not None
    entries = mixed.operator.audit(10)
    assert [(e.action, e.target, e.actor) for e in entries] == [
        ("purge", "done-a", "bob"),
        ("purge", "broken", "bob"),
        ("close", "broken", "alice"),
    ]
    assert entries[2].reason == "refunded by hand" and entries[1].detail == "Closed strict order"
    assert [e.action for e in mixed.operator.audit(10, target="broken")] == ["purge", "close"]
    assert [e.target for e in mixed.operator.audit(10, actor="alice")] == ["broken"]
    assert [e.target for e in mixed.operator.audit(1, action="purge")] == ["done-a"]


def test_the_audit_is_newest_first_across_months_and_many_rows(world: World) -> None:
    late_november = datetime(2026, 11, 30, 23, 59, tzinfo=UTC)
    entries = [
        AuditEntry(late_november + timedelta(seconds=n), "ops", "purge", f"o{n:03d}")
        for n in range(150)  # two transactions in November, the rest in December
    ]
    world.store.append_audit(entries)
    listed = world.store.list_audit(AuditQuery(1000))
    assert [e.target for e in listed] == [f"o{n:03d}" for n in reversed(range(150))]
    assert listed[0].at == entries[-1].at and listed[-1].at.month == 11
    assert [e.target for e in world.store.list_audit(AuditQuery(2, target="o000"))] == ["o000"]

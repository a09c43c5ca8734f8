"""The state store against real Azurite: atomicity, ETag fencing of writes, time round-trips."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from sas.adapters.table_store import TableStateStore
from sas.domain.errors import AlreadyExists, ConcurrencyConflict, NotFound
from sas.domain.model import (
    HistoryEntry,
    MissingDefinition,
    OrderRecord,
    OrderState,
    ProcessState,
    StepRecord,
    Versioned,
)
from sas.domain.transitions import claim, initial_state
from sas.domain.wire import Priority, room_row_key
from tests.harness import store_on
from tests.workflows import SHOP

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC)


def order(order_id: str = "o1", fingerprint: str = "f1") -> OrderRecord:
    return OrderRecord(
        order_id, "order", {"customer_id": "c1", "lines": []}, fingerprint, NOW, "status-q"
    )


def new_state(order_id: str = "o1"):
    return initial_state(order_id, SHOP, reply_to="status-q", now=NOW)


def stored_state(store: TableStateStore, order_id: str = "o1") -> Versioned[OrderState]:
    versioned = store.get_state(order_id)
    assert versioned is not None, f"no state row for {order_id}"
    return versioned


def test_order_and_state_are_inserted_together(table):
    store = store_on(table)
    store.create_order(order(), new_state())
    assert store.get_order("o1") == order()
    versioned = stored_state(store)
    assert versioned.value == new_state()
    assert versioned.etag


def test_a_failed_transaction_leaves_nothing_behind(table):
    # The state row exists alone (as if written by something else): inserting order+state
    # must fail as a whole, so the order row must not appear.
    table.create_entity({"PartitionKey": "o1", "RowKey": "state", "Marker": "pre-existing"})
    with pytest.raises(AlreadyExists):
        store_on(table).create_order(order(), new_state())
    with pytest.raises(ResourceNotFoundError):
        table.get_entity("o1", "order")
    assert table.get_entity("o1", "state")["Marker"] == "pre-existing"


def test_a_second_insert_of_the_same_order_is_refused_and_keeps_the_original(table):
    store = store_on(table)
    store.create_order(order(), new_state())
    with pytest.raises(AlreadyExists):
        store.create_order(order(fingerprint="other"), new_state())
    kept = store.get_order("o1")
    assert kept is not None and kept.fingerprint == "f1"


def test_a_stale_etag_is_rejected(table):
    store = store_on(table)
    store.create_order(order(), new_state())
    first = stored_state(store)
    claimed = claim(first.value, instance_id="s1", now=NOW, workflow=SHOP)
    new_etag = store.update_state(claimed, first.etag)
    assert new_etag != first.etag
    with pytest.raises(ConcurrencyConflict):
        store.update_state(replace(claimed, locked_by="s2"), first.etag)
    assert stored_state(store).value.locked_by == "s1"


def test_update_of_a_missing_state_is_not_found(table):
    store = store_on(table)
    with pytest.raises(NotFound):
        store.update_state(new_state("ghost"), "W/\"datetime'2026-01-01T00%3A00%3A00Z'\"")


def test_cleared_fields_are_removed_not_left_behind(table):
    store = store_on(table)
    store.create_order(order(), new_state())
    first = stored_state(store)
    claimed = claim(first.value, instance_id="s1", now=NOW, workflow=SHOP)
    etag = store.update_state(claimed, first.etag)
    released = replace(
        claimed, locked_by=None, complete_by=None, process_state=ProcessState.PROCESSED
    )
    store.update_state(released, etag)
    assert stored_state(store).value == released
    assert "LockedBy" not in table.get_entity("o1", "state")


def test_times_round_trip_as_aware_utc_to_the_microsecond(table):
    store = store_on(table)
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2026, 11, 22, 14, 0, 0, 654321, tzinfo=plus_two)
    state = replace(new_state(), complete_by=local)
    store.create_order(order(), state)
    read = stored_state(store).value
    assert read.complete_by == local
    assert read.complete_by.tzinfo == UTC
    assert read.submitted_at == NOW and read.submitted_at.utcoffset() == timedelta(0)
    assert type(read.submitted_at) is datetime


def test_steps_are_recorded_with_the_state_write_and_listed_in_order(table):
    store = store_on(table)
    store.create_order(order(), new_state())
    second = StepRecord("o1", 1, "charge", 2, NOW, {"effect_id": "e2"})
    first = StepRecord("o1", 0, "reserve", 1, NOW, {"effect_id": "e1"})
    etag = stored_state(store).etag
    etag = store.update_state(new_state(), etag, entry("completed", 2), step=second)
    etag = store.update_state(new_state(), etag, step=first)
    redo = replace(second, attempt=5, result={"effect_id": "e2b"})
    store.update_state(new_state(), etag, step=redo)  # a step run again replaces the record
    assert store.get_steps("o1") == [first, redo]


def test_a_step_record_is_never_written_without_its_state_write(table):
    store = store_on(table)
    store.create_order(order(), new_state())
    stale = stored_state(store).etag
    store.update_state(new_state(), stale)
    done = StepRecord("o1", 0, "reserve", 1, NOW, {"effect_id": "e1"})
    with pytest.raises(ConcurrencyConflict):
        store.update_state(new_state(), stale, entry("completed", 1), step=done)
    assert store.get_steps("o1") == []
    assert store.get_history("o1") == []


def test_parked_messages_keep_reason_and_the_whole_body(table):
    store = store_on(table)
    body = bytes(range(256)) * 400  # 100 KiB, binary: spans several properties
    parked_id = store.park_message("sas-orders", "invalid OrderSubmitted: x", body, NOW)
    (parked,) = store.list_parked()
    assert parked.id == parked_id
    assert parked.reason == "invalid OrderSubmitted: x"
    assert parked.body == body and parked.body_truncated is False
    # One value with what the host parks: by the app, on its queue, when it was parked.
    assert (parked.parked_by, parked.queue, parked.parked_at) == ("app", "sas-orders", NOW)
    assert parked.function is None and parked.delivery_count is None
    assert store.get_parked(parked_id) == parked


def entry(kind: str, attempt: int = 1, at: datetime = NOW) -> HistoryEntry:
    return HistoryEntry("o1", at, kind, attempt, step="reserve", actor="s1")


def test_a_transition_and_its_history_commit_together(table):
    store = store_on(table)
    store.create_order(order(), new_state(), entry("submitted", 0))
    first = stored_state(store)
    claimed = claim(first.value, instance_id="s1", now=NOW, workflow=SHOP)
    etag = store.update_state(claimed, first.etag, entry("claimed", 1, NOW + timedelta(seconds=1)))
    assert stored_state(store).etag == etag
    assert [h.kind for h in store.get_history("o1")] == ["submitted", "claimed"]


def test_a_stale_etag_inside_a_transaction_writes_neither_state_nor_history(table):
    # Azurite has been known to ignore If-Match inside batches; this pins that it does not.
    store = store_on(table)
    store.create_order(order(), new_state())
    first = stored_state(store)
    claimed = claim(first.value, instance_id="s1", now=NOW, workflow=SHOP)
    store.update_state(claimed, first.etag, entry("claimed"))
    with pytest.raises(ConcurrencyConflict):
        store.update_state(replace(claimed, locked_by="s2"), first.etag, entry("claimed", 2))
    assert stored_state(store).value.locked_by == "s1"
    assert [h.attempt for h in store.get_history("o1")] == [1]


def test_live_markers_are_dropped_only_if_untouched_since_read(table):
    store = store_on(table)
    store.touch_live("o1", NOW, NOW)
    store.touch_live("o2", NOW, NOW)
    markers = {m.order_id: m for m in store.list_live()}
    assert set(markers) == {"o1", "o2"}
    store.touch_live("o1", NOW + timedelta(seconds=1), NOW)  # e.g. an operator resubmits it
    assert store.drop_live(markers["o1"]) is False
    assert store.drop_live(markers["o2"]) is True
    assert [m.order_id for m in store.list_live()] == ["o1"]


def test_only_due_markers_are_listed_and_rearming_is_conditional(table):
    store = store_on(table)
    store.touch_live("early", NOW, NOW + timedelta(seconds=5))
    store.touch_live("late", NOW, NOW + timedelta(seconds=30))
    assert store.list_due(NOW) == []
    [due] = store.list_due(NOW + timedelta(seconds=5))
    assert (due.order_id, due.due_at) == ("early", NOW + timedelta(seconds=5))
    assert store.rearm_live([(due, NOW + timedelta(seconds=60))]) == 1
    assert store.rearm_live([(due, NOW)]) == 0  # read before the re-arm: stale
    assert store.list_due(NOW + timedelta(seconds=30)) == [
        m for m in store.list_live() if m.order_id == "late"
    ]
    assert {m.order_id for m in store.list_due(NOW + timedelta(seconds=60))} == {"early", "late"}


def test_markers_are_counted_by_workflow_up_to_a_bound_and_keep_it_when_rearmed(table):
    store = store_on(table)
    for n in range(5):
        store.touch_live(f"o{n}", NOW, NOW, "order")
    store.touch_live("w0", NOW, NOW, "workspace")
    store.touch_live("old", NOW, NOW)  # a marker from before markers named their workflow
    store.touch_live("o9", NOW + timedelta(seconds=30), NOW, "order")
    assert store.count_live("order", 100) == 6
    assert store.count_live("order", 3) == 3
    assert store.count_live("workspace", 100) == 1
    assert store.count_live("nothing", 100) == 0
    assert store.rearm_live([(m, NOW + timedelta(minutes=1)) for m in store.list_due(NOW)]) == 8
    assert store.count_live("order", 100) == 6  # a re-arm keeps the workflow
    assert {m.workflow for m in store.list_live()} == {"order", "workspace", ""}


def test_a_finished_marker_is_due_at_once_counted_by_no_workflow_and_beats_older_reads(table):
    store = store_on(table)
    store.touch_live("o1", NOW, NOW + timedelta(minutes=5), "order")
    store.touch_live("o2", NOW, NOW + timedelta(minutes=5), "order")
    [read_before] = [m for m in store.list_live() if m.order_id == "o1"]
    store.finish_live("o1", NOW)
    assert store.count_live("order", 100) == 1
    [due] = store.list_due(NOW)
    assert (due.order_id, due.finished, due.due_at) == ("o1", True, NOW)
    assert store.rearm_live([(read_before, NOW + timedelta(minutes=1))]) == 0  # stale: refused
    assert store.rearm_live([(due, NOW + timedelta(seconds=1))]) == 1
    [rearmed] = store.list_due(NOW + timedelta(seconds=1))
    assert rearmed.finished and store.count_live("order", 100) == 1  # a re-arm keeps the flag
    assert store.rearm_live([], [rearmed]) == 1
    assert [m.order_id for m in store.list_live()] == ["o2"]


def test_the_waiting_room_returns_a_workflows_rows_in_turn_and_drops_each_once(table):
    store = store_on(table)
    later = NOW + timedelta(seconds=1)
    big = b"x" * (70 * 1024)  # more than one property holds
    rows: list[tuple[str, Priority, datetime, str, bytes]] = [
        ("order", "low", NOW, "l1", b"low"),
        ("order", "normal", later, "n2", big),
        ("order", "normal", NOW, "n1", b"first"),
        ("orderx", "normal", NOW, "x1", b"x"),  # a name the first one is a prefix of
        ("ord", "normal", NOW, "o1", b"o"),
    ]
    for workflow, priority, at, order_id, body in rows:
        store.wait_for_room(room_row_key(workflow, priority, at, order_id), order_id, body)
    store.wait_for_room(room_row_key("order", "low", NOW, "l1"), "l1", b"again")  # kept as was
    found = store.list_waiting("order", 10)
    assert [(w.order_id, w.body) for w in found] == [("n1", b"first"), ("n2", big), ("l1", b"low")]
    assert [w.order_id for w in store.list_waiting("order", 2)] == ["n1", "n2"]
    assert [w.order_id for w in store.list_waiting("orderx", 10)] == ["x1"]
    stranded = store.list_stranded(("order",), 10)  # what waits for workflows not deployed
    assert [w.order_id for w in stranded] == ["x1", "o1"]  # "orderx~" sorts before "ord~"
    assert [w.order_id for w in store.list_stranded(("ord", "orderx"), 10)] == ["n1", "n2", "l1"]
    assert store.list_stranded(("order", "orderx", "ord"), 10) == []
    assert store.drop_waiting(found[0]) is True
    assert store.drop_waiting(found[0]) is False  # gone: a second mover is told
    assert [w.order_id for w in store.list_waiting("order", 10)] == ["n2", "l1"]


def test_let_ins_create_markers_and_leave_the_room_a_hundred_to_a_request(table):
    store = store_on(table)
    ids = [f"o{n:03d}" for n in range(130)]  # two transactions each way
    for order_id in ids:
        store.wait_for_room(room_row_key("order", "normal", NOW, order_id), order_id, b"{}")
    rows = store.list_waiting("order", 200)
    store.touch_live("o007", NOW, NOW, "order")  # e.g. an order live under that id
    created = store.create_live_all([(order_id, NOW, NOW, "order") for order_id in ids])
    assert sorted(created) == [i for i in ids if i != "o007"]  # the one there left as it is
    assert store.count_live("order", 200) == 130
    assert store.rearm_live([], [created["o001"], created["o002"]]) == 2  # by their ETags
    assert store.drop_waiting(rows[5]) is True  # gone since read: left out, the rest go
    assert store.drop_waiting_all(rows) == 129
    assert store.list_waiting("order", 200) == []


def test_places_held_are_the_workflows_markers_and_its_waiting_rows_up_to_a_bound(table):
    store = store_on(table)
    for n in range(3):
        store.touch_live(f"o{n}", NOW, NOW, "order")
    store.finish_live("o0", NOW)
    for order_id in ("w1", "w2"):
        store.wait_for_room(room_row_key("order", "low", NOW, order_id), order_id, b"{}")
    store.wait_for_room(room_row_key("orderx", "normal", NOW, "x1"), "x1", b"{}")
    assert store.count_held("order", 100) == 4  # two in flight, two waiting
    assert store.count_held("order", 3) == 3
    assert store.count_held("order", 2) == 2  # the markers alone: the room is not asked
    assert store.count_held("orderx", 100) == 1


def test_the_in_flight_index_is_a_table_of_its_own(table):
    """Finished history never lies in the way of the Supervisor's query."""
    store = store_on(table)
    store.create_order(order(), new_state())
    store.touch_live("o1", NOW, NOW)
    assert all(e["PartitionKey"] != "~live" for e in table.list_entities())
    assert [m.order_id for m in store.list_live()] == ["o1"]


def test_new_state_fields_round_trip(table):
    store = store_on(table)
    state = replace(
        new_state(), mode="undo", not_before=NOW, alert_pending=True, deferrals=2, load_expiries=3
    )
    store.create_order(order(), state)
    assert stored_state(store).value == state


def test_an_orders_binding_round_trips_and_a_row_from_before_reads_as_version_one(table):
    store = store_on(table)
    bound = replace(
        initial_state("o1", SHOP, reply_to=None, now=NOW, incarnation="0123456789ab"),
        version=3,
        first_attempt=2,
        waiting="order v3 is not deployed",
    )
    store.create_order(replace(order(), version=3, incarnation="0123456789ab"), bound)
    assert stored_state(store).value == bound
    assert (bound.step, bound.definition) == ("reserve", SHOP.fingerprint)
    assert store.get_order("o1") == replace(order(), version=3, incarnation="0123456789ab")
    entity = dict(table.get_entity("o1", "state"))
    for column in ("Version", "Definition", "Incarnation", "Step", "FirstAttempt", "Waiting"):
        del entity[column]
    table.upsert_entity(entity, mode=UpdateMode.REPLACE)
    old = stored_state(store).value
    assert (old.version, old.definition, old.incarnation, old.step, old.first_attempt) == (
        1,
        "",
        "",
        "",
        0,
    )
    assert old.waiting is None


def test_a_missing_definitions_note_is_kept_replaced_and_forgotten(table):
    store = store_on(table)
    missing = MissingDefinition("trip.1.0123456789abcdef", "trip v1 is not deployed", NOW)
    assert store.get_missing(missing.key) is None
    store.note_missing(missing)
    assert store.get_missing(missing.key) == missing
    later = replace(missing, since=NOW + timedelta(days=1))
    store.note_missing(later)
    assert store.get_missing(missing.key) == later
    store.forget_missing(missing.key)
    store.forget_missing(missing.key)  # gone already: no error
    assert store.get_missing(missing.key) is None


def test_orders_are_listed_by_state(table):
    store = store_on(table)
    store.create_order(order("a1"), new_state("a1"))
    store.create_order(order("a2"), replace(new_state("a2"), process_state=ProcessState.ERROR))
    found = store.query_states(process_state=ProcessState.ERROR)
    assert [s.value.order_id for s in found] == ["a2"]
    found = store.query_states(process_state=ProcessState.PENDING)
    assert [s.value.order_id for s in found] == ["a1"]


def test_rearming_many_markers_moves_all_but_one_touched_in_between(table):
    store = store_on(table)
    ids = [f"o{n:03d}" for n in range(130)]  # two transactions' worth
    for order_id in ids:
        store.touch_live(order_id, NOW, NOW)
    markers = store.list_due(NOW)
    store.touch_live("o007", NOW, NOW)  # e.g. an operator resubmits it meanwhile
    store.drop_live(next(m for m in markers if m.order_id == "o042"))  # or it finished
    later = NOW + timedelta(seconds=15)
    sent = transactions_sent(store)
    assert store.rearm_live([(m, later) for m in markers]) == len(ids) - 2
    # the first hundred again without o007, then without o042, then the other thirty
    assert [len(operations) for operations in sent] == [100, 99, 98, 30]
    assert [m.order_id for m in store.list_due(NOW)] == ["o007"]
    assert len(store.list_due(later)) == len(ids) - 1


def test_a_sweeps_marker_writes_leave_out_each_one_changed_since_and_the_rest_go(table):
    """Each failed operation costs a request (under load many orders finish during a sweep,
    each flagging its marker); the rest go, so the next sweep need not read their orders."""
    store = store_on(table)
    ids = [f"o{n:03d}" for n in range(20)]
    for order_id in ids:
        store.touch_live(order_id, NOW, NOW)
    markers = store.list_due(NOW)
    for order_id in ids[:10]:  # ten touched since the sweep read them
        store.touch_live(order_id, NOW, NOW)
    sent = transactions_sent(store)
    later = NOW + timedelta(seconds=15)
    assert store.rearm_live([(m, later) for m in markers]) == 10
    assert [len(operations) for operations in sent] == list(range(20, 9, -1))
    assert sorted(m.order_id for m in store.list_due(NOW)) == ids[:10]  # their owners decide


def transactions_sent(store: TableStateStore) -> list[list[object]]:
    """Records the in-flight index's transactions (each still goes to Azurite)."""
    sent: list[list[object]] = []
    live = store._live
    submit = live.submit_transaction

    def recording(operations, **kwargs):
        sent.append(list(operations))
        return submit(operations, **kwargs)

    setattr(live, "submit_transaction", recording)  # noqa: B010  # a method, for mypy
    return sent


def test_a_sweeps_drops_go_with_its_re_arms_each_on_the_etag_it_read(table):
    """The Supervisor drops the markers of finished orders a hundred to a request, beside its
    re-arms; a marker touched since it was read stays."""
    store = store_on(table)
    ids = [f"d{n:03d}" for n in range(120)]
    for order_id in ids:
        store.touch_live(order_id, NOW, NOW)
    markers = store.list_due(NOW)
    store.touch_live("d003", NOW + timedelta(seconds=1), NOW)  # touched after the read
    later = NOW + timedelta(seconds=15)
    sent = transactions_sent(store)
    rearms = [(m, later) for m in markers[:20]]
    assert store.rearm_live(rearms, markers[20:]) == len(ids) - 1
    assert [len(operations) for operations in sent] == [100, 99, 20]
    live = {m.order_id: m for m in store.list_live()}
    assert set(live) == {f"d{n:03d}" for n in range(20)}
    assert live["d003"].touched_at == NOW + timedelta(seconds=1)
    assert {m.due_at for k, m in live.items() if k != "d003"} == {later}


def test_steps_results_round_trip_however_large_and_shrink_without_leftovers(table):
    store = store_on(table)
    store.create_order(order(), new_state())
    etag = stored_state(store).etag
    # Past one string column's 64 KiB: kept in as many columns as needed (non-ASCII too).
    big = {f"step{i}": {"blob": "é€" * 9000, "i": i} for i in range(4)}
    etag = store.update_state(replace(new_state(), results=big), etag)
    assert stored_state(store).value.results == big
    columns = [k for k in table.get_entity("o1", "state") if k.startswith("Results")]
    assert len(columns) > 1
    store.update_state(replace(new_state(), results={"step0": {"i": 0}}), etag)
    assert stored_state(store).value.results == {"step0": {"i": 0}}
    assert [k for k in table.get_entity("o1", "state") if k.startswith("Results")] == ["Results00"]

"""The `sas` CLI against Azurite, every command: it reads and changes the app's own table and
queues through the app's services, with the app's settings (the environment, a settings file,
or the local run's), on the operator's clock (injected here). What it refuses before it reaches
the app (bad arguments, ids, filters, settings files; an unknown order), and its help, are
proved in memory: tests/unit/test_cli_refusals.py and tests/unit/test_cli_settings_source.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from azure.core.exceptions import ResourceExistsError
from azure.data.tables import TableClient
from rich.console import Console

from sas import bootstrap
from sas import settings as app_settings
from sas.adapters.breaker_table import TableBreakerStore
from sas.adapters.clients import queue_service_client
from sas.adapters.load_table import TableLoadStore
from sas.domain.breaker import BreakerState, BreakerStatus, Tally
from sas.domain.messages import OperatorAlert
from sas.domain.model import ProcessState
from sas.domain.wire import LIVE_PARTITION, POISON_SUFFIX
from sas.testing import refuse
from sas_cli import commands
from sas_cli.commands import run
from sas_local.devhost.queues import decode_body
from tests.harness import World, live_table_of
from tests.integration.test_bad_input import VALID_ORDER, body
from tests.integration.test_poison import NOT_BASE64, RAW, Poison
from tests.unit.test_services import submitted

pytestmark = pytest.mark.integration

DETAILS = json.dumps(VALID_ORDER["details"])


@pytest.fixture
def world(app_env, table, monkeypatch) -> World:
    """Orders put in their states by the real services on this test's table; the CLI's
    operator runs on the same fake clock."""
    made = World(table)
    monkeypatch.setattr(bootstrap, "clock", lambda: made.clock)
    monkeypatch.setattr(commands, "console", Console(width=250))
    return made


def order(world: World, order_id: str, *, workflow: str = "order", priority: str = "normal"):
    world.submit(
        submitted(order_id).model_copy(update={"workflow": workflow, "priority": priority})
    )
    return order_id


def finish(world: World, order_id: str, **kwargs: Any) -> str:
    order(world, order_id, **kwargs)
    world.run()
    return order_id


def sas(capsys, *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def sas_json(capsys, *argv: str) -> Any:
    code, out, err = sas(capsys, "--json", *argv)
    assert code == 0, err
    return json.loads(out)


def rows(table: TableClient, order_id: str) -> list[str]:
    found = table.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
    return [entity["RowKey"] for entity in found]


def marker(table: TableClient, order_id: str) -> bool:
    found = live_table_of(table).query_entities(
        "PartitionKey eq @pk and RowKey eq @rk", parameters={"pk": LIVE_PARTITION, "rk": order_id}
    )
    return any(True for _ in found)


def queue_bodies(queue: str) -> list[bytes]:
    client = queue_service_client(bootstrap.settings().storage).get_queue_client(queue)
    return [decode_body(m.content, "base64") for m in client.peek_messages(max_messages=32)]


# --- submit -------------------------------------------------------------------------------


def test_submit_sends_the_order_to_its_priority_lane(world, capsys):
    code, out, err = sas(capsys, "submit", "order", DETAILS, "--priority", "high")
    assert code == 0, err
    order_id = out.strip()
    settings = bootstrap.settings()
    (sent,) = queue_bodies(settings.lane(app_settings.QUEUE_ORDERS, "high"))
    message = json.loads(sent)
    assert (message["order_id"], message["priority"]) == (order_id, "high")
    assert message["details"] == VALID_ORDER["details"]
    assert queue_bodies(settings.lane(app_settings.QUEUE_ORDERS, "normal")) == []


def test_submit_refuses_an_id_another_order_has_and_sends_nothing(world, capsys):
    order(world, "taken")
    lane = bootstrap.settings().queue(app_settings.QUEUE_ORDERS)
    before = queue_bodies(lane)
    other = json.dumps({**json.loads(DETAILS), "customer_id": "someone-else"})
    code, out, err = sas(capsys, "submit", "order", other, "--order-id", "taken")
    assert code == 1 and out == ""
    assert err.strip() == "sas: error: order id taken already used for a different order"
    assert queue_bodies(lane) == before


def test_submit_takes_details_from_a_file_and_an_order_id(world, capsys, tmp_path):
    details = tmp_path / "details.json"
    details.write_text(DETAILS)
    sent = sas_json(
        capsys,
        "submit",
        "order",
        f"@{details}",
        "--order-id",
        "cli-7",
        "--reply-to",
        "status-mine",
        "--status-events",
        "steps",
    )
    assert sent["order_id"] == "cli-7" and "cli-7" in sent["message_id"]
    (message,) = queue_bodies(bootstrap.settings().queue(app_settings.QUEUE_ORDERS))
    document = json.loads(message)
    assert (document["order_id"], document["reply_to"], document["status_events"]) == (
        "cli-7",
        "status-mine",
        "steps",
    )


# --- status, history, list ----------------------------------------------------------------


@pytest.fixture
def mixed(world: World, strict: str) -> World:
    """Ten minutes apart: Processed (normal), Processed (high), Error (card declined),
    Compensated (refused), and one still Processing (low)."""
    finish(world, "done-a")
    world.clock.advance(600)
    finish(world, "done-b", priority="high")
    world.clock.advance(600)
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    finish(world, "broken", workflow=strict)
    world.clock.advance(600)
    world.remote.script("payment", "charge", refuse("HTTP 422 refused"))
    finish(world, "undone")
    world.clock.advance(600)
    order(world, "running", priority="low")  # claimed at submission, never delivered
    return world


def test_status_shows_one_orders_state(mixed, capsys):
    code, out, _ = sas(capsys, "status", "broken")
    assert code == 0
    assert "broken Error at charge" in out and "card declined" in out
    shown = sas_json(capsys, "status", "running")
    assert (shown["process_state"], shown["priority"], shown["step"]) == (
        "Processing",
        "low",
        "reserve",
    )
    assert shown["attempt"] == 1


def test_history_shows_the_timeline_and_completed_steps(mixed, capsys):
    code, out, _ = sas(capsys, "history", "broken")
    assert code == 0
    assert "history" in out and "completed steps" in out and "refused" in out
    assert '"customer_id"' in out and "result" in out  # the input, each step's result
    timeline = sas_json(capsys, "history", "broken")
    assert [h["kind"] for h in timeline["history"]] == [
        "submitted",
        "claimed",
        "completed",
        "claimed",
        "refused",
    ]
    assert timeline["history"][-1]["attempt"] == 2
    assert "card declined" in timeline["history"][-1]["detail"]
    assert [s["name"] for s in timeline["steps"]] == ["reserve"]
    assert timeline["details"] == VALID_ORDER["details"]
    # The first spelling still works.
    assert sas(capsys, "orders", "show", "broken")[0] == 0


def listed(capsys, *argv: str) -> list[str]:
    return [state["order_id"] for state in sas_json(capsys, "list", *argv)]


def test_list_filters_by_state_priority_age_and_limit(mixed, capsys):
    assert listed(capsys) == ["running", "undone", "broken", "done-b", "done-a"]
    assert listed(capsys, "--state", "Processed") == ["done-b", "done-a"]
    assert listed(capsys, "--state", "error") == ["broken"]
    assert listed(capsys, "--state", "Compensated") == ["undone"]
    assert listed(capsys, "--priority", "high") == ["done-b"]
    assert listed(capsys, "--priority", "low") == ["running"]
    # Submitted 40, 30, 20, 10 and 0 minutes ago by the operator's clock.
    assert listed(capsys, "--older-than", "25m") == ["done-b", "done-a"]
    assert listed(capsys, "--newer-than", "900s") == ["running", "undone"]
    assert listed(capsys, "--older-than", "5m", "--newer-than", "1h") == [
        "undone",
        "broken",
        "done-b",
        "done-a",
    ]
    assert listed(capsys, "--older-than", "1d") == []
    assert listed(capsys, "--state", "Processed", "--priority", "normal") == ["done-a"]
    assert listed(capsys, "--limit", "2") == ["running", "undone"]
    assert sas_json(capsys, "orders", "list", "--state", "Error")[0]["order_id"] == "broken"
    code, out, _ = sas(capsys, "list", "--state", "Error")
    assert code == 0 and "broken" in out and "card declined" in out and "done-a" not in out
    # The step an order is at, and its error's text (any case); and how many match in all.
    assert listed(capsys, "--step", "charge") == ["broken"]
    assert listed(capsys, "--step", "reserve") == ["running", "undone"]  # undone: at reserve (undo)
    assert listed(capsys, "--error", "CARD DECLINED") == ["broken"]
    assert listed(capsys, "--error", "refused", "--state", "Compensated") == ["undone"]
    code, out, _ = sas(capsys, "list", "--error", "[/v1/refund] [red]x")  # text, never markup
    assert code == 0 and "[/v1/refund] [red]x" in out and "0 of 0 matching" in out
    code, out, _ = sas(capsys, "list", "--limit", "2")
    assert code == 0 and out.rstrip().endswith("2 of 5 matching order(s)\nnext page: --offset 2")


def test_list_pages_and_takes_absolute_times(mixed, capsys):
    start = mixed.clock.now() - timedelta(minutes=40)  # when done-a was submitted
    assert listed(capsys, "--limit", "2", "--offset", "2") == ["broken", "done-b"]
    code, out, _ = sas(capsys, "list", "--limit", "2", "--offset", "4")
    assert code == 0 and out.rstrip().endswith("5-5 of 5 matching order(s)")
    code, out, _ = sas(capsys, "list", "--offset", "9")
    assert code == 0 and "none past the first 9 of 5" in out
    # Absolute instants: from is inclusive, until exclusive; no zone means UTC.
    naive = (start + timedelta(minutes=5)).replace(tzinfo=None).isoformat()
    assert listed(capsys, "--from", naive) == ["running", "undone", "broken", "done-b"]
    paris = (start + timedelta(minutes=15)).astimezone(timezone(timedelta(hours=1)))
    assert listed(capsys, "--from", naive, "--until", paris.isoformat()) == ["done-b"]
    # With an age too: both hold.
    assert listed(capsys, "--from", naive, "--older-than", "15m") == ["broken", "done-b"]
    code, _, err = sas(capsys, "list", "--from", paris.isoformat(), "--until", naive)
    assert code == 2 and "--until must be after --from" in err
    code, _, err = sas(capsys, "list", "--from", "yesterday")
    assert code == 2 and "is not a time" in err
    for edge in ("0001-01-01", "9999-12-31T23:59:59", "0001-01-01T00:30+01:00"):
        code, out, err = sas(capsys, "list", "--from", edge)
        assert (code, out) == (2, "") and "is out of range: from 1900 to 9000" in err
    code, _, err = sas(capsys, "resubmit", "--all", "--until", "9999-12-31")
    assert code == 2 and "out of range" in err


# --- resubmit -----------------------------------------------------------------------------


def test_close_settles_an_error_order_and_purge_may_then_remove_it(mixed, capsys):
    code, out, err = sas(
        capsys, "close", "broken", "--reason", "refunded by hand", "--actor", "ops"
    )
    assert (code, out.strip()) == (0, "closed broken"), err
    shown = sas_json(capsys, "history", "broken")
    assert shown["process_state"] == "Closed" and "card declined" in shown["last_error"]
    closing = [(e["actor"], e["detail"]) for e in shown["history"] if e["kind"] == "closed"]
    assert closing == [("ops", "refunded by hand")]
    for argv, exit_code in (
        (("close", "broken", "--reason", "again"), 1),  # Closed, not Error
        (("close", "done-a", "--reason", "x"), 1),
        (("close", "broken"), 2),  # no reason
        (("close", "running", "--reason", "   "), 2),
    ):
        code, out, err = sas(capsys, *argv)
        assert code == exit_code and out == "" and err.startswith("sas: error: "), argv
    assert sas_json(capsys, "status", "running")["process_state"] == "Processing"
    mixed.clock.advance(60)  # purge takes what finished before its cutoff
    dry = sas_json(capsys, "purge", "--older-than", "30s")
    assert "broken" in {state["order_id"] for state in dry["candidates"]}


def test_resubmit_all_lists_first_then_resubmits_each_error_order(mixed, capsys):
    code, out, _ = sas(capsys, "resubmit", "--all")
    assert code == 0 and "broken" in out and "done-a" not in out
    assert "dry run: 1 of 1 matching order(s) would be resubmitted, nothing was changed" in out
    assert sas_json(capsys, "status", "broken")["process_state"] == "Error"
    assert sas_json(capsys, "resubmit", "--all", "--priority", "high")["matched"] == 0

    report = sas_json(capsys, "resubmit", "--all", "--yes", "--actor", "ops")
    assert report == {"dry_run": False, "matched": 1, "total": 1, "orders": {"broken": "done"}}
    shown = sas_json(capsys, "history", "broken")
    assert shown["process_state"] == "Pending"
    assert [e["actor"] for e in shown["history"] if e["kind"] == "resubmitted"] == ["ops"]
    assert sas_json(capsys, "resubmit", "--all", "--yes")["matched"] == 0


def test_resubmit_runs_an_error_order_again_and_refuses_a_processed_one(mixed, capsys):
    code, out, _ = sas(capsys, "resubmit", "broken", "--actor", "alice")
    assert code == 0 and out.strip() == "resubmitted broken: now Pending"
    history = sas_json(capsys, "history", "broken")["history"]
    assert history[-1]["kind"] == "resubmitted" and history[-1]["actor"] == "alice"
    scheduler = bootstrap.settings().queue(app_settings.QUEUE_SCHEDULER)
    assert [json.loads(m)["order_id"] for m in queue_bodies(scheduler)] == ["broken"]

    code, out, err = sas(capsys, "resubmit", "broken")  # Pending now: not again
    assert code == 1 and "Error" in err
    code, out, err = sas(capsys, "resubmit", "done-a")
    assert code == 1 and out == "" and "Error" in err
    assert mixed.state("done-a").process_state is ProcessState.PROCESSED
    assert len(queue_bodies(scheduler)) == 1


# --- parked messages: the app's and the host's, one noun ----------------------------------


def park(world: World, payload: bytes, *, ago: float = 0, reason: str = "invalid") -> str:
    at = world.clock.now() - timedelta(seconds=ago)
    return bootstrap.store().park_message("sas-orders", reason, payload, at)


@pytest.fixture
def poison(world, queue_service) -> Poison:
    # Poison queues outlive a test (Azurite is shared by the session): start each one empty.
    for name in bootstrap.settings().queues.values():
        client = queue_service.get_queue_client(name + POISON_SUFFIX)
        with contextlib.suppress(ResourceExistsError):
            client.create_queue()
        client.clear_messages()
    return Poison(queue_service)


def test_parked_list_replay_and_discard_what_the_app_parked(world, poison, capsys):
    replayed = park(world, body(order_id="cli-1"), ago=7200)
    discarded = park(world, b"\xff\x00", reason="not UTF-8")

    code, out, _ = sas(capsys, "parked", "list")
    assert code == 0
    assert "2h" in out and "not UTF-8" in out and "<binary>" in out and " app " in out
    assert f" {replayed}\n" in out and f" {discarded}\n" in out  # whole, to copy
    found = {m["id"]: m for m in sas_json(capsys, "parked", "list")}
    assert set(found) == {replayed, discarded}
    assert found[replayed]["age_seconds"] == 7200
    assert {(m["parked_by"], m["function"]) for m in found.values()} == {("app", "submit")}

    code, out, _ = sas(capsys, "parked", "replay", replayed)
    assert code == 0 and out.strip() == f"replayed {replayed}"
    assert queue_bodies("sas-orders") == [body(order_id="cli-1")]
    assert sas_json(capsys, "parked", "discard", discarded)["status"] == "discarded"
    assert sas_json(capsys, "parked", "list") == []

    for verb in ("replay", "discard"):
        code, out, err = sas(capsys, "parked", verb, replayed)
        assert code == 1 and err.strip() == "sas: error: no such parked message"
        # A row number of the list is not an id: the error says which to give.
        code, out, err = sas(capsys, "parked", verb, "1")
        assert code == 1 and "give the id `sas parked list` prints after #1" in err
    assert queue_bodies("sas-orders") == [body(order_id="cli-1")]


def test_a_parked_message_the_app_would_not_take_is_refused(world, poison, capsys):
    parked = bootstrap.store().park_message("sas-alerts", "x", b"{}", world.clock.now())
    code, _, err = sas(capsys, "parked", "replay", parked)
    assert code == 1 and "not a queue the app consumes" in err
    assert [m["id"] for m in sas_json(capsys, "parked", "list")] == [parked]


def test_parked_list_replay_and_discard_what_the_host_gave_up_on(poison, capsys):
    replayed = poison.put("sas-agent-shipping", RAW)
    discarded = poison.put("sas-agent-inventory", NOT_BASE64)

    listed = sas_json(capsys, "parked", "list")
    assert {m["id"] for m in listed} == {replayed, discarded}
    assert {(m["parked_by"], m["transport"]) for m in listed} == {("host", "storage")}
    code, out, _ = sas(capsys, "parked", "list")
    assert code == 0 and "sas-agent-shipping" in out and "sas-agent-inventory" in out
    assert " host " in out
    assert f" {replayed}\n" in out and f" {discarded}\n" in out

    code, out, _ = sas(capsys, "parked", "replay", replayed)
    assert code == 0 and out.strip() == f"replayed {replayed}"
    assert poison.peek("sas-agent-shipping") == [RAW]  # unchanged
    assert sas_json(capsys, "parked", "discard", discarded) == {
        "id": discarded,
        "status": "discarded",
    }
    assert sas_json(capsys, "parked", "list") == []
    assert poison.peek("sas-agent-inventory") == []

    code, _, err = sas(capsys, "parked", "discard", discarded)
    assert code == 1 and err.strip() == "sas: error: no such parked message"


def test_parked_lists_both_kinds_oldest_first_up_to_the_limit(world, poison, capsys):
    world.clock.current = datetime.now(UTC) - timedelta(hours=1)  # an hour behind the queue's
    older = park(world, body(order_id="cli-2"), ago=60)
    host = poison.put("sas-orders", RAW)  # moved to poison now, by the queue's clock
    newer = park(world, b"{}")
    listed = sas_json(capsys, "parked", "list")
    assert [(m["id"], m["parked_by"]) for m in listed] == [
        (older, "app"),
        (newer, "app"),
        (host, "host"),
    ]
    assert [m["id"] for m in sas_json(capsys, "parked", "list", "--limit", "2")] == [older, newer]


def test_parked_replay_all_lists_the_matches_then_replays_each(world, poison, capsys):
    old_a = park(world, body(order_id="cli-3"), ago=7200, reason="unknown workflow 'x'")
    old_b = park(world, body(order_id="cli-4"), ago=3700, reason="Unknown Workflow 'y'")
    recent = park(world, body(order_id="cli-5"), ago=60, reason="unknown workflow 'z'")
    other = park(world, b"{}", ago=7200, reason="not an order")
    hosts = poison.put("sas-agent-shipping", RAW)

    code, out, _ = sas(
        capsys, "parked", "replay", "--all", "--by", "app", "--reason", "UNKNOWN workflow",
        "--older-than", "1h",
    )  # fmt: skip
    assert code == 0
    assert "dry run: 2 of 2 matching message(s) would be replayed, nothing was changed" in out
    assert old_a in out and old_b in out and recent not in out and other not in out
    assert queue_bodies("sas-orders") == []

    report = sas_json(
        capsys, "parked", "replay", "--all", "--reason", "unknown workflow", "--older-than",
        "1h", "--yes", "--limit", "1",
    )  # fmt: skip
    assert (report["dry_run"], report["matched"], report["total"]) == (False, 1, 2)
    assert report["messages"] == [
        {"id": old_a, "queue": "sas-orders", "reason": "unknown workflow 'x'", "outcome": "done"}
    ]
    assert queue_bodies("sas-orders") == [body(order_id="cli-3")]
    left = {m["id"] for m in sas_json(capsys, "parked", "list")}
    assert left == {old_b, recent, other, hosts}


def test_parked_list_filters_by_who_queue_reason_and_age(world, poison, capsys):
    old = park(world, body(order_id="cli-6"), ago=7200, reason="unknown workflow 'x'")
    park(world, b"{}", ago=60, reason="unknown workflow 'y'")
    poison.put("sas-agent-shipping", RAW)
    shown = sas_json(capsys, "parked", "list", "--reason", "WORKFLOW", "--older-than", "1h")
    assert [m["id"] for m in shown] == [old]
    assert len(sas_json(capsys, "parked", "list", "--by", "app")) == 2
    listed = sas_json(capsys, "parked", "list", "--queue", "sas-agent-shipping")
    assert [m["parked_by"] for m in listed] == ["host"]
    code, out, _ = sas(capsys, "parked", "list", "--by", "app", "--limit", "1")
    assert code == 0 and "1 of 2 matching message(s)" in out


def test_a_storage_poison_queue_past_what_a_peek_shows_is_said_and_settled_in_rounds(
    poison, capsys
):
    for _ in range(40):
        poison.put("sas-agent-payment", RAW)
    code, out, _ = sas(capsys, "parked", "list", "--by", "host")
    assert code == 0 and "32 of 32 matching message(s)" in out
    assert "more may be parked than were listed" in out
    code, out, _ = sas(capsys, "parked", "discard", "--all", "--by", "host", "--yes")
    assert code == 0 and "discarded 32 of 32" in out and "more may be parked" in out
    report = sas_json(capsys, "parked", "discard", "--all", "--by", "host", "--yes")
    assert (report["matched"], report["more_unlisted"]) == (8, False)
    assert poison.peek("sas-agent-payment-poison") == []


def test_parked_discard_all_by_queue_and_who_parked_it(world, poison, capsys):
    kept = park(world, b"{}", reason="not an order")
    gone = [poison.put("sas-agent-shipping", RAW), poison.put("sas-agent-shipping", RAW)]
    other_queue = poison.put("sas-agent-inventory", RAW)

    code, out, _ = sas(
        capsys, "parked", "discard", "--all", "--by", "host", "--queue", "sas-agent-shipping",
        "--yes",
    )  # fmt: skip
    assert code == 0 and "discarded 2 of 2 message(s)" in out
    left = {m["id"] for m in sas_json(capsys, "parked", "list")}
    assert left == {kept, other_queue} and not left & set(gone)
    assert poison.peek("sas-agent-shipping") == []


@pytest.mark.parametrize("hostile", ["/replay", "/../", "?limit=1", "#", "x", ""])
def test_an_id_that_is_not_exactly_a_messages_id_touches_nothing(world, poison, capsys, hostile):
    parked = park(world, body())
    poisoned = poison.put("sas-orders", RAW)
    for target in (parked, poisoned):
        for verb in ("replay", "discard"):
            code, out, err = sas(
                capsys, "parked", verb, target + hostile if hostile else target[:-1]
            )
            assert code == 1 and out == "" and "no such" in err
    assert sorted(m["id"] for m in sas_json(capsys, "parked", "list")) == sorted([parked, poisoned])
    assert queue_bodies("sas-orders") == []


# --- purge --------------------------------------------------------------------------------


@pytest.fixture
def finished(world, strict) -> dict[str, str]:
    """Old Processed, Compensated and Error orders; an hour later one Processed order, and one
    finished a second after it; two running orders (Processing) from the start."""
    running = [order(world, "run-1"), order(world, "run-2")]
    for queue in world.routes.all_lanes(world.routes.agents["inventory"]):
        world.bus.take(queue)  # their agents never answer
    old = finish(world, "old-done")
    world.remote.script("payment", "charge", refuse("HTTP 422 refused"))
    undone = finish(world, "old-undone")
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    broken = finish(world, "old-broken", workflow=strict)
    world.clock.advance(3600)
    outside = finish(world, "edge-out")
    world.clock.advance(1)
    inside = finish(world, "edge-in")
    assert {world.state(o).process_state for o in (old, outside, inside)} == {
        ProcessState.PROCESSED
    }
    assert world.state(undone).process_state is ProcessState.COMPENSATED
    assert world.state(broken).process_state is ProcessState.ERROR
    # Now is exactly a day after "edge-in" finished: the cutoff of a 1d retention is that
    # very instant, and "finished before the cutoff" leaves it out.
    edge = world.state(inside).finished_at
    assert edge is not None
    world.clock.current = edge + timedelta(days=1)
    return {"running": ",".join(running), "broken": broken, "inside": inside}


def test_purge_is_a_dry_run_first_then_deletes_exactly_what_it_listed(
    world, finished, table, capsys
):
    everything_before = {o: rows(table, o) for o in listed(capsys)}
    expected = ["old-done", "old-undone", "edge-out"]

    report = sas_json(capsys, "purge", "--older-than", "1d")
    assert report["dry_run"] is True and report["purged"] == 0
    assert [c["order_id"] for c in report["candidates"]] == expected  # oldest first
    assert datetime.fromisoformat(report["cutoff"]) == world.state("edge-in").finished_at
    code, out, _ = sas(capsys, "purge", "--older-than", "1d")
    assert code == 0 and "dry run: 3 order(s) would be purged, nothing was deleted" in out
    assert all(o in out for o in expected) and "edge-in" not in out
    assert {o: rows(table, o) for o in listed(capsys)} == everything_before  # nothing gone

    code, out, _ = sas(capsys, "purge", "--older-than", "1d", "--yes")
    assert code == 0 and "purged 3 of 3 order(s)" in out
    for gone in expected:
        assert rows(table, gone) == []  # order, state, steps and history
        assert sas(capsys, "status", gone)[0] == 1
    kept = ["edge-in", "old-broken", "run-1", "run-2"]
    assert sorted(listed(capsys)) == sorted(kept)
    for left in kept:
        assert rows(table, left) == everything_before[left]
    assert marker(table, "run-1") and marker(table, "run-2")
    assert sas_json(capsys, "purge", "--older-than", "1d")["candidates"] == []


def test_purge_past_the_boundary_takes_the_edge_order_and_never_an_error_one(
    world, finished, capsys
):
    world.clock.advance(0.001)
    report = sas_json(capsys, "purge", "--older-than", "1d", "--yes")
    assert [c["order_id"] for c in report["candidates"]][-1] == "edge-in"
    assert report["purged"] == 4
    assert sorted(listed(capsys)) == ["old-broken", "run-1", "run-2"]


# --- watch --------------------------------------------------------------------------------


def test_watch_renders_counts_and_recent_failures(mixed, capsys):
    code, out, _ = sas(capsys, "watch", "--iterations", "1")
    assert code == 0
    counts = {
        line.split()[1]: line.split()[3]
        for line in out.splitlines()
        if len(line.split()) == 5 and line.split()[1] in {s.value for s in ProcessState}
    }
    assert counts == {
        "Pending": "0",
        "Processing": "1",
        "Compensating": "0",
        "Processed": "2",
        "Compensated": "1",
        "Error": "1",
        "Closed": "0",
        "Cancelled": "0",
        "Terminated": "0",
    }
    failures = out[out.index("recent failures") :]
    assert "broken" in failures and "card declined" in failures
    assert "undone" in failures and "refused" in failures
    assert "done-a" not in failures and "running" not in failures


def test_watch_as_json_lines_for_scripts(mixed, capsys):
    code, out, _ = sas(capsys, "--json", "watch", "--iterations", "2", "--interval", "0.1")
    assert code == 0
    first, second = (json.loads(line) for line in out.strip().splitlines())
    assert first["counts"] == second["counts"]
    assert first["counts"]["Processed"] == 2 and first["counts"]["Pending"] == 0
    assert [f["order_id"] for f in first["failures"]] == ["undone", "broken"]


def test_health_shows_throughput_an_open_breaker_the_load_and_a_waiting_alert(mixed, capsys, table):
    now = mixed.clock.now()
    TableBreakerStore(table).put(
        BreakerState(
            name="payment",
            updated_at=now,
            status=BreakerStatus.OPEN,
            window=(Tally(now, 12, 7),),
            opened_until=now + timedelta(seconds=10),
        ),
        None,
    )
    TableLoadStore(live_table_of(table)).publish("host-1", {"shipping": 2}, now)
    bootstrap.transport().send(
        bootstrap.routes().alerts,
        OperatorAlert(alert_id="al-1", order_id="broken", reason="card declined", at=now),
        message_id="al-1",
        correlation_id="broken",
    )

    shown = sas_json(capsys, "health", "--minutes", "60")
    assert (shown["finished"], shown["failed"], shown["failure_rate"]) == (4, 2, 0.5)
    assert sum(bucket["submitted"] for bucket in shown["buckets"]) == 5
    assert len(shown["buckets"]) == 61 and shown["bucket_seconds"] == 60
    breakers = {e["target"]: (e["breaker"], e["in_flight"]) for e in shown["endpoints"]}
    idle = dict.fromkeys(app_settings.HTTP_AGENTS, ("closed", 0))  # what else the app declares
    assert breakers == idle | {
        "inventory": ("closed", 0),
        "payment": ("open", 0),
        "shipping": ("closed", 2),
    }
    assert [(a["alert_id"], a["order_state"]) for a in shown["alerts"]] == [("al-1", "Error")]
    assert shown["alerts_waiting"] == 1 and shown["problems"] == []
    # Open alerts come from what was sent (the order's own), not from the queue's contents.
    ((group, orders),) = [
        ((g["workflow"], g["step"]), [a["order_id"] for a in g["alerts"]])
        for g in shown["open_alerts"]
    ]
    assert orders == ["broken"] and group[1] == "charge"

    code, out, err = sas(capsys, "health", "--minutes", "90")
    assert code == 0, err
    assert "5 submitted, 4 finished, 2 failed (failure rate 50.0%)" in out
    assert re.search(r"payment\s+│\s+open\s+│\s+7/12\s+│", out), out
    assert "open alerts, by cause: 1; 1 message(s) in" in out and "card declined" in out
    assert "orders per 2 min" in out


# --- where the settings come from ---------------------------------------------------------


@pytest.fixture
def bare_environment(app_env, monkeypatch) -> Iterator[dict[str, str]]:
    """The app's settings taken out of the environment (returned); whatever the CLI loads
    into it is dropped afterwards."""
    taken = {
        key: value
        for key, value in os.environ.items()
        if key.startswith(("SAS_", app_settings.STORAGE_CONNECTION))
    }
    for key in taken:
        monkeypatch.delenv(key)
    saved = dict(os.environ)
    yield taken
    os.environ.clear()
    os.environ.update(saved)
    bootstrap.reset()


def test_a_settings_file_in_either_shape_points_the_cli_at_the_app(
    world, bare_environment, capsys, tmp_path
):
    finish(world, "found-1")
    local = tmp_path / "local.settings.json"
    local.write_text(json.dumps({"IsEncrypted": False, "Values": bare_environment}))
    listed_from_azure = tmp_path / "appsettings.json"
    listed_from_azure.write_text(
        json.dumps(
            [{"name": k, "value": v, "slotSetting": False} for k, v in bare_environment.items()]
        )
    )
    for path in (local, listed_from_azure):
        shown = sas_json(capsys, "--settings", str(path), "status", "found-1")
        assert shown["process_state"] == "Processed"
        os.environ.pop(app_settings.STORAGE_CONNECTION)
    shown = sas_json(capsys, "status", "found-1", "--settings", str(local))  # after it too
    assert shown["order_id"] == "found-1"


def test_without_settings_the_local_runs_file_is_read(world, bare_environment, capsys, tmp_path):
    finish(world, "found-2")
    run_dir = tmp_path / ".sas-run"
    run_dir.mkdir()
    (run_dir / "local.settings.json").write_text(json.dumps({"Values": bare_environment}))
    code = run(["--json", "status", "found-2"], cwd=tmp_path)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["process_state"] == "Processed"


def test_unreachable_storage_is_one_line_and_exit_code_1(bare_environment, capsys, tmp_path):
    path = tmp_path / "settings.json"
    dead = re.sub(
        r"TableEndpoint=[^;]*",
        "TableEndpoint=http://127.0.0.1:9/devstoreaccount1",
        bare_environment[app_settings.STORAGE_CONNECTION],
    )
    path.write_text(json.dumps({"Values": {**bare_environment, "SasStorage": dead}}))
    code, out, err = sas(capsys, "--settings", str(path), "status", "any-order")
    assert code == 1 and out == ""
    assert err.startswith("sas: error: ServiceRequestError from settings file")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err

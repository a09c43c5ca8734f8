"""What the `sas` CLI refuses, in memory: bad arguments, ids and filters are one line on stderr
with exit code 2 (an unknown order: 1), and nothing is sent, resubmitted or purged. The CLI's
operator is an in-memory app's (``World()``); anything else the CLI could reach (settings, the
real store and queues, parked messages, health) raises AssertionError, which the CLI does not
catch, so a refusal that stopped happening fails the test. The CLI on the app's real table and
queues (Azurite): tests/integration/test_cli.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import pytest
from azure.core.exceptions import ServiceRequestError
from rich.console import Console

from sas import bootstrap
from sas.domain.model import ProcessState
from sas.testing import refuse
from sas_cli import commands
from sas_cli.commands import run
from tests.harness import World
from tests.unit.test_services import submitted
from tests.workflows import STRICT

pytestmark = [pytest.mark.unit, pytest.mark.fast]

DETAILS = json.dumps(submitted().details)
WIRED = (
    "settings", "store", "transport", "poison", "context", "agent_context", "gauges",
    "operator", "parked_messages", "health", "routes", "clock", "workflows", "router",
)  # fmt: skip
"""What bootstrap wires to the real store, queues and settings."""


def _unreachable(name: str) -> Callable[..., NoReturn]:
    def reached(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError(f"bootstrap.{name}() reached: the app was asked to act")

    return reached


def on_memory(monkeypatch: pytest.MonkeyPatch, world: World | None) -> None:
    """The CLI's and the HTTP API's wiring replaced: ``world``'s operator, workflows and clock
    (None: nothing), and AssertionError from anything else they would reach."""
    for name in WIRED:
        monkeypatch.setattr(bootstrap, name, _unreachable(name))
    if world is not None:
        monkeypatch.setattr(bootstrap, "operator", lambda: world.operator)
        monkeypatch.setattr(bootstrap, "workflows", lambda: world.app.ctx.workflows)
        monkeypatch.setattr(bootstrap, "clock", lambda: world.clock)


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No local run's settings to find (the working directory is empty); whatever the CLI
    loads into the environment is dropped afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(commands, "console", Console(width=250))
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    bootstrap.reset()


def finish(world: World, order_id: str, **changes: Any) -> str:
    world.submit(submitted(order_id).model_copy(update=changes))
    world.run()
    return order_id


@pytest.fixture
def mixed(monkeypatch: pytest.MonkeyPatch, environment: None) -> World:
    """Ten minutes apart: Processed, Error (card declined), and one still Processing (low)."""
    world = World()
    finish(world, "done-a")
    world.clock.advance(600)
    world.remote.script("payment", "charge", refuse("HTTP 402 card declined"))
    finish(world, "broken", workflow=STRICT.name)
    world.clock.advance(600)
    world.submit(submitted("running", priority="low"))  # claimed, never delivered
    assert world.state("broken").process_state is ProcessState.ERROR
    on_memory(monkeypatch, world)
    return world


def sas(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def sas_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = sas(capsys, "--json", *argv)
    assert code == 0, err
    return json.loads(out)


def listed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [state["order_id"] for state in sas_json(capsys, "list")]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["submit", "order", "{not json"], "not valid JSON"),
        (["submit", "order", "[1, 2]"], "must be a JSON object"),
        (["submit", "order", "@/nonexistent/details.json"], "cannot read"),
        (["submit", "order", '{"customer_id": "c1"}'], "invalid details: currency"),
        (["submit", "nosuchflow", DETAILS], "unknown workflow 'nosuchflow'"),
        (["submit", "order", DETAILS, "--reply-to", "sas-orders"], "reply_to"),
        (["submit", "order", DETAILS, "--priority", "urgent"], "invalid choice: 'urgent'"),
        (["submit", "order", DETAILS, "--order-id", "a/b"], "not an order id"),
        (["submit", "order", "[" * 3000 + "]" * 3000], "nested too deeply"),
        (["submit", "order", DETAILS, "--actor", " "], "an actor is a name of 1 to 100"),
        (["submit", "order", '{"a": ' * 3000 + "1" + "}" * 3000], "nested too deeply"),
    ],
)
def test_a_bad_submission_is_refused_and_sends_nothing(mixed, capsys, argv, said):
    sent = len(mixed.bus.sent)
    code, out, err = sas(capsys, *argv)
    assert code == 2 and out == ""
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert len(mixed.bus.sent) == sent


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["list", "--state", "Finished"], "unknown state 'Finished'"),
        (["list", "--older-than", "7x"], "'7x' is not a duration"),
        (["list", "--newer-than=-5m"], "not a duration"),
        (["list", "--limit", "0"], "not a limit"),
        (["list", "--limit", "1001"], "not a limit"),
        (["list", "--workflow", "ordr"], "no workflow 'ordr' is deployed: one of"),
        (["resubmit", "--all", "--workflow", "ordr"], "no workflow 'ordr' is deployed"),
        (["status"], "required: order_id"),
        (["status", "no#such"], "not an order id"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(mixed, capsys, argv, said):
    code, out, err = sas(capsys, *argv)
    assert code == 2 and out == ""
    assert said in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("command", ["status", "history", "resubmit"])
def test_an_unknown_order_is_not_found_exit_code_1(mixed, capsys, command):
    code, out, err = sas(capsys, command, "nosuchorder")
    assert code == 1 and out == ""
    assert err.strip() == "sas: error: order nosuchorder not found"


@pytest.mark.parametrize(
    "argv",
    [
        (),
        ("broken", "--all"),
        ("broken", "--yes"),
        ("broken", "--priority", "high"),
        ("broken", "--limit", "5"),
    ],
)
def test_resubmit_takes_an_id_or_all_never_both(mixed, capsys, argv):
    code, out, err = sas(capsys, "resubmit", *argv)
    assert code == 2 and out == "" and err.startswith("sas: error: ")
    assert sas_json(capsys, "status", "broken")["process_state"] == "Error"


@pytest.mark.parametrize("hostile", ["#x", "/resubmit", "?state=Error", "%23", "/../x"])
def test_an_order_id_with_more_after_it_never_reaches_that_order(mixed, capsys, hostile):
    for command in ("status", "history", "resubmit"):
        code, out, err = sas(capsys, command, "broken" + hostile)
        assert code == 2 and out == "" and "not an order id" in err
    assert mixed.state("broken").process_state is ProcessState.ERROR


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["purge"], "give order ids, or --older-than"),
        (["purge", "--older-than", "1d", "--state", "Error"], "not Error"),
        (["purge", "a/b"], "not an order id"),
        (["purge", "--older-than", "thirty days"], "not a duration"),
        (["purge", "--older-than", "30d", "--limit", "x"], "not a limit"),
    ],
)
def test_purge_refuses_bad_input_and_deletes_nothing(mixed, capsys, argv, said):
    mixed.clock.advance(timedelta(days=31).total_seconds())  # done-a would go if purged
    before = listed(capsys)
    assert "done-a" in before
    code, out, err = sas(capsys, *argv, "--yes")
    assert code == 2 and out == "" and said in err
    assert listed(capsys) == before


@pytest.mark.parametrize(
    "argv",
    [
        ("replay",),
        ("replay", "some-id", "--all"),
        ("discard", "some-id", "--yes"),
        ("discard", "some-id", "--queue", "sas-orders"),
        ("replay", "--all", "--by", "nobody"),
    ],
)
def test_parked_takes_an_id_or_all_never_both(mixed, capsys, argv):
    code, out, err = sas(capsys, "parked", *argv)
    assert (code, out) == (2, "") and err.startswith("sas: error:")


@pytest.mark.parametrize("argv", [("--minutes", "0"), ("--minutes", "10081"), ("--alerts", "x")])
def test_health_refuses_a_window_or_count_out_of_range(mixed, capsys, argv):
    code, out, err = sas(capsys, "health", *argv)
    assert (code, out) == (2, "")
    assert "is not a" in err


def test_help_lists_every_command(monkeypatch, environment, capsys):
    on_memory(monkeypatch, None)
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    # The description whole, not cut at the docstring's first line break.
    assert "through the app's own services, with the app's settings" in " ".join(out.split())
    for command in (
        "submit",
        "status",
        "history",
        "list",
        "resubmit",
        "parked",
        "purge",
        "watch",
    ):
        assert command in out
    for gone in ("rejected", "poison"):  # one noun for parked messages now
        code, out, err = sas(capsys, gone, "list")
        assert code == 2 and out == "" and "invalid choice" in err


def test_list_and_resubmit_all_filter_by_workflow(mixed, capsys):
    assert set(listed(capsys)) == {"done-a", "broken", "running"}
    of_order = sas_json(capsys, "list", "--workflow", "order")
    assert {state["order_id"] for state in of_order} == {"done-a", "running"}
    assert [s["order_id"] for s in sas_json(capsys, "list", "--workflow", STRICT.name)] == [
        "broken"
    ]
    code, out, _ = sas(capsys, "resubmit", "--all", "--workflow", "order")
    assert code == 0 and "broken" not in out and "of workflow order" in out
    assert mixed.state("broken").process_state is ProcessState.ERROR  # a dry run, elsewhere


@pytest.mark.parametrize(
    ("argv", "explained"),
    [
        (["list"], ["--json", "print JSON", "--settings", "Pending, Processing", "1 to 1000"]),
        (["list"], ["like 90s, 15m, 2h, 7d", "--workflow"]),
        (["health"], ["1 to 10080", "waiting alerts, 1 to 100"]),
        (["purge"], ["finished more than AGE ago", "per run"]),
        (["parked", "list"], ["parked more than AGE ago", "1 to 1000"]),
    ],
)
def test_every_option_says_what_it_takes(monkeypatch, environment, capsys, argv, explained):
    on_memory(monkeypatch, None)
    assert run([*argv, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in explained:
        assert text in out, text


@pytest.mark.parametrize(("code", "said"), [(0, ""), (1, "sas: error: 2 order(s) changed")])
def test_a_reader_that_stops_early_changes_neither_the_exit_code_nor_stderr(code, said):
    """`sas list --json | head -c 1`, `sas purge --yes | head -c 1`: the rest of the output goes
    nowhere, with no traceback; the command's own exit code and error line still come (a
    megabyte printed, past any pipe's buffer, by a stand-in for the command)."""
    program = (
        "import sys\n"
        "from sas_cli import commands\n"
        "def run():\n"
        "    print('x' * 1_000_000)\n"
        f"    if {code}: print({said!r}, file=sys.stderr)\n"
        f"    return {code}\n"
        "commands.run = run\n"
        "commands.main()\n"
    )
    shell = f"{shlex.quote(sys.executable)} -c {shlex.quote(program)} | head -c 1"
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout, done.stderr.strip()) == (code, "x", said)


def test_submit_close_and_purge_are_in_the_audit_log_which_outlives_the_purge(mixed, capsys):
    code, _, err = sas(
        capsys, "submit", "order", DETAILS, "--order-id", "fresh", "--actor", "carol"
    )
    assert code == 0, err
    code, _, err = sas(capsys, "close", "broken", "--reason", "refunded", "--actor", "alice")
    assert code == 0, err
    mixed.clock.advance(60)
    code, out, _ = sas(capsys, "purge", "broken", "running", "nosuch", "--yes", "--actor", "bob")
    assert code == 1 and "purged 1 of 1" in out and "running, nosuch" in out
    assert mixed.store.get_state("broken") is None and mixed.store.get_state("running")
    log = sas_json(capsys, "audit")
    assert [(e["action"], e["target"], e["actor"]) for e in log] == [
        ("purge", "broken", "bob"),
        ("close", "broken", "alice"),
        ("submit", "fresh", "carol"),
    ]
    assert log[1]["reason"] == "refunded"
    assert [e["action"] for e in sas_json(capsys, "audit", "--actor", "alice")] == ["close"]
    code, out, err = sas(capsys, "audit", "--action", "rewind")
    assert code == 2 and "invalid choice" in err


def test_a_purge_cut_short_by_the_store_audits_what_it_did_purge(monkeypatch, environment, capsys):
    """The second of three deletes fails (the table times out): the first order is gone for
    good, and the audit says so."""
    world = World()
    for order_id in ("done-a", "done-b", "done-c"):
        finish(world, order_id)
        world.clock.advance(10)
    on_memory(monkeypatch, world)
    purge, calls = world.store.purge_order, []

    def flaky(versioned: Any) -> bool:
        calls.append(versioned.value.order_id)
        if len(calls) == 2:
            raise ServiceRequestError("connection reset")
        return purge(versioned)

    monkeypatch.setattr(world.store, "purge_order", flaky)
    code, _, err = sas(capsys, "purge", "done-a", "done-b", "done-c", "--yes", "--actor", "bob")
    assert code == 1 and "ServiceRequestError" in err
    assert world.store.get_state("done-a") is None and world.store.get_state("done-c")
    assert [(e.action, e.target, e.actor) for e in world.operator.audit(10)] == [
        ("purge", "done-a", "bob")
    ]

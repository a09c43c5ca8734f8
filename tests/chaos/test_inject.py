"""The in-process fault injection of the chaos campaign, on a recording transport."""

from __future__ import annotations

import json
import os
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sas_local.chaos.__main__ import parser
from sas_local.chaos.campaign import Campaign, Options, _ended
from sas_local.chaos.checker import Evidence
from sas_local.chaos.compare import differences
from sas_local.chaos.compare import main as compare_main
from sas_local.chaos.inject import (
    CALM_FILE,
    CRASH_DIR,
    MIN_WORKER_AGE,
    ChaosConfig,
    ChaosTransport,
    Events,
    count_events,
)
from sas_local.host_clock import SkewedClock

pytestmark = [pytest.mark.unit, pytest.mark.chaos]

QUEUES = {"alerts": "sas-alerts", "replies": "sas-replies", "scheduler": "sas-scheduler"}


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, float]] = []

    def send(self, queue: str, message: Any, *, message_id: str, correlation_id: str,
             delay_seconds: float = 0) -> None:  # fmt: skip
        self.sent.append((queue, delay_seconds))


class Uptime:
    """The worker's monotonic clock: it has run ``MIN_WORKER_AGE`` unless told otherwise."""

    def __init__(self) -> None:
        self.now = MIN_WORKER_AGE

    def __call__(self) -> float:
        return self.now


def chaos(
    tmp_path: Path, uptime: Uptime | None = None, **config: Any
) -> tuple[ChaosTransport, Recorder]:
    (tmp_path / CRASH_DIR).mkdir(exist_ok=True)
    inner = Recorder()
    settings = ChaosConfig(dir=str(tmp_path), queues=QUEUES, **config)
    transport = ChaosTransport(
        inner, settings, Events(tmp_path), random.Random(1), started=0.0, clock=uptime or Uptime()
    )
    return transport, inner


def send(transport: ChaosTransport, queue: str) -> None:
    transport.send(queue, object(), message_id="m", correlation_id="o")


def test_duplicates_go_out_twice_and_are_counted_by_target(tmp_path: Path) -> None:
    transport, inner = chaos(tmp_path, duplicate_rate=1.0)
    send(transport, "sas-agent-payment")
    assert [queue for queue, _ in inner.sent] == ["sas-agent-payment"] * 2
    assert count_events(tmp_path) == {"duplicate_message": 1}
    assert "duplicate_message agent" in "".join(p.read_text() for p in tmp_path.glob("events-*"))


def test_delayed_messages_go_out_late_and_alerts_are_never_touched(tmp_path: Path) -> None:
    transport, inner = chaos(tmp_path, delay_rate=1.0, delay_max=6.0)
    send(transport, "sas-replies")
    send(transport, "sas-alerts")
    assert inner.sent[0][1] >= 1 and inner.sent[1] == ("sas-alerts", 0)
    assert count_events(tmp_path) == {"delayed_message": 1}


def test_once_calm_nothing_is_injected(tmp_path: Path) -> None:
    transport, inner = chaos(tmp_path, duplicate_rate=1.0)
    (tmp_path / CALM_FILE).touch()
    (tmp_path / CRASH_DIR / "0001-any").touch()
    send(transport, "sas-scheduler")
    assert inner.sent == [("sas-scheduler", 0)]
    assert count_events(tmp_path) == {}


def test_an_armed_crash_token_kills_the_sender_before_its_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    transport, inner = chaos(tmp_path)
    (tmp_path / CRASH_DIR / "0001-alerts").touch()
    send(transport, "sas-replies")  # not the armed target: goes out
    with pytest.raises(SystemExit):
        send(transport, "sas-alerts")
    assert inner.sent == [("sas-replies", 0)]
    assert count_events(tmp_path) == {"crash_before_send": 1}
    assert [p.name.split(".")[0] for p in (tmp_path / CRASH_DIR).iterdir()] == ["0001-alerts"]


def test_a_worker_takes_a_crash_token_only_once_it_has_run_long_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    uptime = Uptime()
    uptime.now = MIN_WORKER_AGE - 0.1
    transport, inner = chaos(tmp_path, uptime)
    (tmp_path / CRASH_DIR / "0001-any").touch()
    send(transport, "sas-scheduler")  # just restarted: a token would make a crash loop
    uptime.now = MIN_WORKER_AGE
    with pytest.raises(SystemExit):
        send(transport, "sas-scheduler")
    assert inner.sent == [("sas-scheduler", 0)]
    assert count_events(tmp_path) == {"crash_before_send": 1}


def test_a_skewed_clock_is_offset() -> None:
    skewed = SkewedClock(-0.9).now()
    assert -1.5 < (skewed - datetime.now(UTC)).total_seconds() < -0.5


def test_the_command_line_takes_the_campaign_options() -> None:
    args = parser().parse_args(["--orders", "5000", "--seed", "42", "--broken", "fence"])
    assert (args.orders, args.seed, args.workers, args.supervisors) == (5000, 42, 2, 2)
    assert args.broken == ["fence"]


def test_two_reports_are_compared_order_by_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = {"a": "Processed", "b": "Error", "c": "Processed", "e": "Cancelled"}
    second = {"a": "Processed", "b": "Processed", "d": "Error", "e": "Error"}
    assert differences(first, second) == {
        ("Error", "Processed"): 1,
        ("Processed", "missing"): 1,
        ("missing", "Error"): 1,
        ("Cancelled", "Error"): 1,
    }
    paths = []
    for name, ended in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(json.dumps({"ended_by_order": ended}))
        paths.append(str(tmp_path / name))
    assert compare_main(paths) == 0
    out = capsys.readouterr().out
    assert "4 of 5 orders ended differently" in out
    assert "3 of them Cancelled in neither run" in out


def test_a_crash_token_is_not_armed_while_one_for_that_kind_waits(tmp_path: Path) -> None:
    campaign = Campaign(Options(orders=1, seed=3, log_dir=tmp_path))
    (tmp_path / "chaos" / CRASH_DIR).mkdir(parents=True)
    for _ in range(50):  # no worker takes any: at most one waits per kind of send
        campaign.arm_crash()
    armed = [p.name for p in (tmp_path / "chaos" / CRASH_DIR).iterdir()]
    kinds = [name.split("-", 1)[1] for name in armed]
    assert sorted(kinds) == sorted(set(kinds)) and len(kinds) == campaign.crash_tokens
    for name in armed:  # once taken, the next of its kind may be armed
        (tmp_path / "chaos" / CRASH_DIR / name).rename(
            tmp_path / "chaos" / CRASH_DIR / f"{name}.taken-1"
        )
    for _ in range(50):
        campaign.arm_crash()
    assert campaign.crash_tokens == 2 * len(armed)


def test_the_surge_report_counts_every_expiry_that_gave_up_on_a_step() -> None:
    def row(order: str, key: str, **fields: str) -> dict[str, str]:
        return {"PartitionKey": order, "RowKey": key, **fields}

    ids = ["s1", "s2", "s3", "r1"]
    entities = [row(i, "state", ProcessState="Processed") for i in ids]
    entities += [
        row("s1", "h1", Kind="expired_skipped"),  # a skippable step given up on
        row("s2", "h1", Kind="expired_compensate"),
        row("s3", "h1", Kind="expired_retry"),  # retried: not given up
        row("r1", "h1", Kind="expired_error"),
    ]
    evidence = Evidence(entities=entities, alerts=[], poison={}, ledger={}, submitted=ids)
    ended = _ended(evidence, frozenset({"s1", "s2", "s3"}), ids)
    assert ended["surge"] == {
        "orders": 3,
        "ended": {"Processed": 3},
        "gave_up_after_expiries": 2,
    }
    assert ended["rest"]["gave_up_after_expiries"] == 1

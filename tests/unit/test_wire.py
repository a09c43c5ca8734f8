"""The wire rules: one home, anchored patterns, ids that fence and de-duplicate as promised."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import StringConstraints, TypeAdapter, ValidationError

from sas import settings
from sas.domain import wire
from sas.domain.errors import ConfigurationError, InvalidMessage
from sas.domain.messages import OrderSubmitted, decode
from sas.domain.workflow import StepDefinition
from sas.settings import AGENTS

pytestmark = [pytest.mark.unit, pytest.mark.fast]

ROOT = Path(__file__).resolve().parents[2]
RULES = [
    wire.ORDER_ID,
    wire.STEP_NAME,
    wire.QUEUE_NAME,
    wire.APP_QUEUE_NAME,
    wire.TABLE_NAME_RULE,
]
SAMPLES = ["abc", "abc\n", "a\nb", "\nabc", "ABC", "a-b", "a--b", "a_b", "a b", "x" * 70, "EUR"]
AT = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.label)
def test_no_rule_accepts_a_trailing_newline(rule: wire.NameRule) -> None:
    # Python's `$` matches before a final newline: such ids passed validation and were then
    # refused by Table Storage as keys.
    for valid in ("abc", "abcd", "EUR", "orders"):
        if rule.matches(valid):
            assert not rule.matches(valid + "\n")
            assert re.search(rule.python, valid + "\n") is None


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.label)
def test_each_engines_pattern_agrees_with_the_rule(rule: wire.NameRule) -> None:
    python = re.compile(rule.python)
    rust = None
    if "(?!" not in rule.body:  # Rust regex has no look-around; those rules stay in Python
        rust = TypeAdapter(Annotated[str, StringConstraints(pattern=rule.end_of_text)])
    for sample in SAMPLES:
        expected = rule.matches(sample)
        assert (python.search(sample) is not None) is expected, sample
        if rust is not None:
            try:
                rust.validate_python(sample)
                accepted = True
            except ValidationError:
                accepted = False
            assert accepted is expected, sample


def test_validation_refuses_ids_with_a_newline_everywhere_they_enter() -> None:
    body = (
        '{"type":"OrderSubmitted","order_id":"o1\\n","details":{"customer_id":"c",'
        '"currency":"EUR","lines":[{"sku":"s","quantity":1,"unit_price_cents":1}],'
        '"address":"x"}}'
    )
    with pytest.raises(InvalidMessage, match="order_id"):
        decode(OrderSubmitted, body)
    with pytest.raises(ValueError, match="step name"):
        StepDefinition("ship\n", "shipping", "ship", timedelta(seconds=1))
    env = {
        settings.STORAGE_CONNECTION: "UseDevelopmentStorage=true",
        settings.TRANSPORT: "storage",
        settings.QUEUE_ORDERS: "orders\n",
        **{settings.remote_url_setting(agent): "http://x" for agent in AGENTS},
    }
    with pytest.raises(ConfigurationError, match=settings.QUEUE_ORDERS):
        settings.load(env)


def test_app_queues_leave_room_for_the_poison_suffix() -> None:
    longest_app_queue = "q" * 56
    assert wire.APP_QUEUE_NAME.matches(longest_app_queue)
    assert not wire.APP_QUEUE_NAME.matches(longest_app_queue + "q")
    assert wire.QUEUE_NAME.matches(longest_app_queue + wire.POISON_SUFFIX)
    assert wire.QUEUE_NAME.matches("q" * 63)
    assert not wire.QUEUE_NAME.matches("q" * 64)


def test_the_idempotency_key_is_stable_across_attempts_and_differs_for_the_undo() -> None:
    incarnation = wire.new_incarnation()
    do, undo = (
        wire.idempotency_key("o1", incarnation, "charge", "do"),
        wire.idempotency_key("o1", incarnation, "charge", "undo"),
    )
    assert do == f"o1:{incarnation}:charge"
    assert undo != do
    assert wire.IDEMPOTENCY_KEY.matches(do) and wire.IDEMPOTENCY_KEY.matches(undo)
    keys = (do, undo)
    requests = {wire.step_request_message_id(key, attempt) for key in keys for attempt in (1, 2, 3)}
    assert len(requests) == 6  # every attempt and direction is a message of its own
    replies = {wire.step_reply_message_id(key, attempt) for key in keys for attempt in (1, 2, 3)}
    assert len(replies) == 6 and not replies & requests


def test_a_reused_order_id_gets_new_keys_and_an_order_from_before_keeps_its_own() -> None:
    first, second = wire.new_incarnation(), wire.new_incarnation()
    assert first != second and wire.INCARNATION.matches(first)
    assert wire.idempotency_key("o1", first, "ship", "do") != wire.idempotency_key(
        "o1", second, "ship", "do"
    )
    # Orders submitted before incarnations keep the keys their remotes already hold.
    assert wire.idempotency_key("o1", "", "ship", "do") == "o1:ship"
    assert wire.idempotency_key("o1", "", "ship", "undo") == "o1:ship:undo"


def test_message_ids_of_the_longest_keys_fit_service_bus() -> None:
    key = wire.idempotency_key("o" * 64, "f" * 12, "s" * 31, "undo")
    assert wire.IDEMPOTENCY_KEY.matches(key)
    for message_id in (
        wire.step_request_message_id(key, wire.MAX_ATTEMPT),
        wire.step_reply_message_id(key, wire.MAX_ATTEMPT),
        wire.held_message_id(wire.step_reply_message_id(key, 1), 100_000),
    ):
        assert len(message_id) <= wire.MAX_MESSAGE_ID


def test_schedule_status_and_alert_ids_follow_the_state_version() -> None:
    later = AT + timedelta(microseconds=1)
    assert wire.schedule_message_id("o1", AT) == wire.schedule_message_id("o1", AT)
    assert wire.schedule_message_id("o1", AT) != wire.schedule_message_id("o1", later)
    assert wire.alert_message_id("o1", 3, AT) == wire.alert_message_id("o1", 3, AT)
    assert wire.alert_message_id("o1", 3, AT) != wire.alert_message_id("o1", 4, AT)
    assert wire.status_message_id("o1", "completed", None, AT) != wire.status_message_id(
        "o1", "completed", None, later
    )


def test_prefix_ranges_hold_exactly_their_rows() -> None:
    for prefix in (wire.STEP_ROW_PREFIX, wire.HISTORY_ROW_PREFIX):
        lo, hi = wire.prefix_range(prefix)
        inside = [wire.step_row_key(0, "reserve"), wire.step_row_key(99, "zzzz")]
        if prefix == wire.HISTORY_ROW_PREFIX:
            inside = [wire.history_row_key(AT, 1, "ffffffff")]
        for key in inside:
            assert lo <= key < hi
        for key in (wire.ORDER_ROW, wire.STATE_ROW, "step", "hist", "stepz", "histz"):
            assert not lo <= key < hi


def test_history_keys_sort_by_time() -> None:
    keys = [wire.history_row_key(AT + timedelta(seconds=s), 1, "00") for s in (3, 1, 2)]
    assert sorted(keys) == [keys[1], keys[2], keys[0]]


FORMATS_OUTSIDE_WIRE = re.compile(
    r"""message_id=f"|:undo"|:schedule:|:alert:|:status:|"~live"|"~rejected"|"~breaker"|"""
    r""""step:|"hist:|Literal\["do", "undo"\]|\[A-Za-z0-9\]\[A-Za-z0-9_-\]|\[a-z0-9\]\[a-z0-9-\]|"""
    r'"p1\.'
)


def test_no_wire_rule_is_written_outside_its_home() -> None:
    offenders = []
    scanned = (
        *ROOT.glob("sas/**/*.py"),
        *ROOT.glob("sas_local/**/*.py"),
        *ROOT.glob("sas_cli/**/*.py"),
        ROOT / "function_app.py",
    )
    for path in sorted(scanned):
        if path == ROOT / "sas" / "domain" / "wire.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FORMATS_OUTSIDE_WIRE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_a_status_id_too_long_for_service_bus_keeps_its_start_and_stays_unique():
    at = datetime(2026, 11, 28, tzinfo=UTC)
    one, other = ("A" * 64, "s" * 31), ("A" * 64, "s" * 30 + "t")
    first = wire.status_message_id(one[0], "step_completed", one[1], at)
    assert len(first) == wire.MAX_MESSAGE_ID and first.startswith(f"{'A' * 64}:status:")
    assert first == wire.status_message_id(one[0], "step_completed", one[1], at)  # every sender
    assert first != wire.status_message_id(other[0], "step_completed", other[1], at)
    assert wire.status_message_id("o1", "completed", None, at).startswith("o1:status:completed:-:")

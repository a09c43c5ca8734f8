"""Order ids over the whole character space (control characters, newlines, every unicode
category; lone surrogates only where they can be encoded at all), in memory:

- the two validations agree: ``ORDER_ID.matches`` and the message models;
- an id they accept keeps Table Storage's documented key rules, and yields Service Bus message
  and correlation ids the SDK accepts (at most 128 characters) for every message sas sends
  about the order, step names as long as the rules allow included.

On Azurite (tests/integration/test_ids_property.py): an accepted id is a real PartitionKey and
RowKey and travels through a real Storage queue intact; a refused one sent to the real
``submit`` function body is parked with a reason naming ``order_id``, nothing else written.
"""

from __future__ import annotations

import json
import string
import unicodedata
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import pytest
from azure.servicebus import ServiceBusMessage
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sas.adapters.servicebus import ServiceBusTransport
from sas.domain.errors import InvalidMessage
from sas.domain.messages import (
    Message,
    OperatorAlert,
    OrderSubmitted,
    ScheduleRequest,
    StatusEvent,
    StatusKind,
    StepReply,
    StepRequest,
    decode,
)
from sas.domain.wire import (
    ORDER_ID,
    Mode,
    alert_message_id,
    idempotency_key,
    schedule_message_id,
    schedule_wakeup_message_id,
    status_message_id,
    step_reply_message_id,
    step_request_message_id,
    submission_message_id,
)
from sas.domain.workflow import Registry, StepDefinition, Workflow
from sas.testing import FakeClock
from tests.workflows import BUDGET, registry

pytestmark = pytest.mark.unit

ALNUM = string.ascii_letters + string.digits
INCARNATION = "0123456789ab"
EVERY_CHAR = st.characters(exclude_categories=())
"""All of unicode, lone surrogates included."""
REFUSED = ["abc\n", "a\r", "a#b", "a/b", "a?b", "a\\b", "ä", "a" * 65, "", "-a", "a\ud800"]
ACCEPTED = ["a", "0", "A-_9", "a" * 64, "o1", "Z" + "-" * 63]
ENDINGS = ["\n", "\r", "\r\n", "\x00", "\t", " ", "\x85", "\u2028", "\ufeff"]


def _insert(value: str, char: str, at: int) -> str:
    at %= len(value) + 1
    return value[:at] + char + value[at:]


def candidate_ids(chars: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Anything, mostly near the boundary: valid-looking ids of about the longest length, one
    foreign character anywhere, or an ending that a ``$`` would let through."""
    shaped = st.builds(
        str.__add__,
        st.sampled_from(ALNUM),
        st.integers(0, 120).flatmap(lambda n: st.text(ALNUM + "_-", min_size=n, max_size=n)),
    )
    return st.one_of(
        st.text(chars, max_size=70),
        shaped,
        st.builds(_insert, shaped, chars, st.integers(0, 70)),
        st.builds(str.__add__, shaped, st.sampled_from(ENDINGS)),
    )


def order(order_id: str) -> dict[str, Any]:
    return {
        "type": "OrderSubmitted",
        "order_id": order_id,
        "details": {
            "customer_id": "c1",
            "currency": "EUR",
            "address": "1 Main St",
            "lines": [{"sku": "s1", "quantity": 1, "unit_price_cents": 100}],
        },
    }


def accepted(order_id: str) -> bool:
    """Whether sas accepts ``order_id``, asserting that every validation of it agrees."""
    verdicts = {"ORDER_ID.matches": ORDER_ID.matches(order_id)}
    for model, fields in ((OrderSubmitted, order(order_id)), (ScheduleRequest, None)):
        body = fields or {"type": "ScheduleRequest", "order_id": order_id}
        try:
            model.model_validate(body)
            verdicts[f"{model.__name__} (python)"] = True
        except ValidationError:
            verdicts[f"{model.__name__} (python)"] = False
        try:  # the wire: JSON with every non-ASCII character escaped
            decode(model, json.dumps(body).encode())
            verdicts[f"{model.__name__} (json)"] = True
        except InvalidMessage:
            verdicts[f"{model.__name__} (json)"] = False
    assert len(set(verdicts.values())) == 1, (order_id, verdicts)
    return verdicts["ORDER_ID.matches"]


def table_key_safe(key: str) -> bool:
    """Table Storage's documented PartitionKey rules."""
    forbidden = set("/\\#?") | {chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))}
    return not forbidden & set(key) and len(key.encode("utf-16-le")) <= 2048


# --- Service Bus at the SDK boundary ----------------------------------------------------------


class Sender:
    def __init__(self) -> None:
        self.sent: list[ServiceBusMessage] = []

    def send_messages(self, message: ServiceBusMessage, *, timeout: float | None = None) -> None:
        self.sent.append(message)

    def close(self) -> None:
        pass


class Client:
    def __init__(self) -> None:
        self.sender = Sender()

    def get_queue_sender(self, queue_name: str) -> Sender:
        return self.sender

    def get_queue_receiver(self, queue_name: str) -> Any:
        raise AssertionError("this test never peeks")

    def close(self) -> None:
        pass


def named(length: int) -> Workflow:
    """A one-step workflow whose every name has ``length`` characters."""
    name = "x" * (length - 1)
    step = StepDefinition(f"s{name}", f"a{name}", f"d{name}", BUDGET, undo=f"u{name}")
    return Workflow(f"w{name}", (step,))


LONG_NAMES = named(20)
"""Longer names than any example's (``configure``, 9): the ids grow with the step's name."""
LONGEST_NAMES = named(31)
"""As long as ``STEP_NAME`` allows."""
WORKFLOWS = registry(LONG_NAMES)


def messages_about(
    order_id: str, now: datetime, workflows: Registry = WORKFLOWS
) -> Iterator[tuple[Message, str]]:
    """Every message sas sends about an order, with the message id sas derives for it: by
    default for the tests' workflows and one of long names."""
    yield OrderSubmitted.model_validate(order(order_id)), submission_message_id(order_id)
    schedule = ScheduleRequest(order_id=order_id)
    yield schedule, schedule_message_id(order_id, now)
    yield schedule, schedule_wakeup_message_id(order_id, now, now + timedelta(days=400))
    attempt = 10**6  # far more attempts than any order will ever take
    for workflow in workflows.workflows:
        for index, step in enumerate(workflow.steps):
            modes: tuple[tuple[Mode, str | None], ...] = (("do", step.action), ("undo", step.undo))
            for mode, action in modes:
                if action is None:
                    continue
                yield (
                    StepRequest(
                        order_id=order_id,
                        step=step.name,
                        step_index=index,
                        attempt=attempt,
                        mode=mode,
                        action=action,
                        complete_by=now,
                        idempotency_key=idempotency_key(order_id, INCARNATION, step.name, mode),
                        payload={"order_id": order_id},
                        incarnation=INCARNATION,
                    ),
                    step_request_message_id(
                        idempotency_key(order_id, INCARNATION, step.name, mode), attempt
                    ),
                )
                yield (
                    StepReply(
                        order_id=order_id,
                        step=step.name,
                        step_index=index,
                        attempt=attempt,
                        mode=mode,
                        outcome="ok",
                        incarnation=INCARNATION,
                    ),
                    step_reply_message_id(
                        idempotency_key(order_id, INCARNATION, step.name, mode), attempt
                    ),
                )
            for status in get_args(StatusKind):
                event = StatusEvent(order_id=order_id, status=status, at=now, step=step.name)
                yield event, status_message_id(order_id, status, step.name, now)
    alert = OperatorAlert(
        alert_id=alert_message_id(order_id, attempt, now), order_id=order_id, reason="r", at=now
    )
    yield alert, alert.alert_id


NOW = datetime(2099, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
"""A late instant: the timestamp in message ids only grows longer with time."""


@pytest.mark.fast
@pytest.mark.parametrize("order_id", REFUSED)
def test_the_explicit_bad_ids_are_refused(order_id: str) -> None:
    assert not accepted(order_id)


@pytest.mark.fast
@pytest.mark.parametrize("order_id", ACCEPTED)
def test_the_explicit_good_ids_are_accepted(order_id: str) -> None:
    assert accepted(order_id)


@settings(max_examples=150, deadline=None, database=None)
@given(order_id=candidate_ids(EVERY_CHAR))
def test_accepted_ids_are_table_keys_and_make_valid_service_bus_messages(order_id: str) -> None:
    if not accepted(order_id):
        return
    assert table_key_safe(order_id)
    assert all(unicodedata.category(c) not in ("Cc", "Cs", "Zl", "Zp") for c in order_id)
    client = Client()
    transport = ServiceBusTransport(lambda: client, FakeClock())
    expected = []
    for message, message_id in messages_about(order_id, NOW):
        transport.send("q", message, message_id=message_id, correlation_id=order_id)
        expected.append(message_id)
    assert [m.message_id for m in client.sender.sent] == expected
    assert {m.correlation_id for m in client.sender.sent} == {order_id}
    assert max(len(message_id) for message_id in expected) <= 128  # Service Bus's limit


@pytest.mark.fast
def test_the_longest_names_the_rules_allow_make_message_ids_service_bus_accepts() -> None:
    order_id = "A" * 64  # the longest ORDER_ID allows
    assert accepted(order_id)
    longest = [
        (type(message).__name__, message_id)
        for message, message_id in messages_about(order_id, NOW, registry(LONGEST_NAMES))
        if len(message_id) > 128
    ]
    assert longest == []

"""Fuzzing every message parser: whatever arrives on a queue, ``decode`` returns a valid
message or raises InvalidMessage with a short reason; nothing else escapes (no
ValidationError, UnicodeError, RecursionError, ValueError...). What it accepts can be sent
on: it encodes and decodes back to itself.

Inputs: arbitrary bytes, arbitrary JSON, and valid messages mutated (a field dropped, an
extra field, a wrong type, a huge string, odd unicode including control characters, newlines
and surrogates as JSON escapes, deep nesting). tests/integration/test_fuzz_functions.py
sends the same bodies through the real function bodies.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sas.domain.errors import InvalidMessage
from sas.domain.messages import (
    MAX_MESSAGE_BYTES,
    Message,
    OperatorAlert,
    OrderSubmitted,
    ScheduleRequest,
    StatusEvent,
    StepReply,
    StepRequest,
    decode,
    encode,
)

pytestmark = pytest.mark.unit

AT = "2026-01-01T00:00:00+00:00"
"""In the past: a StepRequest that is valid is then dropped unread by an agent, never run."""

VALID: dict[type[Message], dict[str, Any]] = {
    OrderSubmitted: {
        "type": "OrderSubmitted",
        "v": 1,
        "order_id": "o1",
        "workflow": "order",
        "details": {
            "customer_id": "c1",
            "currency": "EUR",
            "address": "1 Main St",
            "lines": [{"sku": "s1", "quantity": 1, "unit_price_cents": 100}],
        },
        "reply_to": "status-q",
    },
    ScheduleRequest: {"type": "ScheduleRequest", "v": 1, "order_id": "o1"},
    StepRequest: {
        "type": "StepRequest",
        "v": 1,
        "order_id": "o1",
        "step": "charge",
        "step_index": 1,
        "attempt": 2,
        "mode": "do",
        "action": "charge",
        "complete_by": AT,
        "idempotency_key": "o1:charge",
        "payload": {"order_id": "o1", "lines": [{"sku": "s1"}]},
    },
    StepReply: {
        "type": "StepReply",
        "v": 1,
        "order_id": "o1",
        "step": "charge",
        "step_index": 1,
        "attempt": 2,
        "mode": "undo",
        "outcome": "error",
        "result": {"effect": 1},
        "error": "HTTP 422",
    },
    StatusEvent: {
        "type": "StatusEvent",
        "v": 1,
        "order_id": "o1",
        "status": "step_started",
        "at": AT,
        "step": "charge",
        "detail": "ok",
    },
    OperatorAlert: {
        "type": "OperatorAlert",
        "v": 1,
        "alert_id": "o1:alert:2:1767225600.000000",
        "order_id": "o1",
        "reason": "charge (undo): HTTP 422",
        "at": AT,
    },
}
MODELS = sorted(VALID, key=lambda model: model.__name__)

MARKER = "QZXMARKERQZX"
"""Put into values: a reason must never echo a value back (it is logged and shown)."""

# --- strategies -----------------------------------------------------------------------------

ANY_CHAR = st.characters(exclude_categories=())
"""Every code point, surrogates included (they reach the wire as JSON escapes)."""
ODD_TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=40),
    st.text(
        st.sampled_from("\n\r\t\x00\x1f\x7f\x85\u2028\u2029\ufeff\ud800\udfff\U0001f600"),
        max_size=8,
    ),
    st.builds(lambda s: s + "\n", st.sampled_from(["o1", "charge", "status-q", "EUR", AT])),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(),  # NaN and infinities become NaN/Infinity: not JSON
    ODD_TEXT,
    st.just(MARKER),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=25,
)


DEEP = re.compile(r'"DEEP:(\d+):(list|dict)"')


def nested(depth: int, kind: str) -> str:
    """A placeholder that ``as_body`` expands into ``depth`` nested lists or objects (too
    deep for ``json.dumps`` to write)."""
    return f"DEEP:{depth}:{kind}"


def _expand(found: re.Match[str]) -> str:
    depth, kind = int(found[1]), found[2]
    opening, closing = ("[", "]") if kind == "list" else ('{"k":', "}")
    return opening * depth + f'"{MARKER}"' + closing * depth


WEIRD_VALUES = st.one_of(
    JSON,
    st.integers(1, 60_000).map(lambda n: "x" * n),  # huge strings, beyond the size cap too
    st.builds(
        nested,
        st.sampled_from([1, 60, 126, 127, 128, 200, 250, 5_000]),
        st.sampled_from(["list", "dict"]),
    ),
)


def _objects(value: Any) -> list[dict[str, Any]]:
    """Every JSON object in ``value``, outermost first."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        found.append(value)
        children = list(value.values())
    else:
        children = list(value) if isinstance(value, list) else []
    for child in children:
        found.extend(_objects(child))
    return found


@st.composite
def mutated(draw: st.DrawFn, model: type[Message]) -> dict[str, Any]:
    """A valid message of ``model`` with up to three things wrong, at any depth."""
    message: dict[str, Any] = json.loads(json.dumps(VALID[model]))
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(_objects(message)))
        how = draw(st.sampled_from(["drop", "extra", "replace", "replace", "text"]))
        keys = sorted(target)
        if how == "extra" or not keys:
            target[draw(st.text(max_size=12))] = draw(WEIRD_VALUES)
        elif how == "drop":
            del target[draw(st.sampled_from(keys))]
        elif how == "replace":
            target[draw(st.sampled_from(keys))] = draw(WEIRD_VALUES)
        else:
            target[draw(st.sampled_from(keys))] = draw(ODD_TEXT)
    return message


def as_body(value: Any, ascii_only: bool) -> bytes:
    """JSON bytes. Lone surrogates: escaped (ASCII), or raw (not UTF-8 at all)."""
    text = DEEP.sub(_expand, json.dumps(value, ensure_ascii=ascii_only))
    return text.encode("utf-8", errors="surrogatepass")


def bodies(model: type[Message]) -> st.SearchStrategy[bytes]:
    """Everything a queue may carry where ``model`` is expected."""
    return st.one_of(
        st.binary(max_size=300),
        st.builds(as_body, JSON, st.booleans()),
        st.builds(as_body, mutated(model), st.booleans()),
        st.builds(as_body, st.sampled_from([VALID[m] for m in MODELS]), st.booleans()),
        st.builds(
            lambda valid, cut: valid[:cut],  # truncated in transit
            st.sampled_from([json.dumps(VALID[m]).encode() for m in MODELS]),
            st.integers(0, 400),
        ),
    )


# --- the property ---------------------------------------------------------------------------


def parsed_or_refused(model: type[Message], body: bytes) -> Message | None:
    """The message, or None after checking the refusal; anything else propagates."""
    try:
        message = decode(model, body)
    except InvalidMessage as exc:
        assert isinstance(exc.reason, str) and 0 < len(exc.reason) <= 1000, exc.reason
        assert MARKER not in exc.reason  # values are never echoed into logs
        return None
    assert isinstance(message, model)
    assert len(body) <= MAX_MESSAGE_BYTES
    again = decode(model, encode(message))  # it can be sent on
    if _finite(message.model_dump()):  # NaN/Infinity: test_non_finite_numbers_round_trip
        assert again == message
    return message


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


FUZZ = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_the_valid_templates_parse(model: type[Message]) -> None:
    assert parsed_or_refused(model, json.dumps(VALID[model]).encode()) is not None


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@FUZZ
@given(body=st.binary(max_size=2_000))
def test_arbitrary_bytes(model: type[Message], body: bytes) -> None:
    parsed_or_refused(model, body)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@FUZZ
@given(value=JSON, ascii_only=st.booleans())
def test_arbitrary_json(model: type[Message], value: Any, ascii_only: bool) -> None:
    parsed_or_refused(model, as_body(value, ascii_only))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@settings(FUZZ, max_examples=300)
@given(data=st.data(), ascii_only=st.booleans())
def test_mutated_valid_messages(
    model: type[Message], data: st.DataObject, ascii_only: bool
) -> None:
    parsed_or_refused(model, as_body(data.draw(mutated(model)), ascii_only))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xff",
        b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
        b"null",
        b"[" * 100_000,
        b"{" + b'"a":{' * 3_000 + b"}" * 3_001,
        b'{"type": "\\ud800"}',
        b'{"type": "\\udfff\\ud800"}',
        b'{"v": 1e999999}',
        b'{"v": ' + b"9" * 5_000 + b"}",
        b'{"v": 1, "v": 2}',
        b" " * (MAX_MESSAGE_BYTES + 1),
        '{"type": "\u2028"}'.encode(),
    ],
)
def test_edge_bodies(model: type[Message], body: bytes) -> None:
    parsed_or_refused(model, body)


@pytest.mark.parametrize("text", ["\ud800", '{"type": "ScheduleRequest", "order_id": "o\udfff"}'])
def test_text_with_a_lone_surrogate_given_as_str(text: str) -> None:
    with pytest.raises(InvalidMessage):
        decode(ScheduleRequest, text)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused_not_forwarded_as_null(token: str) -> None:
    # Once accepted (not JSON) and re-encoded as null: a message not sent on as received.
    body = json.dumps({**VALID[StepReply], "result": {"x": 0.5}}).replace("0.5", token)
    with pytest.raises(InvalidMessage, match="NaN or Infinity"):
        decode(StepReply, body.encode())


# --- the operator-facing ids and poison bodies: parsed from URLs and queues ------------------


@settings(max_examples=500, deadline=None)
@given(value=st.text() | st.from_regex(r"p1\.[A-Za-z0-9_-]{0,80}", fullmatch=True))
def test_any_poison_id_parses_to_a_queue_and_key_that_spell_it_again_or_to_none(value):
    from sas.domain.wire import parse_poison_id, poison_id

    parsed = parse_poison_id(value)
    if parsed is not None:
        assert poison_id(*parsed) == value


@settings(max_examples=500, deadline=None)
@given(value=st.text() | st.from_regex(r"\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{1,40}", fullmatch=True))
def test_any_rejected_id_is_recognised_only_in_its_one_spelling(value):
    from sas.domain.wire import is_rejected_row_key

    if is_rejected_row_key(value):
        assert len(value) <= 64 and value.isascii() and "\n" not in value


@settings(max_examples=500, deadline=None)
@given(content=st.text())
def test_any_storage_poison_body_is_shown_as_bytes(content):
    from sas.domain.parked import storage_body

    body, was_base64 = storage_body(content)
    assert isinstance(body, bytes) and isinstance(was_base64, bool)

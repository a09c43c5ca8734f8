"""Versioned, strictly validated message schemas (docs/architecture.md, "Messages").

Every message carries ``type`` and ``v``; unknown fields, wrong types and oversize bodies are
rejected with a reason that is safe to record (it never echoes the input back).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from sas.domain.errors import InvalidMessage
from sas.domain.wire import (
    ENDPOINT_NAME,
    IDEMPOTENCY_KEY,
    INCARNATION,
    MAX_ATTEMPT,
    MAX_TRACESTATE,
    ORDER_ID,
    QUEUE_NAME,
    STEP_NAME,
    TRACE_FIELD,
    TRACEPARENT,
    TRACESTATE,
    Mode,
    Priority,
    StatusLevel,
)

MAX_MESSAGE_BYTES = 48 * 1024
"""Storage Queues cap a message at 64 KiB after Base64 (4/3 growth); stay under it."""

MAX_HOLDS = 100_000
"""Times a message may be put back for a host with its workflow version (years, at most once
every five minutes)."""

MAX_BUDGET_SECONDS = 24 * 3600.0
"""A step's budget at most (``workflow.MAX_BUDGET``)."""

MAX_RESULT_BYTES = 8 * 1024
"""What a step keeps of the remote's answer (for its undo), as compact JSON: small, to fit a
message and a Table property with room to spare."""

MAX_RESULT_DEPTH = 16
"""Nesting a step's result may have: far more than any provider's answer needs, far less than
the JSON parsers' limits (pydantic-core stops near 200)."""

# The models below validate with Python's `re` (for the look-ahead in queue names), hence the
# `.python` form of each rule.
OrderId = Annotated[str, StringConstraints(pattern=ORDER_ID.python)]
QueueName = Annotated[str, StringConstraints(pattern=QUEUE_NAME.python)]
StepName = Annotated[str, StringConstraints(pattern=STEP_NAME.python)]
EndpointName = Annotated[str, StringConstraints(pattern=ENDPOINT_NAME.python)]
Incarnation = Annotated[str, StringConstraints(pattern=INCARNATION.python)]
Version = Annotated[int, Field(ge=1, le=9999)]


class TraceContext(BaseModel):
    """W3C trace context of the span that sent a message (sas/services/telemetry.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, regex_engine="python-re")

    traceparent: Annotated[str, StringConstraints(pattern=TRACEPARENT.python)]
    tracestate: Annotated[str, StringConstraints(max_length=MAX_TRACESTATE)] | None = None

    @field_validator("tracestate")
    @classmethod
    def _drop_malformed_state(cls, value: str | None) -> str | None:
        # W3C: a tracestate that does not parse is discarded, not an error of the message.
        return value if value is None or TRACESTATE.matches(value) else None


class Message(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        regex_engine="python-re",
        validate_by_name=True,
        validate_by_alias=True,
    )

    v: Literal[1] = 1
    trace: TraceContext | None = Field(default=None, alias=TRACE_FIELD)
    """Where the message's trace continues: set by the transport from the sending span, absent
    when there is none (and in messages sent before it existed)."""


APP_SET_FIELDS = ("deferred_since", "held_since", "holds", "room_turn")
"""The fields of a submission that say what the app did with it: never a submitter's."""


class OrderSubmitted(Message):
    """The application's order, posted to the orders queue."""

    type: Literal["OrderSubmitted"] = "OrderSubmitted"
    order_id: OrderId
    workflow: StepName = "order"
    version: Version | None = None
    """The workflow version the order is bound to; None: the newest deployed."""
    details: dict[str, Any]
    """The workflow's input, checked against its schema (``Workflow.input``) on submission."""
    reply_to: QueueName | None = None
    """The submitter's private status queue, for StatusEvents."""
    status_events: StatusLevel = "outcome"
    """``outcome``: how the order ends and whether it is being undone; ``steps``: every
    step's progress as well (``STEP_EVENTS``)."""
    priority: Priority = "normal"
    """Which lane the order takes at every hop; submit it to the orders queue's lane of the
    same priority so it does not wait behind others there either."""
    deferred_since: AwareDatetime | None = None
    """Set by the app when it puts a low-priority submission back for later (admission
    deferred while higher priorities are backlogged): when the first deferral happened, which
    bounds how long it may be deferred. Not part of the order."""
    held_since: AwareDatetime | None = None
    """Set by the app when a host put the message back for a host that has its workflow
    version (sas/services/versions.py). Not part of the order."""
    holds: int | None = Field(default=None, ge=1, le=MAX_HOLDS)
    """How often it was put back so far."""
    room_turn: AwareDatetime | None = None
    """Set by the app when it lets the submission in from the waiting room (its workflow had
    no room under ``max_in_flight``): when; its place is held already, so it goes in without
    being counted again. Not part of the order."""

    def fingerprint(self) -> str:
        """Stable hash of what was asked for: same id + same fingerprint = redelivery."""
        # Defaults are left out, so an order's fingerprint is what it was before the field
        # existed: a redelivery across an upgrade is still a redelivery.
        unset = {"trace", *APP_SET_FIELDS}
        if self.version is None:
            unset.add("version")
        if self.status_events == "outcome":
            unset.add("status_events")
        if self.priority == "normal":
            unset.add("priority")
        document = self.model_dump(mode="json", exclude=unset)
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


class ScheduleRequest(Message):
    """Asks any Scheduler to claim a Pending order."""

    type: Literal["ScheduleRequest"] = "ScheduleRequest"
    order_id: OrderId
    held_since: AwareDatetime | None = None
    """Set when a host put the message back for one that has the order's workflow version."""
    holds: int | None = Field(default=None, ge=1, le=MAX_HOLDS)


class StepRequest(Message):
    """Scheduler -> Agent: do (or undo) one step of one attempt before ``complete_by``."""

    type: Literal["StepRequest"] = "StepRequest"
    order_id: OrderId
    step: StepName
    step_index: int = Field(ge=0, le=99)
    attempt: int = Field(ge=1, le=MAX_ATTEMPT)
    mode: Mode = "do"
    action: StepName
    complete_by: AwareDatetime
    idempotency_key: Annotated[
        str, StringConstraints(max_length=200, pattern=IDEMPOTENCY_KEY.python)
    ]
    payload: dict[str, Any]
    priority: Priority = "normal"
    """The order's priority: the lane the reply goes back on."""
    incarnation: Incarnation | None = None
    """The order's incarnation: the reply carries it back (None in requests sent before)."""
    workflow: StepName | None = None
    version: Version | None = None
    """The workflow version the order is bound to (for the operator's eye: an agent runs its
    action whatever the version)."""
    held_since: AwareDatetime | None = None
    holds: int | None = Field(default=None, ge=1, le=MAX_HOLDS)
    budget: float | None = Field(default=None, gt=0, le=MAX_BUDGET_SECONDS)
    """The step's budget in seconds, counted from when an agent starts the request (which it
    records): ``complete_by`` bounds only how long the request may wait unstarted before the
    Supervisor looks at it. None in requests sent before: ``complete_by`` bounds the run."""


ReplyKind = Literal["ok", "error", "deferred"]
MAX_RETRY_AFTER_SECONDS = 60.0
"""The longest wait a deferred reply may ask for."""


class StepReply(Message):
    """Agent -> Scheduler: the outcome of the attempt it answers."""

    type: Literal["StepReply"] = "StepReply"
    order_id: OrderId
    step: StepName
    step_index: int = Field(ge=0, le=99)
    attempt: int = Field(ge=1, le=MAX_ATTEMPT)
    mode: Mode = "do"
    outcome: ReplyKind
    """``deferred``: no endpoint had room or the circuit was open, nothing was called; the step
    is asked again later."""
    result: dict[str, Any] = Field(default_factory=dict)
    endpoint: EndpointName | None = None
    """The remote endpoint that was called (None: not known, or nothing was called)."""
    error: Annotated[str, StringConstraints(max_length=1000)] | None = None
    incarnation: Incarnation | None = None
    """The incarnation the request named: a reply to an earlier submission of a reused order
    id never moves the new one."""
    held_since: AwareDatetime | None = None
    holds: int | None = Field(default=None, ge=1, le=MAX_HOLDS)
    retry_after: float | None = Field(default=None, ge=0, le=MAX_RETRY_AFTER_SECONDS)
    """``deferred`` by an open circuit: the seconds until it may let a call through."""

    @field_validator("result")
    @classmethod
    def _storable_result(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = result_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


def result_problem(result: dict[str, Any]) -> str | None:
    """Why a step's result cannot be kept (recorded with the step, sent in a reply), if so."""
    if _depth(result) > MAX_RESULT_DEPTH:
        return f"nested deeper than {MAX_RESULT_DEPTH}"
    try:
        text = json.dumps(result, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # before ValueError, its base class
        return "holds a lone surrogate"
    except (TypeError, ValueError):  # not JSON data, or NaN / Infinity
        return "not plain JSON data"
    if size > MAX_RESULT_BYTES:
        return f"{size} bytes > {MAX_RESULT_BYTES}"
    return None


def _depth(value: object, limit: int = MAX_RESULT_DEPTH + 1) -> int:
    """How deeply ``value`` nests, counted no further than ``limit`` (never recursing past it)."""
    depth, level = 0, [value]
    while level and depth < limit:
        children: list[object] = []
        for item in level:
            if isinstance(item, dict):
                children.extend(item.values())
            elif isinstance(item, list):
                children.extend(item)
        depth += 1
        level = children
    return depth


StatusKind = Literal[
    "received",
    "rejected",
    "step_started",
    "step_completed",
    "step_retry",
    "step_skipped",
    "completed",
    "failed",
    "compensating",
    "step_undone",
    "compensated",
    "resubmitted",
    "closed",
    "cancelled",
    "terminated",
    "suspended",
    "resumed",
]

STEP_EVENTS: frozenset[str] = frozenset(
    {"received", "step_started", "step_completed", "step_retry", "step_undone"}
)
"""Sent only to submitters who asked for ``status_events="steps"``; every other kind is an
outcome (or a turn toward one) and always sent."""


def wants_status(level: StatusLevel, status: StatusKind) -> bool:
    return level == "steps" or status not in STEP_EVENTS


class StatusEvent(Message):
    """Scheduler -> submitter's reply-to queue; correlated by ``order_id``."""

    type: Literal["StatusEvent"] = "StatusEvent"
    order_id: OrderId
    status: StatusKind
    at: AwareDatetime
    step: StepName | None = None
    detail: Annotated[str, StringConstraints(max_length=1000)] | None = None


class OperatorAlert(Message):
    """Something needs a human: sent to the alerts queue and logged at ERROR."""

    type: Literal["OperatorAlert"] = "OperatorAlert"
    alert_id: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    """The same for every copy of one alert, whatever the transport: de-duplicate on it."""
    order_id: OrderId
    reason: Annotated[str, StringConstraints(max_length=1000)]
    at: AwareDatetime


def encode(message: Message) -> bytes:
    return message.model_dump_json(exclude_none=True, by_alias=True).encode()


M = TypeVar("M", bound=Message)


def decode(model: type[M], body: bytes | str) -> M:
    """Parse and validate one message; raise InvalidMessage with a reason fit for an operator."""
    try:
        raw = body.encode() if isinstance(body, str) else body
    except UnicodeEncodeError:  # a str with a lone surrogate: no UTF-8 body could hold it
        raise InvalidMessage("body is not UTF-8") from None
    if len(raw) > MAX_MESSAGE_BYTES:
        raise InvalidMessage(f"oversize: {len(raw)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidMessage("body is not UTF-8") from None
    try:
        # NaN and Infinity are not JSON; the parser below would accept them in free-form
        # fields (payload, result) and forward them as null.
        json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        pass  # malformed or absurdly deep: the model's own parse below says what is wrong
    except _NonFinite:
        raise InvalidMessage("body holds NaN or Infinity, which JSON does not allow") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidMessage(f"invalid {model.__name__}: {problems(exc, '<body>')}") from None


def problems(error: ValidationError, whole: str) -> str:
    """What a validation error found, fit to record and show: where (the schema's own field
    names; an unexpected field's name, the sender's text, is never repeated) and what."""
    found = []
    for err in error.errors(include_input=False, include_url=False)[:5]:
        loc = [str(p) for p in err["loc"]]
        if err["type"] == "extra_forbidden" and loc:
            loc[-1] = "<unexpected field>"
        found.append(f"{'.'.join(loc) or whole}: {err['msg']}")
    return "; ".join(found)[:900]


class _NonFinite(Exception):
    pass


def _refuse_constant(name: str) -> object:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: a finite literal that no double can hold
        raise _NonFinite(text)
    return value

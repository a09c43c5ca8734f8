"""Every wire rule, written once: id and name patterns, step modes, message ids, idempotency
keys and table keys. Anything that formats or checks one of these calls this module.

Why each rule is what it is: docs/architecture.md, "Wire rules".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from sas.domain.clock import require_utc

# --- names and ids ----------------------------------------------------------------------


@dataclass(frozen=True)
class NameRule:
    """A pattern a whole value must match, with the anchors each regex engine needs.

    Python's ``$`` also matches before a trailing newline (``"abc\\n"`` would pass and then be
    refused by Table Storage as a key), so Python patterns end in ``\\Z``. Rust's regex (the
    default of pydantic-core and FastAPI) and ECMAScript (JSON Schema) have no ``\\Z`` but
    their ``$`` is the end of the text."""

    label: str
    body: str

    @property
    def python(self) -> str:
        """For ``re`` and pydantic models with ``regex_engine="python-re"``."""
        return rf"^(?:{self.body})\Z"

    @property
    def end_of_text(self) -> str:
        """For engines whose ``$`` is the end of the text: Rust regex, JSON Schema."""
        return rf"^(?:{self.body})$"

    def matches(self, value: str) -> bool:
        return re.fullmatch(self.body, value) is not None

    def check(self, value: str) -> str:
        """``value`` if it matches; ValueError naming the rule otherwise (never echoing it)."""
        if not self.matches(value):
            raise ValueError(f"not a valid {self.label}")
        return value


ORDER_ID = NameRule("order id", r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""Safe as a Table PartitionKey and inside message ids: no '/', '\\', '#', '?', ':' or control
characters, at most 64 characters."""

STEP_NAME = NameRule("step name", r"[a-z](?:_?[a-z0-9]){1,30}")
"""Workflow, step, agent and action names, snake_case: a lowercase letter, then lowercase
letters and digits, single underscores between them. They become setting keys (upper-cased),
URL path segments and, for agents, queue names (``queue_word``). A declaration keeps them to
``MAX_NAME_LENGTH`` characters (message ids and keys are made of them)."""
MAX_NAME_LENGTH = 31


def queue_word(name: str) -> str:
    """``name`` as a part of a queue name, which may hold hyphens but no underscores."""
    return name.replace("_", "-")


INCARNATION = NameRule("incarnation", r"[0-9a-f]{12}")
"""One submission of an order id (``new_incarnation``): a purged id submitted again is another
incarnation, with keys of its own."""

IDEMPOTENCY_KEY = NameRule(
    "idempotency key",
    rf"(?:{ORDER_ID.body}):(?:(?:{INCARNATION.body}):)?(?:{STEP_NAME.body})(?::undo)?",
)
"""What ``idempotency_key`` makes: ASCII only, since it travels in an HTTP header."""

MAX_ATTEMPT = 2**31 - 1
"""Attempts are stored as Table Storage Int32 properties."""

_QUEUE_NAME_BODY = r"(?!.*--)[a-z0-9][a-z0-9-]{{1,{inner}}}[a-z0-9]"
POISON_SUFFIX = "-poison"
"""What the Functions host appends to a Storage queue's name for messages that failed too
often."""
MAX_QUEUE_NAME = 63
"""Storage Queues' limit (Service Bus allows more)."""
MAX_APP_QUEUE_NAME = MAX_QUEUE_NAME - len(POISON_SUFFIX)
QUEUE_NAME = NameRule("queue name", _QUEUE_NAME_BODY.format(inner=MAX_QUEUE_NAME - 2))
"""Any queue sas sends to (e.g. a submitter's status queue): 3-63 lowercase letters, digits
and single hyphens — valid for Storage Queues and Service Bus alike."""
APP_QUEUE_NAME = NameRule("app queue name", _QUEUE_NAME_BODY.format(inner=MAX_APP_QUEUE_NAME - 2))
"""A queue the app is triggered by: the same, leaving room for the host's poison suffix."""

REPLY_TO_PREFIX = NameRule("reply-to prefix", r"[a-z0-9][a-z0-9-]{0,40}")
"""A prefix that a submitter's status queue must start with (SAS_REPLY_TO_PREFIXES)."""
DEFAULT_REPLY_TO_PREFIXES: tuple[str, ...] = ("status-",)
"""Where a submitter's status queue may be, unless ``SAS_REPLY_TO_PREFIXES`` says otherwise."""

TABLE_NAME_RULE = NameRule("table name", r"[A-Za-z][A-Za-z0-9]{2,58}")
"""Table Storage allows 63 characters; 4 are kept for the in-flight table's suffix."""


# --- remote endpoints ----------------------------------------------------------------------

DEFAULT_ENDPOINT = "primary"
"""The one endpoint of a remote service configured by its URL setting alone."""
ENDPOINT_NAME = NameRule("endpoint name", r"[a-z][a-z0-9]{1,30}")


def remote_target(agent: str, endpoint: str) -> str:
    """What names one endpoint of an agent's remote service (its circuit breaker, its load):
    the agent's name for the default endpoint (as before endpoints existed), else
    ``<agent>@<endpoint>``."""
    return agent if endpoint == DEFAULT_ENDPOINT else f"{agent}@{endpoint}"


# --- trace context ------------------------------------------------------------------------

TRACE_FIELD = "trace"
"""The optional envelope field of every message that carries its W3C trace context
(``{"traceparent": ..., "tracestate": ...}``): Storage Queues have no message properties."""
TRACEPARENT_PROPERTY = "traceparent"
"""The W3C header name, also the Service Bus application property and the envelope key."""
TRACESTATE_PROPERTY = "tracestate"
TRACEPARENT = NameRule("traceparent", r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
"""W3C trace context ``version-traceid-parentid-flags``, lowercase hex."""
MAX_TRACESTATE = 512
"""W3C allows 32 list members; a vendor's state fits far below this."""
_TRACESTATE_KEY = (
    r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
)
_TRACESTATE_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_TRACESTATE_MEMBER = f"{_TRACESTATE_KEY}={_TRACESTATE_VALUE}"
TRACESTATE = NameRule(
    "tracestate", rf"{_TRACESTATE_MEMBER}(?:[ \t]*,[ \t]*{_TRACESTATE_MEMBER}){{0,31}}"
)
"""W3C ``tracestate`` list grammar (printable ASCII, no line breaks). One that does not match
is dropped, never passed on: OpenTelemetry would log it word for word, and a sender could then
write what it likes into the app's logs (where the operator alert rule reads)."""


# --- step modes -------------------------------------------------------------------------

Mode = Literal["do", "undo"]
"""``undo`` runs a completed step's compensating action (compensation walks steps backwards)."""

Priority = Literal["high", "normal", "low"]
"""An order's priority: every queue the app consumes has a lane per priority (its own queue and
trigger), so work of one priority never waits behind another's backlog in a queue."""
PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")
DEFAULT_PRIORITY: Priority = "normal"


def lane_setting(queue_setting: str, priority: Priority) -> str:
    """The app setting naming ``queue_setting``'s lane for ``priority``: the setting itself
    for normal (existing deployments keep their names), ``<setting>_HIGH`` / ``_LOW``."""
    return queue_setting if priority == DEFAULT_PRIORITY else f"{queue_setting}_{priority.upper()}"


def lane_function_name(function: str, priority: Priority) -> str:
    """The function triggered by a lane: ``submit`` / ``submit_high`` / ``submit_low``."""
    return function if priority == DEFAULT_PRIORITY else f"{function}_{priority}"


def lane_queue_name(queue: str, priority: Priority) -> str:
    """The default name of ``queue``'s lane for ``priority``: ``<queue>-high`` / ``-low``."""
    return queue if priority == DEFAULT_PRIORITY else f"{queue}-{priority}"


StatusLevel = Literal["outcome", "steps"]
"""Which status events a submitter asked for: ``outcome`` (the default) is how the order ends
and whether it is being undone; ``steps`` adds every step's progress."""


# --- idempotency keys and message ids ----------------------------------------------------


def new_incarnation() -> str:
    return secrets.token_hex(6)


def idempotency_key(order_id: str, incarnation: str, step: str, mode: Mode) -> str:
    """What the remote service de-duplicates on: stable across attempts of one step, so a
    retry or a duplicate delivery never applies the effect twice; an undo has its own key.
    Made of the step's name, never its position (a step that moves keeps its key), and of
    the order's incarnation (an id used again after a purge gets new keys). Orders submitted
    before incarnations existed have none: their keys stay ``<order>:<step>``."""
    key = f"{order_id}:{incarnation}:{step}" if incarnation else f"{order_id}:{step}"
    return key if mode == "do" else f"{key}:undo"


def without_incarnation(key: str) -> str:
    """``key`` as ``<order>:<step>[:undo]``: the same for every submission of the order id
    (what a test reads as "this order's step", and what seeded fault dice are fixed by)."""
    order_id, _, rest = key.partition(":")
    head, _, tail = rest.partition(":")
    return f"{order_id}:{tail}" if INCARNATION.matches(head) and tail else key


def submission_message_id(order_id: str) -> str:
    """One order, one submission: a resent OrderSubmitted is a duplicate."""
    return order_id


def step_request_message_id(key: str, attempt: int) -> str:
    """One request per attempt of the step with idempotency key ``key``: the attempt (fencing
    token) makes every retry a new message."""
    return _bounded(f"{key}:{attempt}")


def step_reply_message_id(key: str, attempt: int) -> str:
    return _bounded(f"{key}:{attempt}:reply")


def held_message_id(message_id: str, holds: int) -> str:
    """A message put back for a host that has its order's workflow version, for the ``holds``-th
    time: a message of its own (duplicate detection would drop it as the original), and the
    same id for two copies of one delivery held at once (so one of them is dropped)."""
    return _bounded(f"{message_id}:held:{holds}")


def deferred_submission_message_id(order_id: str, deferred_at: datetime) -> str:
    """A submission put back for later (admission deferred, or no room in flight) is a message
    of its own: duplicate detection would otherwise drop it as the original submission."""
    return f"{submission_message_id(order_id)}:deferred:{_stamp(deferred_at)}"


def schedule_message_id(order_id: str, state_version: datetime) -> str:
    """One per persisted state version (its ``updated_at``): re-sending the request for the
    same version is a duplicate, while a new retry or resubmission never is."""
    return f"{order_id}:schedule:{_stamp(state_version)}"


def schedule_wakeup_message_id(order_id: str, state_version: datetime, asked_at: datetime) -> str:
    """A Scheduler that came too early (a retry's backoff not over) asks again for later: a
    message of its own, or duplicate detection would drop it as the first request again."""
    return f"{schedule_message_id(order_id, state_version)}:wake:{_stamp(asked_at)}"


def status_message_id(order_id: str, status: str, step: str | None, at: datetime) -> str:
    return _bounded(f"{order_id}:status:{status}:{step or '-'}:{_stamp(at)}")


def alert_message_id(order_id: str, attempt: int, error_at: datetime) -> str:
    """One per Error: the same id whoever sends it and however often (duplicate detection, and
    what an alerts consumer de-duplicates on)."""
    return f"{order_id}:alert:{attempt}:{_stamp(error_at)}"


def _stamp(at: datetime) -> str:
    return f"{at.timestamp():.6f}"


MAX_MESSAGE_ID = 128
"""Service Bus refuses a longer message id."""


def _bounded(message_id: str) -> str:
    """``message_id``, or for one too long its start and a digest of the whole: as unique, and
    the same for every sender (duplicate detection)."""
    if len(message_id) <= MAX_MESSAGE_ID:
        return message_id
    digest = hashlib.sha256(message_id.encode()).hexdigest()[:32]
    return f"{message_id[: MAX_MESSAGE_ID - len(digest) - 1]}~{digest}"


# --- table keys ----------------------------------------------------------------------------
# The orders table. PartitionKey = OrderID for an order's rows, so they change together in one
# entity-group transaction; a few '~' partitions (sorted after every order id) hold the rest.
# Beside it, the in-flight table holds only the in-flight index, so the Supervisor's query
# over it never passes finished history (Azurite scans a whole table for any query).

ORDER_ROW = "order"
STATE_ROW = "state"
STEP_ROW_PREFIX = "step:"
HISTORY_ROW_PREFIX = "hist:"
START_ROW_PREFIX = "run:"
LIVE_PARTITION = "~live"
"""The in-flight index (in the in-flight table): one row per order that may be live, RowKey =
OrderID, with the time by which the Supervisor must look at it (``DueAt``)."""
LIVE_TABLE_SUFFIX = "live"


def live_table_name(table_name: str) -> str:
    """The in-flight table that goes with the orders table ``table_name``."""
    return f"{TABLE_NAME_RULE.check(table_name)}{LIVE_TABLE_SUFFIX}"


AUDIT_PARTITION_PREFIX = "~audit."
"""Operators' actions (in the in-flight table, which purge never touches), one partition a
month: ``audit_partition``, RowKey = ``audit_row_key``. Both count down, so one range query
reads the newest first."""
_LAST_MONTH = 9999 * 12 + 11


def audit_partition(at: datetime) -> str:
    at = require_utc(at, "at")
    return f"{AUDIT_PARTITION_PREFIX}{_LAST_MONTH - (at.year * 12 + at.month - 1):06d}"


def audit_partition_range() -> tuple[str, str]:
    """``[first, after)``: every audit partition's key."""
    return AUDIT_PARTITION_PREFIX, AUDIT_PARTITION_PREFIX[:-1] + chr(ord(".") + 1)


def audit_row_key(at: datetime, tail: str) -> str:
    """Microseconds before the end of year 9999, then a tail that keeps rows of one instant
    apart: within a partition, newest first."""
    at = require_utc(at, "at")
    left = (_END_OF_TIME - at) // timedelta(microseconds=1)
    return f"{left:019d}-{tail}"


_END_OF_TIME = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


MISSING_PARTITION = "~missing"
"""Workflow versions that orders wait for and this app does not have (in the in-flight table),
RowKey = ``missing_definition_key``."""


def missing_definition_key(workflow: str, version: int, fingerprint: str) -> str:
    return f"{workflow}.{version}.{fingerprint or '-'}"


MISSING_ALERT_PREFIX = "definition-missing:"


def missing_alert_id(key: str, at: datetime) -> str:
    """The alert of a missing definition: one id per definition and UTC day, whoever sends it."""
    return _bounded(f"{MISSING_ALERT_PREFIX}{key}:{at.astimezone(UTC):%Y-%m-%d}")


ALERTS_PARTITION = "~alerts"
"""Operator alerts as sent (in the in-flight table), RowKey = the alert id: what an operator
acknowledges, and what tells an open alert from one its order left behind."""

LOAD_PARTITION = "~load"
"""Remote endpoints' in-flight calls as each process last published them (in the in-flight
table), RowKey = ``load_row_key``."""
BUDGET_PARTITION = "~budget"
"""Each Supervisor process's retries held back, as it last published them (in the in-flight
table), RowKey = ``instance_row_key``."""
ROOM_PARTITION = "~room"
"""Submissions waiting for room under their workflow's ``max_in_flight`` (in the in-flight
table), RowKey = ``room_row_key``: by workflow, then normal before low, then first come."""
REJECTED_PARTITION = "~rejected"
"""Messages parked as unprocessable, RowKey = time + random tail."""
BREAKER_PARTITION = "~breaker"
"""Circuit breakers, RowKey = the agent's name."""
CLOCK_PROBE = ("~clock", "probe")
"""A row never written: reading it costs one request whose answer is dated by the store's clock
(sas/services/store_time.py), for a process that has no other answer yet."""


def load_row_key(target: str, instance_id: str) -> str:
    """One process's count for one remote target; characters a key may not hold are replaced."""
    return f"{target}|{instance_row_key(instance_id)}"


def instance_row_key(instance_id: str) -> str:
    """A process's own row; characters a key may not hold are replaced."""
    return _KEY_UNSAFE.sub("_", instance_id)[:200]


_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]")


def step_row_key(index: int, name: str) -> str:
    return f"{STEP_ROW_PREFIX}{index:02d}:{name}"


def start_row_key(key: str, attempt: int) -> str:
    """The row an agent writes when it starts an attempt: the step's key without the order id
    (the partition says it), then the attempt."""
    _, _, rest = key.partition(":")
    return f"{START_ROW_PREFIX}{rest}:{attempt:010d}"


def history_row_key(at: datetime, attempt: int, tail: str) -> str:
    """Time first, so a range query returns the trail in order; ``tail`` (random) keeps two
    entries of one instant apart."""
    return f"{HISTORY_ROW_PREFIX}{_utc_stamp(at)}:{attempt:05d}:{tail}"


_ROOM_RANKS = {"normal": "1", "low": "2"}


def room_row_key(workflow: str, priority: Priority, at: datetime, order_id: str) -> str:
    """A waiting submission's row: a range query of its workflow's rows returns them in the
    order they go in (high priority never waits)."""
    return f"{workflow}~{_ROOM_RANKS[priority]}~{_utc_stamp(at)}~{order_id}"


def room_rows(workflow: str) -> tuple[str, str]:
    """The RowKey range (from, before) of ``workflow``'s waiting submissions."""
    return f"{workflow}~1", f"{workflow}~3"


def room_rows_besides(workflows: tuple[str, ...]) -> list[tuple[str | None, str | None]]:
    """The RowKey ranges (from, before; None: open) of waiting submissions of any workflow but
    ``workflows``: the gaps between their ranges."""
    bounds = sorted(room_rows(workflow) for workflow in workflows)
    starts: list[str | None] = [None, *(after for _, after in bounds)]
    ends: list[str | None] = [*(first for first, _ in bounds), None]
    return list(zip(starts, ends, strict=True))


def rejected_row_key(at: datetime, tail: str) -> str:
    return f"{_utc_stamp(at)}-{tail}"


_HEX = frozenset("0123456789abcdef")


def is_rejected_row_key(value: str) -> bool:
    """Only a key ``rejected_row_key`` makes (a UTC stamp, '-', a lowercase hex tail), in its
    one spelling: an operator-supplied id that is anything else never reaches the store."""
    stamp, _, tail = value.partition("-")
    if len(value) > 64 or not 1 <= len(tail) <= 32 or not set(tail) <= _HEX:
        return False
    try:
        at = datetime.strptime(stamp, _UTC_STAMP).replace(tzinfo=UTC)
    except ValueError:
        return False
    return rejected_row_key(at, tail) == value


def prefix_range(prefix: str) -> tuple[str, str]:
    """RowKey bounds ``lo <= key < hi`` of every key starting with ``prefix``."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


_UTC_STAMP = "%Y%m%dT%H%M%S.%fZ"


def _utc_stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime(_UTC_STAMP)


# --- operator-facing ids ------------------------------------------------------------------

POISON_ID_PREFIX = "p1."
POISON_KEY = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""A transport message id: a Storage message id (a GUID) or a Service Bus sequence number."""


def poison_id(queue: str, key: str) -> str:
    """The operator-facing id of message ``key`` (transport message id) poisoned from ``queue``.

    Base64url without padding, so it is safe in a URL path segment as it is."""
    if not APP_QUEUE_NAME.matches(queue) or not POISON_KEY.fullmatch(key):
        raise ValueError("not a poisoned message's queue and id")
    raw = f"{queue}/{key}".encode("ascii")
    return POISON_ID_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def parse_poison_id(value: str) -> tuple[str, str] | None:
    """``(queue, key)`` of an id made by ``poison_id``; None for anything else."""
    if not value.startswith(POISON_ID_PREFIX) or len(value) > 300:
        return None
    encoded = value[len(POISON_ID_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        return None
    queue, _, key = raw.partition("/")
    if not APP_QUEUE_NAME.matches(queue) or not POISON_KEY.fullmatch(key):
        return None
    if poison_id(queue, key) != value:  # one spelling per message: no aliases
        return None
    return queue, key

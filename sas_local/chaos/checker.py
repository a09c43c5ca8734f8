"""The chaos campaign's judge: reads what the system left behind and names every violation.

Independent of the product on purpose: nothing from ``sas`` is imported or called. The
design it checks against (table layout, workflow, alert id, policy) is written down in
``design.toml`` next to this file, and the legal transitions are encoded below from the
documented state machine (docs/architecture.md). Evidence is read raw: every entity of the
table (azure-data-tables), the alerts queue and every ``-poison`` queue (azure-storage-queue,
Base64 JSON bodies), the simulator's ledger (``GET /ledger``) and the Python agents' effects
(rows of the tables ``design.toml`` names). Each order is judged by the workflow version its
state row says it was bound to (``Version``; 1 when absent).

Violation classes (``Violation.kind``), each with the order id and evidence:

- ``lost_order``: submitted, but neither a state row nor parked in the rejected partition;
- ``stuck_order``: not terminal, or still in the in-flight index, or still owing its alert;
- ``effect_applied_twice``: one (order, service, action) applied (or one effect undone) twice;
- ``compensation_incomplete``: a Compensated (or Cancelled) order with an effect left applied
  (of a step that has an undo action: one without needs no undoing);
- ``processed_effect_missing``: a Processed order without a step's effect (a step that may be
  skipped, ``on_failure = "continue"``, and did not complete, excepted), or with it undone;
- ``error_alerts``: an Error episode with no alert, several distinct alert ids, more raw copies
  than 1 + its ``alert_claimed`` entries, or a claim re-taken before the lease lapsed;
- ``alert_without_error``: an alert for an order (or an Error episode) that never was;
- ``stale_reply_applied``: a reply the reply rule refuses, applied: a completed/undone row for a
  step or direction the order no longer waited on, or for an attempt never claimed for it; a
  refused row for an attempt that was not the one running;
- ``illegal_transition``: history rows that no legal sequence of transitions explains, or a
  history that does not end in the state row;
- ``failure_count_exceeded``: FailureCount (state row or an expiry's count) past the threshold,
  a retry at the threshold, or an expiry judged against another threshold;
- ``poisoned_message``: any message in a ``-poison`` queue;
- ``unexpected_effect``: an effect no legal run makes: for an order never submitted, an action
  its workflow has no step for, a step the order never reached (in ``do`` mode, past its
  ``StepIndex``), or under a key that is not the step's (``design.toml``, ``do_key``);
- ``orphaned_effect``: an effect left applied for a finished order (Processed, Error, Closed)
  whose step never completed (no ``step:`` row of that name), other than the step an Error
  stopped on, a step that may be skipped, and a step with no undo action of an order stopped
  in its undo (as in an undone order, nothing undoes it).

An alert for a missing workflow definition (``missing_id_pattern``) must name an order that
waited for that version (``alert_without_error`` otherwise).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

DESIGN_PATH = Path(__file__).with_name("design.toml")

KINDS = (
    "lost_order",
    "stuck_order",
    "effect_applied_twice",
    "compensation_incomplete",
    "processed_effect_missing",
    "error_alerts",
    "alert_without_error",
    "stale_reply_applied",
    "illegal_transition",
    "failure_count_exceeded",
    "poisoned_message",
    "unexpected_effect",
    "orphaned_effect",
)
RECOVERY_KINDS = (
    "expired_retry",
    "expired_compensate",
    "expired_compensated",
    "expired_error",
    "expired_skipped",
    "refused_skipped",
    "reply_dropped",
    "alert_claimed",
    "resubmitted",
    "waiting",
    "resumed",
)
REPLY_KINDS = frozenset({"completed", "undone", "refused"})
COMMITTED = "~committed"
"""Where ``collect`` puts a row's service Timestamp (its transaction's commit time)."""
TRANSACTION_SPREAD = 0.005
"""Seconds between the service stamps of two rows of one transaction, at most."""
_RANK = {"submitted": 0, "claimed": 2, "deferred": 2, "input_failed": 2}
"""Within one transaction: the reply or expiry first, then the claim it made (default 1)."""
PENDING, PROCESSING, COMPENSATING = "Pending", "Processing", "Compensating"
PROCESSED, COMPENSATED, ERROR, CLOSED = "Processed", "Compensated", "Error", "Closed"
CANCELLED, TERMINATED = "Cancelled", "Terminated"
UNDONE = frozenset({COMPENSATED, CANCELLED})
"""Ends in which every applied effect must have been undone."""
STEERING_KINDS = frozenset({"cancelled", "suspended", "unsuspended", "terminated"})
"""Operators' rows (sas/services/steering.py)."""
_STEERED = "not counted: an operator's"
_FAILURE = re.compile(r"failure (\d+) of (\d+)")
_UNCOUNTED = re.compile(r"not counted: saturated \((\d+) of (\d+)\)")
"""An expiry the Supervisor took as the load's: retried with the failure count unchanged."""


# --- the design ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSpec:
    name: str
    agent: str
    action: str
    undo: str | None
    max_failures: int | None = None
    """Its own failure threshold; None: the policy's."""
    on_failure: str | None = None
    """What its final failure does; None: the workflow's ``on_failure``."""


@dataclass(frozen=True)
class FlowSpec:
    steps: tuple[StepSpec, ...]
    on_failure: str
    version: int = 1


@dataclass(frozen=True)
class Design:
    table_name: str
    order_row: str
    state_row: str
    step_row_prefix: str
    history_row_prefix: str
    live_table: str
    live_partition: str
    rejected_partition: str
    orders_queue: str
    alerts_queue: str
    poison_suffix: str
    alert_lease_seconds: float
    alert_id: re.Pattern[str]
    missing_alert_id: re.Pattern[str]
    """The one alert for orders waiting on a workflow version a host does not have."""
    max_failures: int
    clock_skew_seconds: float
    steps: tuple[StepSpec, ...]
    """The steps of the workflow version judged (``for_workflow``); the first declared by
    default."""
    on_failure: str
    terminal: frozenset[str]
    workflows: Mapping[tuple[str, int], FlowSpec]
    """By (name, version): an order is judged by the version its state row names."""
    effect_tables: tuple[str, ...]
    """The Python agents' tables: each row one effect (PartitionKey the order, RowKey the
    idempotency key, Agent, Action), read as ledger entries."""
    do_key: str
    """A step's idempotency key, ``{order}``, ``{incarnation}`` and ``{step}`` filled in."""
    legacy_do_key: str
    """The key of an order submitted before incarnations (its state row has none)."""

    @classmethod
    def load(cls, path: Path = DESIGN_PATH) -> Design:
        doc = tomllib.loads(path.read_text())
        table, queues, alerts, policy = doc["table"], doc["queues"], doc["alerts"], doc["policy"]
        flows = {
            (flow["name"], int(flow.get("version", 1))): FlowSpec(
                tuple(
                    StepSpec(
                        s["name"],
                        s["agent"],
                        s["action"],
                        s.get("undo"),
                        s.get("max_failures"),
                        s.get("on_failure"),
                    )
                    for s in flow["steps"]
                ),
                flow["on_failure"],
                int(flow.get("version", 1)),
            )
            for flow in doc["workflows"]
        }
        first = next(iter(flows.values()))
        return cls(
            table_name=table["name"],
            order_row=table["order_row"],
            state_row=table["state_row"],
            step_row_prefix=table["step_row_prefix"],
            history_row_prefix=table["history_row_prefix"],
            live_table=table["live_table"],
            live_partition=table["live_partition"],
            rejected_partition=table["rejected_partition"],
            orders_queue=queues["orders"],
            alerts_queue=queues["alerts"],
            poison_suffix=queues["poison_suffix"],
            alert_lease_seconds=float(alerts["lease_seconds"]),
            alert_id=re.compile(alerts["id_pattern"]),
            missing_alert_id=re.compile(alerts["missing_id_pattern"]),
            max_failures=int(policy["max_failures"]),
            clock_skew_seconds=float(policy["clock_skew_seconds"]),
            steps=first.steps,
            on_failure=first.on_failure,
            terminal=frozenset(policy["terminal"]),
            workflows=flows,
            effect_tables=tuple(doc["effects"]["tables"]),
            do_key=doc["effects"]["do_key"],
            legacy_do_key=doc["effects"]["legacy_do_key"],
        )

    def for_workflow(self, name: str, version: int = 1) -> Design | None:
        """This design judging version ``version`` of the workflow ``name``; None for one it
        does not know."""
        flow = self.workflows.get((name, version))
        return None if flow is None else replace(self, steps=flow.steps, on_failure=flow.on_failure)

    def for_state(self, state: Mapping[str, Any]) -> Design | None:
        """This design judging the workflow version a state row says its order is bound to
        (``Version``; absent in orders from before versions: 1)."""
        return self.for_workflow(str(state.get("Workflow")), bound_version(state))

    def do_key_of(self, order_id: str, state: Mapping[str, Any], step: str) -> str:
        """The idempotency key of ``step``'s effect for the order ``state`` describes."""
        incarnation = state.get("Incarnation")
        if not incarnation:
            return self.legacy_do_key.format(order=order_id, step=step)
        return self.do_key.format(order=order_id, incarnation=incarnation, step=step)

    def step_index(self, agent: str, action: str) -> int | None:
        """The step of this workflow version that calls ``agent``'s ``action``."""
        for index, spec in enumerate(self.steps):
            if (spec.agent, spec.action) == (agent, action):
                return index
        return None

    def threshold(self, index: int) -> int:
        """Expiries of step ``index`` before it fails for good."""
        own = self.steps[index].max_failures if 0 <= index < len(self.steps) else None
        return own or self.max_failures

    def policy(self, index: int) -> str:
        """What step ``index``'s final failure does: its own policy, else the workflow's."""
        own = self.steps[index].on_failure if 0 <= index < len(self.steps) else None
        return own or self.on_failure

    def skipped_by_refusal(self, history: Sequence[_Row]) -> int:
        """Refusals in ``history`` that skipped their step: a ``continue`` step's ``do``, before
        any cancel (a cancelled order is undone instead)."""
        names = [spec.name for spec in self.steps]
        skipped = 0
        for row in history:
            if row.kind == "cancelled":
                break
            if row.kind == "refused" and row.mode == "do" and row.step in names:
                skipped += self.policy(names.index(row.step)) == "continue"
        return skipped

    def threshold_of(self, step: str | None) -> int:
        names = [spec.name for spec in self.steps]
        return self.threshold(names.index(step)) if step in names else self.max_failures

    def next_undo(self, index: int) -> int | None:
        """The highest step at or below ``index`` that has an undo action."""
        for candidate in range(min(index, len(self.steps) - 1), -1, -1):
            if self.steps[candidate].undo is not None:
                return candidate
        return None

    def step_name(self, index: int) -> str | None:
        return self.steps[index].name if 0 <= index < len(self.steps) else None


def bound_version(state: Mapping[str, Any]) -> int:
    return int(state.get("Version") or 1)


# --- evidence and verdicts -----------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    kind: str
    order_id: str | None
    detail: str
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "order_id": self.order_id,
            "detail": self.detail,
            "evidence": _jsonable(self.evidence),
        }


@dataclass
class Evidence:
    """Everything the checker judges, as read from the outside."""

    entities: Sequence[Mapping[str, Any]]
    """Every entity of the table, as azure-data-tables returns them (or synthetic dicts)."""
    alerts: Sequence[str]
    """Raw alert bodies (JSON text), every copy that reached the alerts queue."""
    poison: dict[str, list[str]]
    """``<queue>-poison`` -> the bodies found there (Base64-decoded where possible)."""
    ledger: Mapping[str, Any]
    """The simulator's ``GET /ledger`` document."""
    submitted: Sequence[str]
    """The order ids the campaign submitted."""


@dataclass
class Verdict:
    violations: list[Violation]
    outcomes: dict[str, int]
    recoveries: dict[str, int]
    alerts: int
    error_episodes: int
    missing_definition_alerts: int = 0
    """Alerts for orders waiting on a workflow version (``Design.missing_alert_id``)."""

    @property
    def by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.violations))


# --- reading the evidence ------------------------------------------------------------------


def collect(
    connection_string: str,
    simulator_url: str,
    submitted: Sequence[str],
    *,
    design: Design,
    consumed_alerts: Mapping[str, str] | None = None,
) -> Evidence:
    """Read the tables, drain the alerts queue (receive + delete), peek every poison queue and
    fetch the ledger. ``consumed_alerts``: queue message id -> body of the alerts an operator
    already took off the queue (one copy per message id: a copy whose delete failed returns)."""
    import httpx
    from azure.data.tables import TableClient
    from azure.storage.queue import QueueServiceClient

    entities: list[Mapping[str, Any]] = []
    for name in (design.table_name, design.live_table):  # the in-flight markers live apart
        with TableClient.from_connection_string(connection_string, name) as table:
            # The service's Timestamp of each row: when its transaction committed, by the one
            # clock every write shares (a transaction's rows within TRANSACTION_SPREAD).
            entities += [
                {**e, COMMITTED: e.metadata.get("timestamp")} for e in table.list_entities()
            ]
    service = QueueServiceClient.from_connection_string(connection_string)
    alerts = dict(consumed_alerts or {})
    alerts_queue = service.get_queue_client(design.alerts_queue)
    while True:
        batch = list(alerts_queue.receive_messages(messages_per_page=32, max_messages=32))
        if not batch:
            break
        for message in batch:
            alerts[message.id] = decode_body(message.content)
            alerts_queue.delete_message(message)
    poison: dict[str, list[str]] = {}
    for queue in service.list_queues():
        if queue.name.endswith(design.poison_suffix):
            client = service.get_queue_client(queue.name)
            count = client.get_queue_properties().approximate_message_count or 0
            bodies = [decode_body(m.content) for m in client.peek_messages(max_messages=32)]
            if count or bodies:
                poison[queue.name] = bodies + ["<more>"] * max(0, count - len(bodies))
    response = httpx.get(f"{simulator_url}/ledger", timeout=60)
    response.raise_for_status()
    ledger = response.json()
    ledger["effects"] = [*ledger.get("effects", []), *_table_effects(connection_string, design)]
    return Evidence(entities, list(alerts.values()), poison, ledger, list(submitted))


def _table_effects(connection_string: str, design: Design) -> list[dict[str, Any]]:
    """The Python agents' effects (``Design.effect_tables``) as ledger entries."""
    from azure.data.tables import TableClient

    found = []
    for name in design.effect_tables:
        with TableClient.from_connection_string(connection_string, name) as table:
            found += [
                {
                    "kind": "do",
                    "service": row.get("Agent"),
                    "action": row.get("Action"),
                    "idempotency_key": row["RowKey"],
                    "order_id": row["PartitionKey"],
                }
                for row in table.list_entities()
            ]
    return found


def decode_body(content: object) -> str:
    """A queue body as text: Base64 JSON as the app sends it, or the text itself."""
    text = content.decode() if isinstance(content, bytes) else str(content or "")
    try:
        return base64.b64decode(text, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return text


# --- the checks ----------------------------------------------------------------------------


@dataclass
class _State:
    ps: str
    step: int
    mode: str
    attempt: int
    failures: int = 0
    unrecorded_claim: bool = False
    """A reply's transition claimed the next step: its ``claimed`` (or ``deferred``) row, in
    the same transaction, may follow once."""
    claimed: frozenset[tuple[int, str, int]] = frozenset()
    """Every (step, mode, attempt) claimed so far: a reply may only answer one of them."""
    waiting: bool = False
    """A host without the order's workflow version keeps it waiting: only a resume (or a
    transition of a host that has the version) ends that; an expiry must follow a resume."""
    cancelled: bool = False
    """An operator cancelled it: no step goes forward; it ends Cancelled once undone."""
    suspended: bool = False
    """An operator suspended it: nothing is claimed until it is resumed."""

    def with_claim(self, attempt: int) -> _State:
        return replace(self, claimed=self.claimed | {(self.step, self.mode, attempt)})


@dataclass
class _Episode:
    attempt: int
    at: float
    row: str
    claims: list[float] = field(default_factory=list)
    ended_by: str | None = None


@dataclass(frozen=True)
class _Row:
    key: str
    at: float
    kind: str
    attempt: int
    step: str | None
    mode: str
    detail: str
    committed: float
    """When its transaction committed (the service's Timestamp; ``at`` where there is none)."""

    def show(self) -> str:
        return f"{self.kind}@{self.attempt} {self.step or '-'}/{self.mode} at {self.at:.3f}"


def check(evidence: Evidence, design: Design | None = None) -> Verdict:
    design = design or Design.load()
    by_order: dict[str, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    live: set[str] = set()
    parked: set[str] = set()
    for entity in evidence.entities:
        pk, rk = str(entity["PartitionKey"]), str(entity["RowKey"])
        if pk == design.live_partition:
            live.add(rk)
        elif pk == design.rejected_partition:
            order_id = _parked_order_id(entity)
            if order_id:
                parked.add(order_id)
        elif not pk.startswith("~"):
            by_order[pk][rk] = entity

    violations: list[Violation] = []
    outcomes: Counter[str] = Counter()
    recoveries: Counter[str] = Counter()
    episodes: dict[str, list[_Episode]] = {}
    unexplained: set[str] = set()
    waited: dict[str, str] = {}
    """Orders that waited for their workflow version -> that version's key."""
    for order_id in evidence.submitted:
        rows = by_order.get(order_id, {})
        state = rows.get(design.state_row)
        if state is None:
            if order_id in parked:
                outcomes["parked"] += 1
            else:
                outcomes["lost"] += 1
                violations.append(
                    Violation(
                        "lost_order",
                        order_id,
                        "submitted, but no state row and not parked",
                        {"rows": sorted(rows)},
                    )
                )
            continue
        ps = str(state.get("ProcessState"))
        outcomes[ps] += 1
        flow = design.for_state(state)
        if flow is None:
            why = f"unknown workflow {state.get('Workflow')!r} v{bound_version(state)}"
            violations.append(Violation("illegal_transition", order_id, why, {}))
            unexplained.add(order_id)
            continue
        history = _history(rows, flow)
        if any(r.kind == "waiting" for r in history):
            waited[order_id] = _definition_key(state)
        recoveries.update(r.kind for r in history if r.kind in RECOVERY_KINDS)
        recoveries["refused_skipped"] += flow.skipped_by_refusal(history)
        violations += _stuck(order_id, state, ps, order_id in live, flow)
        violations += _failure_counts(order_id, state, history, flow)
        found, replay_violations, explained = _replay(order_id, state, history, flow)
        if explained:  # otherwise its episodes are unknown: the replay violation says why
            episodes[order_id] = found
        else:
            unexplained.add(order_id)
        violations += replay_violations
    violations += _ledger(evidence, by_order, design)
    raw = _missing_definition_alerts(evidence.alerts, waited, design)
    violations += raw.violations
    alert_violations, alert_count = _alerts(raw.others, episodes, design, unexplained)
    violations += alert_violations
    violations += _poison(evidence.poison)
    return Verdict(
        violations,
        dict(outcomes),
        {kind: recoveries.get(kind, 0) for kind in RECOVERY_KINDS},
        alert_count + raw.count,
        sum(len(found) for found in episodes.values()),
        raw.count,
    )


def _definition_key(state: Mapping[str, Any]) -> str:
    """How a missing-definition alert names the version an order is bound to."""
    return f"{state.get('Workflow')}.{bound_version(state)}.{state.get('Definition') or '-'}"


@dataclass
class _MissingAlerts:
    count: int
    violations: list[Violation]
    others: list[str]
    """The alerts that are not for a missing definition."""


def _missing_definition_alerts(
    raw: Iterable[str], waited: Mapping[str, str], design: Design
) -> _MissingAlerts:
    """An alert for a missing definition must name an order that waited for that version."""
    found = _MissingAlerts(0, [], [])
    for body in raw:
        try:
            document = json.loads(body)
            alert_id, order_id = str(document["alert_id"]), str(document["order_id"])
        except (ValueError, KeyError, TypeError):
            found.others.append(body)  # judged (unreadable) with the others
            continue
        match = design.missing_alert_id.match(alert_id)
        if match is None:
            found.others.append(body)
            continue
        found.count += 1
        if waited.get(order_id) != match.group("key"):
            why = f"alert {alert_id}: the order never waited for that workflow version"
            evidence = {"waited_for": waited.get(order_id)}
            found.violations.append(Violation("alert_without_error", order_id, why, evidence))
    return found


def _parked_order_id(entity: Mapping[str, Any]) -> str | None:
    chunks = sorted(k for k in entity if k.startswith("Body") and k[4:].isdigit())
    body = b"".join(_bytes(entity[k]) for k in chunks)
    try:
        document = json.loads(body)
    except ValueError:
        return None
    order_id = document.get("order_id") if isinstance(document, dict) else None
    return order_id if isinstance(order_id, str) else None


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return str(value).encode()


def _ts(value: object) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _history(rows: Mapping[str, Mapping[str, Any]], design: Design) -> list[_Row]:
    found = []
    for key, entity in rows.items():
        if key.startswith(design.history_row_prefix):
            at = _ts(entity.get("At"))
            committed = entity.get(COMMITTED)
            found.append(
                _Row(
                    key=key,
                    at=at,
                    kind=str(entity.get("Kind")),
                    attempt=int(entity.get("Attempt", -1)),
                    step=entity.get("Step"),
                    mode="undo" if entity.get("Mode") == "undo" else "do",
                    detail=str(entity.get("Detail") or ""),
                    committed=at if committed is None else _ts(committed),
                )
            )
    return sorted(found, key=lambda r: (r.committed, _RANK.get(r.kind, 1), r.at, r.key))


def _stuck(
    order_id: str, state: Mapping[str, Any], ps: str, indexed: bool, design: Design
) -> list[Violation]:
    why = []
    if ps not in design.terminal:
        why.append(f"not terminal ({ps})")
    if indexed:
        why.append("still in the in-flight index")
    if state.get("AlertPending"):
        why.append("still owes its operator alert")
    if state.get("Waiting"):
        why.append(f"still waiting: {state.get('Waiting')}")
    if not why:
        return []
    evidence = {
        k: state.get(k)
        for k in ("ProcessState", "Attempt", "StepIndex", "Mode", "CompleteBy", "Version")
    }
    return [Violation("stuck_order", order_id, "; ".join(why), evidence)]


def _failure_counts(
    order_id: str, state: Mapping[str, Any], history: list[_Row], design: Design
) -> list[Violation]:
    found = []
    count = int(state.get("FailureCount", 0))
    limit = design.threshold(int(state.get("StepIndex", -1)))
    if count > limit:
        found.append(
            Violation(
                "failure_count_exceeded",
                order_id,
                f"state FailureCount {count} > threshold {limit}",
                {"FailureCount": count},
            )
        )
    for row in history:
        match = _FAILURE.search(row.detail) if row.kind.startswith("expired_") else None
        if match is None:
            continue
        failures, threshold = int(match.group(1)), int(match.group(2))
        limit = design.threshold_of(row.step)
        if failures > limit:
            why = f"{row.kind} counted failure {failures} > {limit}"
        elif row.kind == "expired_retry" and failures >= limit:
            why = f"retried at failure {failures}: the threshold {limit} was reached"
        elif threshold != limit:
            why = f"{row.kind} judged against threshold {threshold}, configured {limit}"
        else:
            continue
        found.append(
            Violation(
                "failure_count_exceeded", order_id, why, {"row": row.show(), "detail": row.detail}
            )
        )
    return found


def _apply(s: _State | None, r: _Row, design: Design) -> _State | str:
    """The state after row ``r`` if it is a legal transition from ``s``; otherwise why not.
    An operator's cancel or suspend changes what some rows mean (``_steered``); the flags
    carry over every other transition, and an undone cancelled order ends Cancelled."""
    if s is not None and (s.cancelled or s.suspended or r.kind in STEERING_KINDS):
        steered = _steered(s, r, design)
        if steered is not None:
            return steered
    new = _plain(s, r, design)
    if isinstance(new, str) or s is None:
        return new
    if new.ps == ERROR:  # a resubmit carries on with the undo a cancel started
        return replace(new, cancelled=s.cancelled)
    if new.ps in design.terminal:
        return replace(new, ps=CANCELLED if s.cancelled and new.ps == COMPENSATED else new.ps)
    return replace(new, cancelled=s.cancelled, suspended=s.suspended)


def _steered(s: _State, r: _Row, design: Design) -> _State | str | None:
    """The rows an operator's cancel or suspend decides; None: as without them."""
    here = design.step_name(s.step)
    same_step = r.step == here and r.mode == s.mode
    running = PROCESSING if s.mode == "do" else COMPENSATING
    live = s.ps in (PENDING, running)
    if r.kind == "cancelled":
        if s.cancelled or s.mode != "do" or not (live or s.ps == ERROR):
            return "cancel of an order being undone already, or finished"
        if s.ps == PROCESSING:  # left to answer
            return replace(s, cancelled=True, suspended=False)
        # A step claimed at least once may have been applied: the undo starts there.
        tried = any(step == s.step and mode == "do" for step, mode, _ in s.claimed)
        unflagged = replace(s, cancelled=True, suspended=False)
        return _undo_from(unflagged, s.step if tried else s.step - 1, design, r)
    if r.kind == "suspended":
        return replace(s, suspended=True) if live and not s.suspended else "suspend of " + s.ps
    if r.kind == "unsuspended":
        return replace(s, suspended=False) if s.suspended else "resume of an unsuspended order"
    if r.kind == "terminated":
        return _State(TERMINATED, s.step, s.mode, s.attempt) if live else "terminate of " + s.ps
    if r.kind == "claimed" and (s.suspended or (s.cancelled and s.mode == "do")):
        if not (s.ps == running and s.unrecorded_claim):
            return "claim of a suspended order, or of a cancelled order's next step"
        return None
    forward = s.cancelled and s.mode == "do"
    if forward and r.kind in ("completed", "deferred", "refused") and same_step:
        current = s.ps == running and r.attempt == s.attempt
        if r.kind != "completed" and not current:
            return f"{r.kind} applied for an attempt that is not the one running"
        if (s.step, s.mode, r.attempt) not in s.claimed:
            return f"reply for attempt {r.attempt}, which was never claimed"
        # ok: the step is done, undo it too; a refusal: below it unless an earlier attempt
        # expired; a deferral called nothing, but an earlier attempt may have.
        refused_clean = r.kind == "refused" and not _tried_before(s, r)
        return _undo_from(s, s.step - 1 if refused_clean else s.step, design, r)
    if forward and r.kind.startswith("expired_") and _STEERED in r.detail:
        if s.ps not in (PENDING, running) or r.attempt != s.attempt or not same_step:
            return "expiry of a record that is not live at that attempt and step"
        return _undo_from(s, s.step, design, r)
    if s.suspended and r.kind == "expired_held":
        if s.ps != running or r.attempt != s.attempt or not same_step:
            return "hold of a step that was not running"
        return replace(s, ps=PENDING)
    if (forward or s.suspended) and r.kind.startswith("expired_"):  # retried, skipped, ...
        return f"{r.kind} of a {'cancelled' if forward else 'suspended'} order: not an operator's"
    if s.suspended and r.kind in ("completed", "undone") and same_step:
        new = _plain(s, r, design)
        if isinstance(new, str) or new.ps in design.terminal:
            return None  # as without the suspend (a cancelled order's undo ends Cancelled)
        if new.unrecorded_claim:  # the next step waits, unclaimed
            held = replace(new, ps=PENDING, attempt=s.attempt, unrecorded_claim=False)
            return replace(held, claimed=s.claimed, cancelled=s.cancelled, suspended=True)
        return replace(new, cancelled=s.cancelled, suspended=True)
    return None


def _tried_before(s: _State, r: _Row) -> bool:
    """An attempt of the step (in its direction) was claimed before the one answering."""
    return bool(s.failures) or any(
        step == s.step and mode == s.mode and attempt < r.attempt
        for step, mode, attempt in s.claimed
    )


def _undo_from(s: _State, index: int, design: Design, r: _Row) -> _State:
    first = design.next_undo(index) if index >= 0 else None
    if first is None:
        return _State(CANCELLED, s.step, s.mode, s.attempt)
    return _State(PENDING, first, "undo", s.attempt, claimed=s.claimed, cancelled=True,
                  suspended=s.suspended)  # fmt: skip


def _plain(s: _State | None, r: _Row, design: Design) -> _State | str:
    if r.kind == "submitted":
        if s is not None or r.attempt != 0:
            return "a second submission, or one not at attempt 0"
        return _State(PENDING, 0, "do", 0)
    if s is None:
        return "a transition before the order was submitted"
    here = design.step_name(s.step)
    same_step = r.step == here and r.mode == s.mode
    running = PROCESSING if s.mode == "do" else COMPENSATING
    if r.kind == "claimed":
        if s.ps == running and s.unrecorded_claim and r.attempt == s.attempt and same_step:
            return replace(s, unrecorded_claim=False).with_claim(r.attempt)  # its record
        if s.ps != PENDING or r.attempt != s.attempt + 1 or not same_step:
            return "claim of an order that is not Pending at that step, or not attempt+1"
        claimed = _State(running, s.step, s.mode, r.attempt, s.failures, claimed=s.claimed)
        return claimed.with_claim(r.attempt)
    if r.kind == "deferred":  # no endpoint had room: Pending again, no failure counted
        claimed_now = s.ps == PENDING and r.attempt == s.attempt + 1
        answered = s.ps == running and r.attempt == s.attempt
        if not same_step or not (claimed_now or answered):
            return "deferral of a step that was neither being claimed nor running"
        return _State(PENDING, s.step, s.mode, r.attempt, s.failures, claimed=s.claimed)
    if r.kind in REPLY_KINDS:
        return _reply(s, r, design, same_step=same_step, running=running)
    if r.kind in ("waiting", "resumed"):
        return _wait(s, r, same_step=same_step, running=running)
    if r.kind.startswith("expired_"):
        if s.ps not in (PENDING, running) or r.attempt != s.attempt or not same_step:
            return "expiry of a record that is not live at that attempt and step"
        if s.waiting:
            return "expiry of an order waiting for its workflow version (it resumes instead)"
        if spared := _UNCOUNTED.search(r.detail):
            n, limit = int(spared.group(1)), int(spared.group(2))
            if r.kind != "expired_retry" or not 1 <= n <= limit:
                return f"{r.kind} not counted ({n} of {limit}): only a retry, within its limit"
            return _State(PENDING, s.step, s.mode, s.attempt, s.failures, claimed=s.claimed)
        match = _FAILURE.search(r.detail)
        failures = int(match.group(1)) if match else s.failures + 1
        if failures != s.failures + 1:
            return f"expiry counted failure {failures}, expected {s.failures + 1}"
        at_threshold = failures >= design.threshold(s.step)
        policy = design.policy(s.step) if s.mode == "do" else "error"
        compensate = policy == "compensate"
        if r.kind == "expired_retry" and not at_threshold:
            return _State(PENDING, s.step, s.mode, s.attempt, failures, claimed=s.claimed)
        if r.kind in ("expired_compensate", "expired_compensated") and at_threshold and compensate:
            first = design.next_undo(s.step)
            if first is None and r.kind == "expired_compensated":
                return _State(COMPENSATED, s.step, s.mode, s.attempt)
            if first is not None and r.kind == "expired_compensate":
                return _State(PENDING, first, "undo", s.attempt, claimed=s.claimed)
        if r.kind == "expired_skipped" and at_threshold and policy == "continue":
            return _skipped(s, design)
        if r.kind == "expired_error" and at_threshold and policy == "error":
            return _State(ERROR, s.step, s.mode, s.attempt, failures, claimed=s.claimed)
        return f"{r.kind} does not follow from failure {failures} in mode {s.mode}"
    if r.kind == "input_failed":  # the app's builder raised: Error instead of the claim
        claiming = s.ps == PENDING and r.attempt == s.attempt + 1
        replied = s.ps == PROCESSING and s.unrecorded_claim and r.attempt == s.attempt
        if s.mode != "do" or not same_step or not (claiming or replied):
            return "input failure of a step that was not being claimed"
        # The Error keeps the attempt the claim took: a cancel undoes from this step.
        failed = _State(ERROR, s.step, "do", r.attempt, s.failures, claimed=s.claimed)
        return failed.with_claim(r.attempt)
    if r.kind == "alert_claimed":
        if s.ps != ERROR or r.attempt != s.attempt:
            return "alert claimed for an order not in Error at that attempt"
        return s
    if r.kind == "resubmitted":
        if s.ps != ERROR or r.attempt != s.attempt or not same_step:
            return "resubmit of an order not in Error"
        return _State(PENDING, s.step, s.mode, s.attempt, claimed=s.claimed)
    if r.kind == "closed":  # an operator settled it by hand
        if s.ps != ERROR or r.attempt != s.attempt:
            return "close of an order not in Error"
        return _State(CLOSED, s.step, s.mode, s.attempt, claimed=s.claimed)
    return f"unknown history kind {r.kind!r}"


def _wait(s: _State, r: _Row, *, same_step: bool, running: str) -> _State | str:
    """A host without the order's workflow version keeps it waiting; a host that has it
    resumes it, with the expiry the wait held back (the same transaction). Neither moves the
    order: the expiry does."""
    if s.ps not in (PENDING, running) or r.attempt != s.attempt or not same_step:
        return f"{r.kind} of an order that is not live at that attempt and step"
    if r.kind == "waiting":
        return replace(s, waiting=True)
    if not s.waiting:
        return "resume of an order that was not waiting"
    return replace(s, waiting=False)


def _reply(s: _State, r: _Row, design: Design, *, same_step: bool, running: str) -> _State | str:
    """The reply rule: an ok (completed, undone) of any attempt claimed for the step and mode
    the order still waits on (running, or Pending for a retry) applies; a refusal only for the
    attempt that is running."""
    current = s.ps == running and r.attempt == s.attempt and same_step
    if r.kind == "refused" and not current:
        return "refusal applied for an attempt that is not the one running"
    if s.ps not in (PENDING, running) or not same_step:
        return "reply applied to an order that no longer waits on that step and mode"
    if (s.step, s.mode, r.attempt) not in s.claimed:
        return f"reply for attempt {r.attempt}, which was never claimed for that step and mode"
    last = len(design.steps) - 1
    claims = s.claimed
    if r.kind == "completed" and s.mode == "do":
        if s.step == last:
            return _State(PROCESSED, s.step, "do", s.attempt)
        return _State(PROCESSING, s.step + 1, "do", s.attempt + 1, unrecorded_claim=True,
                      claimed=claims).with_claim(s.attempt + 1)  # fmt: skip
    if r.kind == "undone" and s.mode == "undo":
        following = design.next_undo(s.step - 1)
        if following is None:
            return _State(COMPENSATED, s.step, "undo", s.attempt)
        return _State(COMPENSATING, following, "undo", s.attempt + 1, unrecorded_claim=True,
                      claimed=claims).with_claim(s.attempt + 1)  # fmt: skip
    if r.kind == "refused":
        policy = design.policy(s.step) if s.mode == "do" else "error"
        if policy == "continue":
            return _skipped(s, design)
        if policy == "error":
            return _State(ERROR, s.step, s.mode, s.attempt, s.failures, claimed=claims)
        # The refusing attempt applied nothing; an earlier one claimed for the step may have.
        first = design.next_undo(s.step if _tried_before(s, r) else s.step - 1)
        if first is None:
            return _State(COMPENSATED, s.step, s.mode, s.attempt)
        return _State(PENDING, first, "undo", s.attempt, claimed=claims)
    return f"{r.kind} in mode {s.mode}"


def _skipped(s: _State, design: Design) -> _State:
    """A step that may be skipped failed for good: Pending at the next step, or Processed."""
    if s.step == len(design.steps) - 1:
        return _State(PROCESSED, s.step, "do", s.attempt)
    return _State(PENDING, s.step + 1, "do", s.attempt, claimed=s.claimed)


_SEARCH_BUDGET = 20_000


@dataclass
class _Search:
    """The deepest point a search for a legal order reached, if it found none."""

    path: list[tuple[_Row, _State]] = field(default_factory=list)
    stuck: list[_Row] = field(default_factory=list)
    budget: int = _SEARCH_BUDGET


def _legal_order(
    s: _State | None, remaining: list[_Row], design: Design, path: list[tuple[_Row, _State]],
    deepest: _Search, end: tuple[str, int, int, str] | None = None,
) -> list[tuple[_Row, _State]] | None:  # fmt: skip
    """A legal order of ``remaining`` after ``s`` that ends in ``end`` (the state row's
    ProcessState, Attempt, StepIndex, Mode; None: any end): transactions in the order they
    committed; rows committed within TRANSACTION_SPREAD of each other (the service stamps the
    rows of one transaction a few microseconds apart) in any legal order, the claim a reply
    made last by preference, backtracking when a choice dead-ends."""
    if not remaining:
        return path if end is None or s is None or _end_of(s) == end else None
    deepest.budget -= 1
    first = min(r.committed for r in remaining)
    candidates = [r for r in remaining if r.committed <= first + TRANSACTION_SPREAD]
    for row in candidates:
        after = _apply(s, row, design)
        if not isinstance(after, _State):
            continue
        rest = [r for r in remaining if r is not row]
        found = _legal_order(after, rest, design, [*path, (row, after)], deepest, end)
        if found is not None:
            return found
        if deepest.budget <= 0:
            break
    if len(path) > len(deepest.path) or not deepest.stuck:
        deepest.path, deepest.stuck = path, candidates
    return None


def _end_of(s: _State) -> tuple[str, int, int, str]:
    return (s.ps, s.attempt, s.step, s.mode)


def _replay(
    order_id: str, state: Mapping[str, Any], history: list[_Row], design: Design
) -> tuple[list[_Episode], list[Violation], bool]:
    """Find a legal order for the rows and walk it through the state machine; report the first
    row that no legal order explains. The flag: whether the whole history was explained."""
    rows = [r for r in history if r.kind != "reply_dropped"]
    end = (
        str(state.get("ProcessState")),
        int(state.get("Attempt", -1)),
        int(state.get("StepIndex", -1)),
        "undo" if state.get("Mode") == "undo" else "do",
    )
    deepest = _Search()
    found = _legal_order(None, rows, design, [], deepest, end)
    if found is None:  # no legal order ends in the state row: say where the history goes wrong
        deepest = _Search()
        found = _legal_order(None, rows, design, [], deepest)
    path = found if found is not None else deepest.path
    s: _State | None = None
    trail: list[str] = []
    episodes: list[_Episode] = []
    lease = design.alert_lease_seconds - 2 * design.clock_skew_seconds
    violations: list[Violation] = []
    for row, after in path:
        trail.append(row.show())
        if after.ps == ERROR and (s is None or s.ps != ERROR):
            episodes.append(_Episode(after.attempt, row.at, row.key))
        elif row.kind == "alert_claimed" and episodes:
            episode = episodes[-1]
            since = max([episode.at, *episode.claims])
            if row.at - since < lease:
                violations.append(
                    Violation(
                        "error_alerts",
                        order_id,
                        f"alert re-claimed {row.at - since:.1f}s after the previous claim; the "
                        f"lease is {design.alert_lease_seconds:g}s",
                        {"trail": list(trail)},
                    )
                )
            episode.claims.append(row.at)
        elif row.kind == "resubmitted" and episodes:
            episodes[-1].ended_by = row.key
        s = after
    if found is None:
        candidates = deepest.stuck
        reasons = [f"{r.show()}: {_why(s, r, design)}" for r in candidates]
        # A reply row nothing can explain is a reply applied although it was not current.
        at = next((i for i, r in enumerate(candidates) if r.kind in REPLY_KINDS), 0)
        stale = bool(candidates) and candidates[at].kind in REPLY_KINDS
        violations.append(
            Violation(
                "stale_reply_applied" if stale else "illegal_transition",
                order_id,
                reasons[at] if reasons else "no legal order of the history",
                {"state_before": _show(s), "trail": trail, "rejected": reasons},
            )
        )
        return episodes, violations, False
    if s is None:
        violations.append(
            Violation("illegal_transition", order_id, "a state row without any history", {})
        )
        return episodes, violations, False
    expected = (s.ps, s.attempt, s.step, s.mode)
    actual = (
        str(state.get("ProcessState")),
        int(state.get("Attempt", -1)),
        int(state.get("StepIndex", -1)),
        "undo" if state.get("Mode") == "undo" else "do",
    )
    if expected != actual:
        violations.append(
            Violation(
                "illegal_transition",
                order_id,
                f"history ends in {expected} but the state row is {actual}",
                {"trail": trail},
            )
        )
        return episodes, violations, False
    return episodes, violations, True


def _why(s: _State | None, row: _Row, design: Design) -> str:
    after = _apply(s, row, design)
    return after if isinstance(after, str) else "legal here, but no legal order follows"


def _show(s: _State | None) -> str:
    if s is None:
        return "-"
    return f"{s.ps} step {s.step} {s.mode} attempt {s.attempt} failures {s.failures}"


def _ledger(
    evidence: Evidence, by_order: Mapping[str, Mapping[str, Mapping[str, Any]]], design: Design
) -> list[Violation]:
    effects = evidence.ledger.get("effects") or []
    entries = [e for e in effects if isinstance(e, Mapping)]
    dos: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    undone: Counter[tuple[str, str, str]] = Counter()
    for entry in entries:
        order_id = str(entry.get("order_id"))
        if entry.get("kind", "do") == "do":
            dos[order_id].append(entry)
        elif entry.get("outcome") == "undone":
            undone[(order_id, str(entry.get("service")), str(entry.get("original_key")))] += 1
    found = []
    for order_id, applied in dos.items():
        per_action = Counter((str(e.get("service")), str(e.get("action"))) for e in applied)
        for (service, action), count in per_action.items():
            if count > 1:
                keys = [
                    e.get("idempotency_key")
                    for e in applied
                    if (e.get("service"), e.get("action")) == (service, action)
                ]
                found.append(
                    Violation(
                        "effect_applied_twice",
                        order_id,
                        f"{service}.{action} applied {count} times",
                        {"keys": keys},
                    )
                )
    for (order_id, service, key), count in undone.items():
        if count > 1:
            found.append(
                Violation(
                    "effect_applied_twice",
                    order_id,
                    f"{service} effect {key} undone {count} times",
                    {"original_key": key},
                )
            )
    found += _unexpected(evidence, dos, by_order, design)
    found += _orphaned(dos, by_order, design)
    for order_id in evidence.submitted:
        state = by_order.get(order_id, {}).get(design.state_row)
        flow = None if state is None else design.for_state(state)
        if state is None or flow is None:
            continue
        ps = state.get("ProcessState")
        applied = dos.get(order_id, [])
        if ps == PROCESSED:
            completed = _completed_steps(by_order.get(order_id, {}), design)
            for index, step in enumerate(flow.steps):
                mine = [
                    e
                    for e in applied
                    if (e.get("service"), e.get("action")) == (step.agent, step.action)
                ]
                if not mine and flow.policy(index) == "continue" and step.name not in completed:
                    continue  # skipped
                if not mine:
                    found.append(
                        Violation(
                            "processed_effect_missing",
                            order_id,
                            f"Processed, but {step.agent}.{step.action} was never applied",
                            {"applied": [_label(e) for e in applied]},
                        )
                    )
                elif any(e.get("undone_at") for e in mine):
                    found.append(
                        Violation(
                            "processed_effect_missing",
                            order_id,
                            f"Processed, but {step.agent}.{step.action} was undone",
                            {"undone_by": [e.get("undone_by") for e in mine]},
                        )
                    )
        elif ps in UNDONE:  # a step declared with no undo action needs none
            left = [_label(e) for e in applied if not e.get("undone_at") and _has_undo(flow, e)]
            if left:
                found.append(
                    Violation(
                        "compensation_incomplete",
                        order_id,
                        f"{ps}, but {', '.join(left)} still applied",
                        {"applied_not_undone": left},
                    )
                )
    return found


def _unexpected(
    evidence: Evidence,
    dos: Mapping[str, list[Mapping[str, Any]]],
    by_order: Mapping[str, Mapping[str, Mapping[str, Any]]],
    design: Design,
) -> list[Violation]:
    found = []
    submitted = set(evidence.submitted)
    for order_id, applied in dos.items():
        state = by_order.get(order_id, {}).get(design.state_row)
        flow = None if state is None else design.for_state(state)
        if order_id not in submitted:
            labels = {"applied": [_label(e) for e in applied]}
            why = "effect for an order never submitted"
            found.append(Violation("unexpected_effect", order_id, why, labels))
            continue
        if state is None or flow is None:  # lost, parked or of no known workflow: said already
            continue
        for entry in applied:
            wrong = _why_unexpected(order_id, entry, state, flow)
            if wrong is not None:
                found.append(Violation("unexpected_effect", order_id, f"{_label(entry)}: {wrong}",
                                       {"StepIndex": state.get("StepIndex"),
                                        "Mode": state.get("Mode")}))  # fmt: skip
    return found


def _why_unexpected(
    order_id: str, entry: Mapping[str, Any], state: Mapping[str, Any], flow: Design
) -> str | None:
    """Why no legal run of the order's workflow version makes this effect; None if one may."""
    index = flow.step_index(str(entry.get("service")), str(entry.get("action")))
    reached = int(state.get("StepIndex", -1))
    ahead = state.get("Mode") != "undo" and state.get("ProcessState") != PROCESSED
    if index is None:
        return "an action no step of its workflow calls"
    if ahead and index > reached:
        return f"step {flow.steps[index].name}, which the order never reached"
    if entry.get("idempotency_key") != flow.do_key_of(order_id, state, flow.steps[index].name):
        return "a key that is not its step's"
    return None


def _orphaned(
    dos: Mapping[str, list[Mapping[str, Any]]],
    by_order: Mapping[str, Mapping[str, Mapping[str, Any]]],
    design: Design,
) -> list[Violation]:
    """Effects left applied that the order's record does not account for: not the effect of a
    completed step (a ``step:`` row of the step of its bound version that calls that action),
    not undone, and not the step an Error (or Closed) order stopped on, which an operator
    owns. Compensated orders (``compensation_incomplete``), orders not terminal
    (``stuck_order``) and effects no legal run makes (``unexpected_effect``) are said
    elsewhere."""
    found = []
    for order_id, applied in dos.items():
        rows = by_order.get(order_id, {})
        state = rows.get(design.state_row)
        flow = None if state is None else design.for_state(state)
        if state is None or flow is None:
            continue
        ps = state.get("ProcessState")
        if ps not in design.terminal or ps in UNDONE:
            continue
        completed = _completed_steps(rows, design)
        stopped_on = int(state.get("StepIndex", -1)) if ps in (ERROR, CLOSED, TERMINATED) else None
        for entry in applied:
            if entry.get("undone_at") or _why_unexpected(order_id, entry, state, flow):
                continue
            index = flow.step_index(str(entry.get("service")), str(entry.get("action")))
            if index is None or index == stopped_on or flow.steps[index].name in completed:
                continue
            if flow.policy(index) == "continue":  # skipped: an attempt may have been applied
                continue
            if state.get("Mode") == "undo" and not _has_undo(flow, entry):
                continue  # passed by the undo, as in an undone order (compensation_incomplete)
            why = f"{_label(entry)}: applied, but step {flow.steps[index].name} never completed"
            evidence = {"completed_steps": sorted(completed), "ProcessState": ps}
            found.append(Violation("orphaned_effect", order_id, why, evidence))
    return found


def _completed_steps(rows: Mapping[str, Mapping[str, Any]], design: Design) -> set[str]:
    """The names of the order's steps that completed (its ``step:`` rows)."""
    return {
        str(row.get("Name") or key.rsplit(":", 1)[-1])
        for key, row in rows.items()
        if key.startswith(design.step_row_prefix)
    }


def _has_undo(flow: Any, entry: Mapping[str, Any]) -> bool:
    index = flow.step_index(str(entry.get("service")), str(entry.get("action")))
    return index is None or flow.steps[index].undo is not None


def _label(entry: Mapping[str, Any]) -> str:
    return f"{entry.get('service')}.{entry.get('action')}[{entry.get('idempotency_key')}]"


def _alerts(
    raw: Iterable[str],
    episodes: Mapping[str, list[_Episode]],
    design: Design,
    unexplained: set[str],
) -> tuple[list[Violation], int]:
    """Alerts against the Error episodes of each order whose history was explained (for the
    others the replay's violation stands; their episodes are not known)."""
    found: list[Violation] = []
    copies: dict[str, Counter[str]] = defaultdict(Counter)
    count = 0
    for body in raw:
        count += 1
        try:
            document = json.loads(body)
            alert_id, order_id = str(document["alert_id"]), str(document["order_id"])
        except (ValueError, KeyError, TypeError):
            found.append(Violation("alert_without_error", None, "unreadable alert", {"body": body}))
            continue
        copies[order_id][alert_id] += 1
    for order_id, ids in copies.items():
        if order_id in unexplained:
            continue
        mine = episodes.get(order_id, [])
        matched: dict[int, Counter[str]] = defaultdict(Counter)
        for alert_id, n in ids.items():
            index = _episode_of(alert_id, mine, design)
            if index is None:
                found.append(
                    Violation(
                        "alert_without_error",
                        order_id,
                        f"alert {alert_id} matches no Error of this order",
                        {"copies": n, "error_episodes": [(e.attempt, e.at) for e in mine]},
                    )
                )
            else:
                matched[index][alert_id] += n
        for index, got in matched.items():
            episode = mine[index]
            allowed = 1 + len(episode.claims)
            if len(got) > 1:
                found.append(
                    Violation(
                        "error_alerts",
                        order_id,
                        f"{len(got)} distinct alert ids for one Error",
                        {"alert_ids": dict(got), "error_row": episode.row},
                    )
                )
            if sum(got.values()) > allowed:
                found.append(
                    Violation(
                        "error_alerts",
                        order_id,
                        f"{sum(got.values())} copies of the alert; claims allow {allowed}",
                        {
                            "alert_ids": dict(got),
                            "alert_claimed": len(episode.claims),
                            "error_row": episode.row,
                        },
                    )
                )
    for order_id, mine in episodes.items():
        ids = copies.get(order_id, Counter())
        for index, episode in enumerate(mine):
            if not any(_episode_of(a, mine, design) == index for a in ids):
                found.append(
                    Violation(
                        "error_alerts",
                        order_id,
                        f"Error at attempt {episode.attempt} was never alerted",
                        {"error_row": episode.row, "ended_by": episode.ended_by},
                    )
                )
    return found, count


def _episode_of(alert_id: str, episodes: list[_Episode], design: Design) -> int | None:
    match = design.alert_id.match(alert_id)
    if match is None:
        return None
    attempt, stamp = int(match.group("attempt")), float(match.group("stamp"))
    same = [i for i, e in enumerate(episodes) if e.attempt == attempt]
    exact = [i for i in same if abs(episodes[i].at - stamp) < 0.002]
    if exact:
        return exact[0]
    return same[0] if len(same) == 1 else None


def _poison(poison: Mapping[str, list[str]]) -> list[Violation]:
    found = []
    for queue, bodies in sorted(poison.items()):
        for body in bodies:
            order_id = None
            try:
                document = json.loads(body)
                order_id = document.get("order_id") if isinstance(document, dict) else None
            except ValueError:
                pass
            found.append(
                Violation(
                    "poisoned_message",
                    order_id if isinstance(order_id, str) else None,
                    f"message in {queue}",
                    {"queue": queue, "body": body[:500]},
                )
            )
    return found


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)

"""A Hypothesis state machine over the whole pattern: submitters, several Schedulers, two
Supervisors, the agents, a remote service with an idempotency ledger and the operator, joined
by an in-memory bus whose messages are delivered, dropped, duplicated and reordered at will,
under a fake clock that each role reads with an error of its own (its estimate of the store's
time), either direction, within the clock-skew allowance or beyond it. The invariants of
docs/architecture.md are checked after every step:

- every order's record is consistent (deadline iff live, failures bounded, attempt monotone,
  every live order indexed; while every role's error is within the allowance, never due
  after its deadline plus the allowance);
- I3, the reply rule: a reply applied is for the step and direction the order waits on, for
  an attempt claimed; a refusal only for the running attempt; each attempt's reply at most
  once;
- I4: a remote effect is applied at most once per step, and never after its undo;
- one alert id per Error episode, never more copies than claims on it;
- Processed orders applied every step once, Compensated ones undid every effect;
and, after draining with supervision, I1: nothing is lost, every Error alerted.

The store is a class attribute, so tests/integration/test_stateful_azurite.py runs this same
machine over the real Table store on Azurite.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sas.domain.errors import IllegalTransition, PermanentRemoteError, TransientRemoteError
from sas.domain.messages import (
    Message,
    OperatorAlert,
    OrderSubmitted,
    ScheduleRequest,
    StepReply,
    StepRequest,
)
from sas.domain.model import (
    AlertRecord,
    AuditEntry,
    AuditQuery,
    HistoryEntry,
    LiveMarker,
    MissingDefinition,
    OrderRecord,
    OrderState,
    ProcessState,
    StepRecord,
    StepStart,
    Versioned,
    WaitingSubmission,
)
from sas.domain.parked import ParkedMessage
from sas.domain.recovery import RetryPolicy
from sas.domain.wire import alert_message_id
from sas.services.context import ALERT_LEASE
from sas.services.operator import Operator
from sas.services.ports import StateStore
from sas.testing import (
    Call,
    FakeClock,
    InMemoryQueues,
    InMemoryRemote,
    InMemoryStore,
    Instance,
    Outcome,
    Sent,
    fault,
    instance,
    ok,
    refuse,
    too_slow,
)
from tests.harness import BUDGET, ROUTES
from tests.workflows import REGISTRY, SHOP, STRICT, Basket, Line

pytestmark = [pytest.mark.unit, pytest.mark.fast]

StoreFactory = Callable[[], tuple[StateStore, Callable[[], None]]]

WORKFLOW_OF = {"o1": SHOP, "o2": SHOP, "o3": STRICT}
"""STRICT stops in Error for an operator where SHOP compensates."""
ORDER_IDS = tuple(WORKFLOW_OF)
WORK_QUEUES = ("orders", "scheduler", *ROUTES.agents.values(), "replies")
"""Queues someone consumes, in pipeline order (alerts and status queues are only recorded)."""
AGENT_OF_QUEUE = {queue: agent for agent, queue in ROUTES.agents.items()}
CRASHABLE = ("scheduler", "replies", "alerts", "status-a", *ROUTES.agents.values())
"""Queues whose next send can fail (the sender crashes): everything but the test's own sends."""
SCHEDULERS = ("scheduler-1", "scheduler-2", "scheduler-3")
MAX_FAILURES = 2
"""Low, so that runs reach the threshold (compensation, Error) often."""
REPLY_KINDS = frozenset({"completed", "undone", "refused"})
LIVE_STATES = frozenset({ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.COMPENSATING})
DO_ACTIONS = frozenset((s.agent, s.action) for s in SHOP.steps)
REMOTE_ACTIONS = sorted(DO_ACTIONS | {(s.agent, s.undo) for s in SHOP.steps if s.undo is not None})
TRANSIT_DELAYS = (timedelta(seconds=BUDGET + 5), timedelta(seconds=3 * BUDGET))
"""How long a message held up in transit takes: past the deadline it answers, or long enough
for its step to be expired and claimed again meanwhile."""
ALLOWANCE = timedelta(seconds=2)
"""The clock-skew allowance of the model's Supervisors."""
WITHIN = st.sampled_from((0.0, -0.9, 0.9, -0.45, 0.45))
"""Seconds a role's clock reads off the true time within half the allowance (so any two
differ by less than it)."""
BEYOND = st.sampled_from((-6.0, 6.0, -30.0, 30.0))
"""Far beyond it: a host whose estimate of the store's time is wrong."""
ROLES = ("submission", *SCHEDULERS, "supervisor-2", "operator", *ROUTES.agents)
"""Every role with a clock of its own (the first Supervisor reads the first Scheduler's)."""
REDELIVERY_DELAY = timedelta(seconds=5)
"""A consumer that raised: the message is visible again this much later."""


MOVES = st.tuples(
    st.sampled_from(
        ("deliver",) * 6 + ("twice", "copy", "drop", "replay", "late", "delay", "delay")
    ),
    st.integers(0, 7),
    st.integers(0, 7),
    st.integers(0, len(SCHEDULERS) - 1),
)
"""One message taken off a queue: (what happens to it, which busy queue, which due message,
which Scheduler)."""
FAULTS = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(ORDER_IDS), st.sampled_from("aab"), st.just(1)),
    st.tuples(st.just("crash"), st.sampled_from(CRASHABLE), st.just(""), st.just(1)),
    st.tuples(
        st.just("remote"),
        st.sampled_from(REMOTE_ACTIONS),
        st.sampled_from(("ok", "slow", "transient", "permanent", "permanent")),
        st.integers(1, 2),
    ),
)


def in_memory_store() -> tuple[StateStore, Callable[[], None]]:
    return InMemoryStore(), lambda: None


def order_message(order_id: str, variant: str) -> OrderSubmitted:
    """Variant "a" and "b" of an order: same id, different orders (a conflicting reuse)."""
    return OrderSubmitted(
        order_id=order_id,
        workflow=WORKFLOW_OF[order_id].name,
        details=Basket(
            customer_id="c1",
            currency="EUR",
            address="1 Main St" if variant == "a" else "2 Other St",
            lines=[Line(sku="s1", quantity=1, unit_price_cents=100)],
        ).model_dump(mode="json"),
        reply_to="status-a" if variant == "a" else None,
    )


# --- a store that audits every write it forwards ----------------------------------------


class AuditingStore:
    """Forwards to the real store; keeps every history row written and checks, at the moment
    a reply's transition is persisted, that it answers the attempt running then (I3)."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.history: list[HistoryEntry] = []
        self.violations: list[str] = []
        self.claimed: set[tuple[str, str | None, str, int]] = set()
        """(order, step, mode, attempt) of every claim written."""

    def create_order(
        self,
        order: OrderRecord,
        state: OrderState,
        history: HistoryEntry | Sequence[HistoryEntry] | None = None,
    ) -> str:
        etag = self.inner.create_order(order, state, history)
        entries = [history] if isinstance(history, HistoryEntry) else list(history or ())
        self.history.extend(entries)
        self.claimed.update(
            (e.order_id, e.step, e.mode, e.attempt) for e in entries if e.kind == "claimed"
        )
        return etag

    def get_order(self, order_id: str) -> OrderRecord | None:
        return self.inner.get_order(order_id)

    def get_state(self, order_id: str) -> Versioned[OrderState] | None:
        return self.inner.get_state(order_id)

    def update_state(
        self,
        state: OrderState,
        etag: str,
        history: HistoryEntry | Sequence[HistoryEntry] | None = None,
        *,
        step: StepRecord | None = None,
    ) -> str:
        before = self.inner.get_state(state.order_id)
        new_etag = self.inner.update_state(state, etag, history, step=step)
        # The write succeeded, so ``before`` (read just now, nothing ran in between) is what
        # it replaced, and it must be what the writer read: one owner per version (I2).
        assert before is not None
        if before.etag != etag:
            self.violations.append(f"I2: a write with a stale ETag succeeded: {state}")
        previous = before.value
        if state.attempt < previous.attempt:
            self.violations.append(f"{state.order_id}: attempt {previous.attempt} -> {state}")
        entries = [history] if isinstance(history, HistoryEntry) else list(history or ())
        for entry in entries:
            self.history.append(entry)
            if entry.kind in REPLY_KINDS:
                why = self._refused_by_the_reply_rule(previous, entry)
                if not (previous.is_running and previous.attempt == entry.attempt):
                    event(f"{entry.kind} of an attempt no longer running applied")
                if why:
                    self.violations.append(
                        f"I3: {entry.kind} for attempt {entry.attempt} {entry.step} "
                        f"({entry.mode}) applied to {previous}: {why}"
                    )
            elif entry.kind == "claimed":
                self.claimed.add((entry.order_id, entry.step, entry.mode, entry.attempt))
        return new_etag

    def _refused_by_the_reply_rule(self, previous: OrderState, entry: HistoryEntry) -> str:
        """Why the reply rule refuses ``entry`` on ``previous`` ("" if it applies), restated
        here apart from the product's ``fence``."""
        waiting_on = REGISTRY.named(previous.workflow).step(previous.step_index).name
        if previous.is_terminal or (waiting_on, previous.mode) != (entry.step, entry.mode):
            return "the order does not wait on that step and direction"
        if (entry.order_id, entry.step, entry.mode, entry.attempt) not in self.claimed:
            return "no such attempt was claimed for that step and direction"
        running = previous.is_running and previous.attempt == entry.attempt
        if entry.kind == "refused" and not running:
            return "a refusal of an attempt that is not running"
        return ""

    def add_history(self, entry: HistoryEntry) -> None:
        if entry.kind == "reply_dropped" and (entry.detail or "").startswith("ok "):
            # The other half of the rule: an ok it applies is never dropped (nothing ran since
            # the Scheduler read the state it decided on).
            found = self.inner.get_state(entry.order_id)
            applied = replace(entry, kind="undone" if entry.mode == "undo" else "completed")
            if found is not None and not self._refused_by_the_reply_rule(found.value, applied):
                self.violations.append(f"I3: an ok the reply rule applies was dropped: {entry}")
        self.inner.add_history(entry)
        self.history.append(entry)

    def get_history(self, order_id: str) -> list[HistoryEntry]:
        return self.inner.get_history(order_id)

    def touch_live(self, order_id: str, at: datetime, due_at: datetime, workflow: str = "") -> str:
        return self.inner.touch_live(order_id, at, due_at, workflow)

    def count_live(self, workflow: str, up_to: int) -> int:
        return self.inner.count_live(workflow, up_to)

    def count_held(self, workflow: str, up_to: int) -> int:
        return self.inner.count_held(workflow, up_to)

    def finish_live(self, order_id: str, at: datetime) -> None:
        found = self.inner.get_state(order_id)
        finished_well = (ProcessState.PROCESSED, ProcessState.COMPENSATED)
        if found is None or found.value.process_state not in finished_well:
            self.violations.append(f"a marker finished for an order not finished well: {found}")
        self.inner.finish_live(order_id, at)

    def wait_for_room(self, row_key: str, order_id: str, body: bytes) -> None:
        self.inner.wait_for_room(row_key, order_id, body)

    def create_live_all(
        self, markers: Sequence[tuple[str, datetime, datetime, str]]
    ) -> dict[str, LiveMarker]:
        return self.inner.create_live_all(markers)

    def drop_waiting_all(self, rows: Sequence[WaitingSubmission]) -> int:
        return self.inner.drop_waiting_all(rows)

    def list_waiting(self, workflow: str, up_to: int) -> list[WaitingSubmission]:
        return self.inner.list_waiting(workflow, up_to)

    def list_stranded(self, known: tuple[str, ...], up_to: int) -> list[WaitingSubmission]:
        return self.inner.list_stranded(known, up_to)

    def drop_waiting(self, waiting: WaitingSubmission) -> bool:
        return self.inner.drop_waiting(waiting)

    def list_live(self) -> list[LiveMarker]:
        return self.inner.list_live()

    def list_due(self, at: datetime) -> list[LiveMarker]:
        return self.inner.list_due(at)

    def rearm_live(
        self, rearms: Sequence[tuple[LiveMarker, datetime]], drops: Sequence[LiveMarker] = ()
    ) -> int:
        return self.inner.rearm_live(rearms, drops)

    def drop_live(self, marker: LiveMarker) -> bool:
        return self.inner.drop_live(marker)

    def query_states(self, **filters: Any) -> Iterator[Versioned[OrderState]]:
        return self.inner.query_states(**filters)

    def count_states(self) -> dict[ProcessState, int]:
        return self.inner.count_states()

    def purge_order(self, state: Versioned[OrderState]) -> bool:
        return self.inner.purge_order(state)

    def get_steps(self, order_id: str) -> list[StepRecord]:
        return self.inner.get_steps(order_id)

    def park_message(self, queue: str, reason: str, body: bytes, at: datetime) -> str:
        return self.inner.park_message(queue, reason, body, at)

    def list_parked(self, limit: int = 100) -> list[ParkedMessage]:
        return self.inner.list_parked(limit)

    def get_parked(self, parked_id: str) -> ParkedMessage | None:
        return self.inner.get_parked(parked_id)

    def drop_parked(self, parked_id: str) -> bool:
        return self.inner.drop_parked(parked_id)

    def append_audit(self, entries: Sequence[AuditEntry]) -> None:
        self.inner.append_audit(entries)

    def record_alert(self, record: AlertRecord) -> None:
        self.inner.record_alert(record)

    def list_alerts(self) -> list[Versioned[AlertRecord]]:
        return self.inner.list_alerts()

    def get_alert(self, alert_id: str) -> Versioned[AlertRecord] | None:
        return self.inner.get_alert(alert_id)

    def update_alert(self, record: AlertRecord, etag: str) -> str:
        return self.inner.update_alert(record, etag)

    def list_audit(self, query: AuditQuery) -> list[AuditEntry]:
        return self.inner.list_audit(query)

    def get_missing(self, key: str) -> MissingDefinition | None:
        return self.inner.get_missing(key)

    def note_missing(self, missing: MissingDefinition) -> None:
        self.inner.note_missing(missing)

    def forget_missing(self, key: str) -> None:
        self.inner.forget_missing(key)

    def record_start(self, start: StepStart) -> StepStart:
        return self.inner.record_start(start)

    def get_start(self, order_id: str, key: str, attempt: int) -> StepStart | None:
        return self.inner.get_start(order_id, key, attempt)


class InterleavingStore(AuditingStore):
    """A Supervisor's view of the store in which, right after its first read of an order,
    another Supervisor runs a whole sweep: two sweeps "at once", the first one now stale."""

    def __init__(self, inner: AuditingStore, meanwhile: Callable[[], object]) -> None:
        super().__init__(inner)
        self._meanwhile: Callable[[], object] | None = meanwhile

    def get_state(self, order_id: str) -> Versioned[OrderState] | None:
        found = self.inner.get_state(order_id)
        meanwhile, self._meanwhile = self._meanwhile, None
        if meanwhile is not None:
            meanwhile()
        return found

    def update_state(
        self,
        state: OrderState,
        etag: str,
        history: HistoryEntry | Sequence[HistoryEntry] | None = None,
        *,
        step: StepRecord | None = None,
    ) -> str:
        return self.inner.update_state(state, etag, history, step=step)  # audited inside

    def add_history(self, entry: HistoryEntry) -> None:
        self.inner.add_history(entry)


# --- the bus and the remote service ----------------------------------------------------------


class CrashingBus(InMemoryQueues):
    """sas.testing's queues, counting the sends that failed (``fail_next_send_to``)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.crashes = 0

    def send(
        self,
        queue: str,
        message: Message,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        try:
            super().send(
                queue,
                message,
                message_id=message_id,
                correlation_id=correlation_id,
                delay_seconds=delay_seconds,
            )
        except ConnectionError:
            self.crashes += 1
            raise

    def due(self, queue: str) -> list[Sent]:
        """The messages of ``queue`` visible now, in due order."""
        return [s for s in self.pending(queue) if s.due <= self.clock.now()]

    def take_one(self, queue: str, sent: Sent) -> None:
        """Take ``sent`` (due) off ``queue``, the queue's other due messages left in order."""
        others = [s for s in self.due(queue) if s != sent]
        self.take(queue)
        for other in others:
            self.put_back(other, timedelta(0))


@dataclass
class ConsistentRemote(InMemoryRemote):
    """sas.testing's remote, made consistent per idempotency key as a real idempotent API is:
    the first final answer for a key (its result, or a permanent refusal) is replayed for
    every later call with that key, whatever is planned for the call (a transient fault
    still comes first). Also notes any do applied after its undo (I4).

    ``plan[(agent, action)]`` is consumed call by call (once empty: ok), each outcome scripted
    on the remote for that one call only, after the rule above."""

    plan: dict[tuple[str, str], list[Outcome]] = field(default_factory=dict)
    refusals: dict[str, PermanentRemoteError] = field(default_factory=dict)
    undo_asked: set[tuple[str, str, str]] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)

    def perform(
        self,
        agent: str,
        action: str,
        *,
        idempotency_key: str,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        key = idempotency_key
        planned = self.plan.get((agent, action))
        outcome = planned.pop(0) if planned else ok()
        if not isinstance(outcome.error, TransientRemoteError):  # that comes before any answer
            refused = self.refusals.get(key)
            if refused is not None:
                self.calls.append(Call(agent, action, key, dict(payload), timeout))
                raise refused
            if (agent, action, key) in self.effects:  # applied: its first result
                outcome = ok() if outcome.error is not None else outcome
            elif outcome.error is None:  # applied now
                if "original_key" in payload:
                    self.undo_asked.add(
                        (agent, payload["original_action"], payload["original_key"])
                    )
                elif (agent, action, key) in self.undo_asked:
                    self.violations.append(f"I4: {(agent, action, key)} applied after its undo")
        self.script(agent, action, outcome)
        try:
            return super().perform(
                agent, action, idempotency_key=key, payload=payload, timeout=timeout
            )
        except PermanentRemoteError as refusal:  # the key's first final answer
            self.refusals[key] = refusal
            raise


def scripted(outcome: str) -> Outcome:
    if outcome == "transient":
        return fault("HTTP 503")
    if outcome == "permanent":
        return refuse("HTTP 422 refused")
    if outcome == "slow":  # applied, answered past the deadline
        return too_slow(60)
    return ok()


@dataclass
class RoleClock:
    """A role's clock: the true time, read with this role's error."""

    true: FakeClock
    error: float = 0.0

    def now(self) -> datetime:
        return self.true.now() + timedelta(seconds=self.error)


# --- the machine ---------------------------------------------------------------------------


class SasMachine(RuleBasedStateMachine):
    store_factory: ClassVar[StoreFactory] = staticmethod(in_memory_store)

    def __init__(self) -> None:
        super().__init__()
        base, self._close = type(self).store_factory()
        self.clock = FakeClock()
        self.clocks = {role: RoleClock(self.clock) for role in ROLES}
        self.bus = CrashingBus(self.clock)
        self.store = AuditingStore(base)
        self.remote = ConsistentRemote(self.clock)
        self.policy = RetryPolicy(
            max_failures=MAX_FAILURES, base_backoff=timedelta(seconds=2), clock_skew=ALLOWANCE
        )
        self.submission = instance(
            self.store, self.bus, ROUTES, self.clocks["submission"], REGISTRY, "submission",
            policy=self.policy,
        )  # fmt: skip
        self.schedulers = [
            self.submission.named(name, clock=self.clocks[name]) for name in SCHEDULERS
        ]
        # The first Supervisor shares the first Scheduler's instance id (and clock), as the
        # `supervise` timer and the queue functions do in one Functions host.
        self.supervisors = [
            self._supervisor(name, self.store) for name in (SCHEDULERS[0], "supervisor-2")
        ]
        self.operator = Operator(
            self.submission.named("operator", clock=self.clocks["operator"]).ctx
        )
        self.agents = {
            name: self.submission.named(name, clock=self.clocks[name]).with_remote(
                self.remote, sleep=self.clock.sleep
            )
            for name in ROUTES.agents
        }
        self.seen: dict[str, OrderState] = {}
        """Each order's state at the last check."""
        self.episodes: dict[str, set[tuple[int, datetime]]] = {}
        """Each order's Error episodes seen: (attempt, finished_at)."""
        self.fingerprints: dict[str, str] = {}
        """The fingerprint of the submission that created each order."""

    def _supervisor(self, name: str, store: StateStore) -> Instance:
        return instance(
            store, self.bus, ROUTES, self.clocks[name], REGISTRY, name, policy=self.policy
        )

    @property
    def clocks_within_the_allowance(self) -> bool:
        """Any two roles' clocks differ by less than the allowance."""
        errors = [c.error for c in self.clocks.values()]
        return max(errors) - min(errors) < ALLOWANCE.total_seconds()

    # --- messages ----------------------------------------------------------------------

    def _busy_queues(self) -> list[str]:
        return [q for q in WORK_QUEUES if self.bus.due(q)]

    def _consume(self, queue: str, sent: Sent, scheduler: int) -> None:
        self.clock.advance(0.001)  # time passes between deliveries
        message = sent.message
        try:
            if isinstance(message, OrderSubmitted):
                self._submit(message)
            elif isinstance(message, ScheduleRequest):
                self.schedulers[scheduler % len(SCHEDULERS)].schedule(message)
            elif isinstance(message, StepReply):
                self.schedulers[scheduler % len(SCHEDULERS)].on_reply(message)
            elif isinstance(message, StepRequest):
                agent = AGENT_OF_QUEUE[queue]
                self.agents[agent].run_step(agent, message)
            else:
                raise AssertionError(f"nobody consumes {type(message).__name__} on {queue}")
        except ConnectionError:
            # The consumer crashed on a send: the function failed, the host redelivers.
            self.bus.put_back(sent, REDELIVERY_DELAY)

    def _submit(self, message: OrderSubmitted) -> None:
        order_id = message.order_id
        try:
            self.submission.submit(message)
        finally:  # the first submission to get in made the order, even if it crashed after
            if order_id not in self.fingerprints and self.store.get_order(order_id) is not None:
                self.fingerprints[order_id] = message.fingerprint()

    # --- rules ---------------------------------------------------------------------------
    # Few rules, each drawing what it does, so that delivery (which makes progress) is drawn
    # often enough for orders to get somewhere within a run.

    @initialize(
        orders=st.lists(st.sampled_from(ORDER_IDS), min_size=1, max_size=3, unique=True),
        errors=st.lists(WITHIN, min_size=len(ROLES), max_size=len(ROLES)),
        off=st.lists(st.tuples(st.sampled_from(ROLES), BEYOND), max_size=2),
    )
    def first_orders(
        self, orders: list[str], errors: list[float], off: list[tuple[str, float]]
    ) -> None:
        """The orders, and each role's clock error: within half the allowance, and for up to
        two roles far beyond it (either direction)."""
        for role, error in [*zip(ROLES, errors, strict=True), *off]:
            self.clocks[role].error = error
        event(f"clocks within the allowance: {self.clocks_within_the_allowance}")
        for order_id in orders:
            self.submit(order_id, "a")

    def submit(self, order_id: str, variant: str) -> None:
        """A submitter posts an order: again (a redelivery) or a different one (a conflict)."""
        message = order_message(order_id, variant)
        self.bus.send("orders", message, message_id=order_id, correlation_id=order_id)

    @precondition(lambda self: bool(self._busy_queues()))
    @rule(moves=st.lists(MOVES, min_size=1, max_size=16))
    def pump(self, moves: list[tuple[str, int, int, int]]) -> None:
        """Messages taken off the queues one by one: any due message of any queue (so out of
        order), delivered once, twice in a row, delivered but left queued (to come again
        later), held up in transit past the deadline, or lost with its crashed consumer; each
        to any of the Schedulers. Or any message (or any reply) ever sent, delivered again now
        (a redelivery long after the fact, as when its first handling outlasted the visibility
        timeout, or a reply that waited in a backlog)."""
        for kind, which, pick, scheduler in moves:
            if kind in ("replay", "late"):  # "late": a reply, after its step may have moved on
                sent = [
                    s
                    for s in self.bus.sent
                    if s.queue in WORK_QUEUES
                    and (kind == "replay" or isinstance(s.message, StepReply))
                ]
                if sent:
                    again = sent[-1 - (which * 8 + pick) % len(sent)]
                    self._consume(again.queue, again, scheduler)
                continue
            busy = self._busy_queues()
            if not busy:
                return
            queue = busy[which % len(busy)]
            due = self.bus.due(queue)
            chosen = due[pick % len(due)]
            if kind != "copy":
                self.bus.take_one(queue, chosen)
            if kind == "delay":  # slow in transit: due after the deadline it answers
                self.bus.put_back(chosen, TRANSIT_DELAYS[scheduler % 2])
            elif kind != "drop":
                for n in range(2 if kind == "twice" else 1):
                    self._consume(queue, chosen, scheduler + n)

    @rule(fault=FAULTS)
    def trouble(self, fault: tuple[str, Any, str, int]) -> None:
        """A submitter posts an order again (a redelivery) or a different one under a taken
        id (a conflict); the next send to a queue crashes its sender; or the next calls of
        one remote action go: ok, slow past the deadline, transient fault, permanent refusal
        (on an undo action: a refused undo)."""
        kind, target, outcome, times = fault
        if kind == "submit":
            self.submit(target, outcome)
        elif kind == "crash":
            self.bus.fail_next_send_to.add(target)
        else:
            self.remote.plan.setdefault(target, []).extend(scripted(outcome) for _ in range(times))

    @rule(
        seconds=st.one_of(
            st.floats(0.1, 5.0), st.floats(0.1, 5.0), st.sampled_from((BUDGET + 1, 61.0, 180.0))
        )
    )
    def wait(self, seconds: float) -> None:
        """Time passes: a little, or past step and pickup deadlines."""
        self.clock.advance(seconds)

    @rule(
        seconds=st.sampled_from((0.0, 0.0, 3.0, BUDGET + 1, 61.0)),
        how=st.sampled_from(("one", "other", "doubled", "interleaved")),
    )
    def supervise(self, seconds: float, how: str) -> None:
        """A timer tick: one Supervisor sweeps, or both at the same instant, one after the
        other or interleaved (the second sweeps entirely between the first's read of an order
        and its write)."""
        self.clock.advance(seconds)
        first, second = self.supervisors
        if how in ("one", "other"):
            self._checked_sweep((first if how == "one" else second).sweep)
        elif how == "doubled":
            self._checked_sweep(first.sweep)
            self._checked_sweep(second.sweep)
        else:
            racing = self._supervisor(
                SCHEDULERS[0],
                InterleavingStore(self.store, lambda: self._checked_sweep(second.sweep)),
            )
            self._checked_sweep(racing.sweep)

    def _checked_sweep(self, sweep: Callable[[], Counter[str]]) -> None:
        crashes = self.bus.crashes
        report = sweep()
        # A sweep swallows any error per order: only the injected crashes may cause one.
        assert report["failed"] <= self.bus.crashes - crashes, report

    @precondition(lambda self: bool(self._seen()))
    @rule(pick=st.integers(0, 7))
    def operator_resubmits(self, pick: int) -> None:
        """An operator resubmits an order: an Error one goes back to Pending, any other is
        refused and left alone."""
        order_id = sorted(self.seen)[pick % len(self.seen)]
        before = self.store.get_state(order_id)
        assert before is not None
        if before.value.process_state is not ProcessState.ERROR or before.value.alert_pending:
            # Not Error, or an Error whose alert is still owed (resubmitting would cancel it).
            with pytest.raises(IllegalTransition):
                self.operator.resubmit(order_id, actor="bob")
            assert self.store.get_state(order_id) == before
            return
        # A crash on the send after the write: the pickup deadline recovers the order.
        with contextlib.suppress(ConnectionError):
            self.operator.resubmit(order_id, actor="alice")

    def _due_by(self, state: OrderState) -> datetime:
        """The latest a live order's marker may be due: its deadline; past it, while its step
        only waits (recovery.queue_wait), the next look, within the shortest budget. The
        queue-wait limit ends the waiting (the model's last rules settle every order)."""
        assert state.complete_by is not None
        bound = state.complete_by + ALLOWANCE
        if self.clock.now() >= state.complete_by - ALLOWANCE:
            shortest = REGISTRY.named(state.workflow).shortest_budget
            bound = max(bound, self.clock.now() + shortest + ALLOWANCE)
        return bound

    def _seen(self) -> list[OrderState]:
        return list(self.seen.values())

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        self.check_all()

    def check_all(self) -> None:
        indexed = {marker.order_id: marker for marker in self.store.list_live()}
        for order_id in ORDER_IDS:
            found = self.store.get_state(order_id)
            if found is not None:
                self._check_order(found.value, indexed)
        assert self.store.violations == []
        assert self.remote.violations == []
        self._check_replies_applied_once()
        self._check_effects()
        self._check_alerts()

    def _check_order(self, state: OrderState, indexed: dict[str, LiveMarker]) -> None:
        order_id = state.order_id
        previous = self.seen.get(order_id)
        if state.process_state in LIVE_STATES:
            assert state.complete_by is not None, state
            assert order_id in indexed, f"live order not indexed: {state}"
            # The Supervisor lists only due markers: one due after the deadline hides it.
            # Nothing (a sweep's re-arm or a resubmit's touch, however late it lands)
            # may set a marker past the deadline, give or take the roles' clock errors, which
            # the allowance covers while they stay within it.
            marker = indexed[order_id]
            if self.clocks_within_the_allowance:
                assert marker.due_at <= self._due_by(state), (marker, state)
        else:
            assert state.complete_by is None and state.finished_at is not None, state
        assert (state.locked_by is not None) == state.is_running, state
        assert 0 <= state.failure_count <= MAX_FAILURES, state
        assert previous is None or state.attempt >= previous.attempt, (previous, state)
        if state.alert_pending:
            assert state.process_state is ProcessState.ERROR, state
            assert order_id in indexed, f"an alert is owed but the order is unindexed: {state}"
        if state.process_state is ProcessState.ERROR:
            assert state.finished_at is not None
            self.episodes.setdefault(order_id, set()).add((state.attempt, state.finished_at))
        applied = {  # the order's effects (its undos are effects too: not counted here)
            action: undone
            for action, undone in self.remote.applied(order_id).items()
            if action in DO_ACTIONS
        }
        if state.process_state is ProcessState.PROCESSED:
            steps = WORKFLOW_OF[order_id].steps
            assert applied == {(s.agent, s.action): False for s in steps}, applied
        if state.process_state is ProcessState.COMPENSATED:
            assert all(applied.values()), f"an effect was not undone: {applied}"
        self.seen[order_id] = state

    def _check_replies_applied_once(self) -> None:
        applied = Counter(
            (h.order_id, h.attempt) for h in self.store.history if h.kind in REPLY_KINDS
        )
        assert all(n == 1 for n in applied.values()), applied

    def _check_effects(self) -> None:
        """I4: one effect per (order, action), and idempotency keys never shared."""
        actions_of_key: dict[str, set[tuple[str, str]]] = {}
        for call in self.remote.calls:
            actions_of_key.setdefault(call.key, set()).add((call.agent, call.action))
        assert all(len(actions) == 1 for actions in actions_of_key.values()), actions_of_key
        per_step = Counter(
            (effect.order_id, effect.agent, effect.action)
            for effect in self.remote.effects.values()
        )
        assert all(n == 1 for n in per_step.values()), per_step

    def _check_alerts(self) -> None:
        alerts = [m for m in self.bus.to(ROUTES.alerts) if isinstance(m, OperatorAlert)]
        copies = Counter((alert.order_id, alert.alert_id) for alert in alerts)
        for (order_id, alert_id), count in copies.items():
            episodes = {
                alert_message_id(order_id, attempt, at): (attempt, at)
                for attempt, at in self.episodes.get(order_id, set())
            }
            assert alert_id in episodes, f"alert {alert_id} for no Error episode seen"
            attempt, error_at = episodes[alert_id]
            reclaims = sorted(
                h.at
                for h in self.store.history
                if h.order_id == order_id
                and h.kind == "alert_claimed"
                and h.attempt == attempt
                and h.at >= error_at
            )
            assert count <= 1 + len(reclaims), f"{count} copies of {alert_id}, {reclaims}"
            # A claim is only ever taken over once its lease has lapsed.
            for previous, reclaim in zip([error_at, *reclaims], reclaims, strict=False):
                assert reclaim - previous >= ALERT_LEASE, (alert_id, previous, reclaim)

    # --- the end: drain with supervision, then nothing may be lost (I1) ----------------------

    def teardown(self) -> None:
        try:
            if sys.exc_info()[1] is None:  # not after a failed step: report that one
                self._drain()
                self._check_final()
        finally:
            self._close()

    def _drain(self, rounds: int = 120) -> None:
        self.remote.plan.clear()
        self.bus.fail_next_send_to.clear()
        for _ in range(rounds):
            self._deliver_everything_due()
            if self._settled():
                return
            self.clock.advance(10)
            for supervisor in self.supervisors:
                self._checked_sweep(supervisor.sweep)

    def _deliver_everything_due(self) -> None:
        for _ in range(200):
            busy = self._busy_queues()
            if not busy:
                return
            for queue in busy:
                due = self.bus.due(queue)
                self.bus.take(queue)
                for sent in due:
                    self._consume(queue, sent, 0)
        raise AssertionError("the bus did not settle")

    def _settled(self) -> bool:
        if any(self.bus.pending(q) for q in WORK_QUEUES):
            return False
        states = [self.store.get_state(o) for o in ORDER_IDS]
        return all(s is None or (s.value.is_terminal and not s.value.alert_pending) for s in states)

    def _check_final(self) -> None:
        self.check_all()
        for kind in sorted({h.kind for h in self.store.history}):
            event(f"history {kind}")
        now = self.clock.now()
        alert_ids = {m.alert_id for m in self.bus.to(ROUTES.alerts) if isinstance(m, OperatorAlert)}
        for order_id in ORDER_IDS:
            found = self.store.get_state(order_id)
            order = self.store.get_order(order_id)
            if found is None:
                assert order is None and order_id not in self.fingerprints
                continue
            state = found.value
            # I1: terminal, or in flight with a deadline still ahead.
            assert state.is_terminal or (state.complete_by is not None and state.complete_by > now)
            assert state.is_terminal, f"still {state.process_state} after draining: {state}"
            if state.process_state is ProcessState.ERROR:
                assert not state.alert_pending, state
                assert state.finished_at is not None
                assert alert_message_id(order_id, state.attempt, state.finished_at) in alert_ids
            event(f"ended {state.process_state}")
            # The first submission stays the order: a conflicting one never replaced it.
            assert order is not None and order.fingerprint == self.fingerprints[order_id]


TestSasMachine = SasMachine.TestCase
_profile = settings.default
assert _profile is not None  # the profile loaded (tests/conftest.py registers `make fast`'s)
TestSasMachine.settings = settings(
    # 200 in a full run (Hypothesis' default profile: 100); fewer under `make fast`'s profile.
    max_examples=2 * _profile.max_examples,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

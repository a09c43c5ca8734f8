"""An in-memory state store, queues and a clock that moves only when told: what ``Harness``
runs on, and what sas's own tests of the services use. Never a stand-in for Azure Storage where
the store's own behaviour is under test (Azurite serves those tests)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from sas.domain.breaker import BreakerState
from sas.domain.endpoints import EndpointLoad, HeldRetries
from sas.domain.errors import AlreadyExists, ConcurrencyConflict, NotFound
from sas.domain.messages import Message, decode, encode
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
from sas.domain.priority import Waiting
from sas.domain.wire import Priority, rejected_row_key, room_rows, room_rows_besides


def _one_operation_per_marker(order_ids: list[str]) -> None:
    """As the service refuses it: a transaction with two operations on one row fails whole
    (``InvalidDuplicateRow``), whatever else it carries."""
    repeated = sorted({o for o in order_ids if order_ids.count(o) > 1})
    if repeated:
        raise AssertionError(f"two operations on one marker in a transaction: {repeated}")


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self.current = start or datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.current

    def advance(self, seconds: float) -> None:
        self.current += timedelta(seconds=seconds)

    def sleep(self, seconds: float) -> None:
        """Use as the agent's sleep: time passes only when asked to."""
        self.advance(seconds)


@dataclass(frozen=True, order=True)
class Sent:
    """One message as the app sent it: the message is what a consumer would decode."""

    due: datetime
    """When it becomes visible: the send's time plus its delay."""
    seq: int
    queue: str = field(compare=False)
    message: Message = field(compare=False)
    message_id: str = field(compare=False)
    correlation_id: str = field(compare=False)
    delay_seconds: float = field(compare=False)
    sent_at: datetime = field(compare=False)
    """When it was enqueued: a peek dates a message from then, as Storage Queues do."""


class InMemoryQueues:
    """The Transport port in memory: each message kept in its wire form, visible from its due
    time, delivered only when a test (or ``Harness``) takes it. ``sent`` keeps every send."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: list[Sent] = []
        self._pending: list[Sent] = []  # a heap: the next due first
        self._seq = itertools.count()
        self.missing_queues: set[str] = set()
        """Queues that do not exist: a send to one raises ``NotFound``."""
        self.fail_next_send_to: set[str] = set()
        """Queues whose next send fails as a crash before sending would (once each)."""
        self.waiting_since: dict[str, datetime] = {}
        """A backlog a test declares: a peek at the queue sees a message enqueued then."""
        self.peeks: list[str] = []

    def send(
        self,
        queue: str,
        message: Message,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        if queue in self.fail_next_send_to:
            self.fail_next_send_to.discard(queue)
            raise ConnectionError(f"crash before sending to {queue}")
        if queue in self.missing_queues:
            raise NotFound(queue)
        wire = decode(type(message), encode(message))  # what a consumer would read
        now = self.clock.now()
        due = now + timedelta(seconds=delay_seconds)
        sent = Sent(
            due, next(self._seq), queue, wire, message_id, correlation_id, delay_seconds, now
        )
        self.sent.append(sent)
        heapq.heappush(self._pending, sent)

    def waiting(self, queue: str) -> Waiting:
        """As a peek sees the queue: its visible messages, and any backlog a test declared."""
        self.peeks.append(queue)
        visible = [s.sent_at for s in self.pending(queue) if s.due <= self.clock.now()]
        if queue in self.waiting_since:
            visible.append(self.waiting_since[queue])
        return Waiting(min(visible, default=None), min(len(visible), Waiting.PEEK))

    def holds_messages(self, queue: str) -> bool:
        """Any message not yet taken, due or delayed, or a backlog a test declared."""
        return queue in self.waiting_since or any(s.queue == queue for s in self._pending)

    def to(self, queue: str) -> list[Message]:
        """Every message ever sent to ``queue``, in order."""
        return [s.message for s in self.sent if s.queue == queue]

    def pending(self, queue: str) -> list[Sent]:
        """The messages of ``queue`` not yet taken, due or not, in due order."""
        return sorted(s for s in self._pending if s.queue == queue)

    def take(self, queue: str) -> list[Message]:
        """Remove and return the messages of ``queue`` that are due, in due order."""
        due = [s for s in self.pending(queue) if s.due <= self.clock.now()]
        self._pending = [s for s in self._pending if s not in due]
        heapq.heapify(self._pending)
        return [s.message for s in due]

    def next_due(self) -> datetime | None:
        return self._pending[0].due if self._pending else None

    def take_next(self) -> Sent:
        """Remove and return the message due first, whatever its queue."""
        return heapq.heappop(self._pending)

    def put_back(self, sent: Sent, after: timedelta) -> None:
        """``sent`` visible again ``after`` from now, as an unsettled message's lease expires."""
        again = replace(sent, due=self.clock.now() + after, seq=next(self._seq))
        heapq.heappush(self._pending, again)


class InMemoryLoads:
    """The LoadStore port in memory: one table of every process's last published counts,
    shared by the routers (processes) given it."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], EndpointLoad] = {}
        self.published: list[dict[str, int]] = []
        """What each publish said, in order."""
        self.reads = 0

    def publish(self, instance_id: str, counts: Mapping[str, int], at: datetime) -> None:
        self.published.append(dict(counts))
        for target, count in counts.items():
            self.rows[(target, instance_id)] = EndpointLoad(target, instance_id, count, at)

    def read(self) -> list[EndpointLoad]:
        self.reads += 1
        return list(self.rows.values())


class InMemoryBudgets:
    """The BudgetStore port in memory: each Supervisor process's last published figure."""

    def __init__(self) -> None:
        self.rows: dict[str, HeldRetries] = {}
        self.published: list[HeldRetries] = []
        """What each publish said, in order."""

    def publish(self, held: HeldRetries) -> None:
        self.published.append(held)
        self.rows[held.instance_id] = held

    def read(self) -> list[HeldRetries]:
        return list(self.rows.values())


class InMemoryBreakers:
    """The BreakerStore port in memory, with Table Storage's ETag semantics: every write gets a
    new ETag; a stale one, or a create over an existing row, fails."""

    def __init__(self) -> None:
        self._etags = (f"W/{n}" for n in itertools.count(1))
        self.rows: dict[str, tuple[BreakerState, str]] = {}
        self.written: list[BreakerState] = []
        """Every state written, in order."""

    def get(self, name: str) -> Versioned[BreakerState] | None:
        found = self.rows.get(name)
        return None if found is None else Versioned(*found)

    def put(self, state: BreakerState, etag: str | None) -> str:
        found = self.rows.get(state.name)
        if etag is None and found is not None:
            raise AlreadyExists(f"breaker {state.name} exists")
        if etag is not None and (found is None or found[1] != etag):
            raise ConcurrencyConflict(f"breaker {state.name} changed since read")
        new = next(self._etags)
        self.rows[state.name] = (state, new)
        self.written.append(state)
        return new


class InMemoryStore:
    """ETag semantics like Table Storage: every write gets a new ETag; stale ones fail."""

    def __init__(self) -> None:
        self._etags = (f"W/{n}" for n in itertools.count(1))
        self._parked_ids = itertools.count(1)
        self.orders: dict[str, OrderRecord] = {}
        self.states: dict[str, tuple[OrderState, str]] = {}
        self.steps: dict[tuple[str, int], StepRecord] = {}
        self.parked: dict[str, ParkedMessage] = {}
        self.audit: list[AuditEntry] = []
        self.alert_records: dict[str, Versioned[AlertRecord]] = {}
        """Operators' actions, in the order they were appended."""
        self.history: list[HistoryEntry] = []
        self.live: dict[str, LiveMarker] = {}
        self.room: dict[str, WaitingSubmission] = {}
        self.missing: dict[str, MissingDefinition] = {}
        self.starts: dict[tuple[str, str, int], StepStart] = {}

    def create_order(
        self,
        order: OrderRecord,
        state: OrderState,
        history: HistoryEntry | Sequence[HistoryEntry] | None = None,
    ) -> str:
        if order.order_id in self.orders or state.order_id in self.states:
            raise AlreadyExists(order.order_id)
        self.orders[order.order_id] = order
        etag = next(self._etags)
        self.states[state.order_id] = (state, etag)
        self.history.extend([history] if isinstance(history, HistoryEntry) else history or ())
        return etag

    def get_order(self, order_id: str) -> OrderRecord | None:
        return self.orders.get(order_id)

    def get_state(self, order_id: str) -> Versioned[OrderState] | None:
        found = self.states.get(order_id)
        return None if found is None else Versioned(*found)

    def update_state(
        self,
        state: OrderState,
        etag: str,
        history: HistoryEntry | Sequence[HistoryEntry] | None = None,
        *,
        step: StepRecord | None = None,
    ) -> str:
        found = self.states.get(state.order_id)
        if found is None:
            raise NotFound(state.order_id)
        if found[1] != etag:
            raise ConcurrencyConflict(state.order_id)
        new = next(self._etags)
        self.states[state.order_id] = (state, new)
        if isinstance(history, HistoryEntry):
            self.history.append(history)
        elif history is not None:
            self.history.extend(history)
        if step is not None:
            self.steps[(step.order_id, step.index)] = step
        return new

    def add_history(self, entry: HistoryEntry) -> None:
        self.history.append(entry)

    def get_history(self, order_id: str) -> list[HistoryEntry]:
        """In the table's order: by time, then attempt (its row keys), ties as written."""
        found = [h for h in self.history if h.order_id == order_id]
        return sorted(found, key=lambda h: (h.at, h.attempt))

    def touch_live(self, order_id: str, at: datetime, due_at: datetime, workflow: str = "") -> str:
        marker = LiveMarker(order_id, at, next(self._etags), due_at, workflow)
        self.live[order_id] = marker
        return marker.etag

    def create_live_all(
        self, markers: Sequence[tuple[str, datetime, datetime, str]]
    ) -> dict[str, LiveMarker]:
        _one_operation_per_marker([order_id for order_id, *_ in markers])
        created = {}
        for order_id, at, due_at, workflow in markers:
            if order_id not in self.live:
                self.touch_live(order_id, at, due_at, workflow)
                created[order_id] = self.live[order_id]
        return created

    def count_live(self, workflow: str, up_to: int) -> int:
        counted = [m for m in self.live.values() if m.workflow == workflow and not m.finished]
        return len(counted[:up_to])

    def count_held(self, workflow: str, up_to: int) -> int:
        held = self.count_live(workflow, up_to)
        return held if held >= up_to else held + len(self.list_waiting(workflow, up_to - held))

    def finish_live(self, order_id: str, at: datetime) -> None:
        self.live[order_id] = LiveMarker(order_id, at, next(self._etags), at, finished=True)

    def wait_for_room(self, row_key: str, order_id: str, body: bytes) -> None:
        if row_key not in self.room:
            self.room[row_key] = WaitingSubmission(row_key, order_id, body, next(self._etags))

    def list_waiting(self, workflow: str, up_to: int) -> list[WaitingSubmission]:
        first, after = room_rows(workflow)
        return [self.room[k] for k in sorted(self.room) if first <= k < after][:up_to]

    def list_stranded(self, known: tuple[str, ...], up_to: int) -> list[WaitingSubmission]:
        gaps = room_rows_besides(known)
        found = [
            self.room[k]
            for k in sorted(self.room)
            if any((f is None or k >= f) and (a is None or k < a) for f, a in gaps)
        ]
        return found[:up_to]

    def drop_waiting(self, waiting: WaitingSubmission) -> bool:
        current = self.room.get(waiting.row_key)
        if current is None or current.etag != waiting.etag:
            return False
        del self.room[waiting.row_key]
        return True

    def drop_waiting_all(self, rows: Sequence[WaitingSubmission]) -> int:
        _one_operation_per_marker([row.row_key for row in rows])
        return sum(self.drop_waiting(row) for row in rows)

    def list_live(self) -> list[LiveMarker]:
        return list(self.live.values())

    def list_due(self, at: datetime) -> list[LiveMarker]:
        return [m for m in self.live.values() if m.due_at <= at]

    def rearm_live(
        self, rearms: Sequence[tuple[LiveMarker, datetime]], drops: Sequence[LiveMarker] = ()
    ) -> int:
        _one_operation_per_marker([m.order_id for m, _ in rearms] + [m.order_id for m in drops])
        moved = 0
        for marker, due_at in rearms:
            current = self.live.get(marker.order_id)
            if current is not None and current.etag == marker.etag:
                self.live[marker.order_id] = replace(current, etag=next(self._etags), due_at=due_at)
                moved += 1
        return moved + sum(self.drop_live(marker) for marker in drops)

    def drop_live(self, marker: LiveMarker) -> bool:
        current = self.live.get(marker.order_id)
        if current is None or current.etag != marker.etag:
            return False
        del self.live[marker.order_id]
        return True

    def query_states(
        self,
        *,
        process_state: ProcessState | None = None,
        priority: Priority | None = None,
        submitted_after: datetime | None = None,
        submitted_before: datetime | None = None,
        finished_before: datetime | None = None,
        updated_after: datetime | None = None,
    ) -> Iterator[Versioned[OrderState]]:
        for state, etag in list(self.states.values()):
            finished = state.finished_at
            if (
                (process_state is None or state.process_state is process_state)
                and (priority is None or state.priority == priority)
                and (submitted_after is None or state.submitted_at >= submitted_after)
                and (submitted_before is None or state.submitted_at < submitted_before)
                and (finished_before is None or (finished and finished < finished_before))
                and (updated_after is None or state.updated_at >= updated_after)
            ):
                yield Versioned(state, etag)

    def count_states(self) -> dict[ProcessState, int]:
        counts = dict.fromkeys(ProcessState, 0)
        for state, _ in self.states.values():
            counts[state.process_state] += 1
        return counts

    def purge_order(self, state: Versioned[OrderState]) -> bool:
        order_id = state.value.order_id
        found = self.states.get(order_id)
        if found is None or found[1] != state.etag:
            return False
        del self.states[order_id]
        self.orders.pop(order_id, None)
        self.history = [h for h in self.history if h.order_id != order_id]
        self.steps = {key: s for key, s in self.steps.items() if key[0] != order_id}
        self.starts = {key: s for key, s in self.starts.items() if key[0] != order_id}
        return True

    def get_steps(self, order_id: str) -> list[StepRecord]:
        return [s for (oid, _), s in sorted(self.steps.items()) if oid == order_id]

    def park_message(self, queue: str, reason: str, body: bytes, at: datetime) -> str:
        parked_id = rejected_row_key(at, f"{next(self._parked_ids):012x}")
        self.parked[parked_id] = ParkedMessage(
            id=parked_id,
            parked_by="app",
            queue=queue,
            function=None,
            reason=reason,
            body=body,
            body_truncated=False,
            parked_at=at,
        )
        return parked_id

    def list_parked(self, limit: int = 100) -> list[ParkedMessage]:
        return [self.parked[key] for key in sorted(self.parked)[:limit]]

    def get_parked(self, parked_id: str) -> ParkedMessage | None:
        return self.parked.get(parked_id)

    def drop_parked(self, parked_id: str) -> bool:
        return self.parked.pop(parked_id, None) is not None

    def record_alert(self, record: AlertRecord) -> None:
        if record.alert_id not in self.alert_records:
            self.alert_records[record.alert_id] = Versioned(record, next(self._etags))

    def list_alerts(self) -> list[Versioned[AlertRecord]]:
        kept = [v for v in self.alert_records.values() if v.value.is_open]
        return sorted(kept, key=lambda v: (v.value.at, v.value.alert_id))

    def get_alert(self, alert_id: str) -> Versioned[AlertRecord] | None:
        return self.alert_records.get(alert_id)

    def update_alert(self, record: AlertRecord, etag: str) -> str:
        current = self.alert_records.get(record.alert_id)
        if current is None or current.etag != etag:
            raise ConcurrencyConflict(f"alert {record.alert_id} changed meanwhile")
        self.alert_records[record.alert_id] = Versioned(record, next(self._etags))
        return self.alert_records[record.alert_id].etag

    def append_audit(self, entries: Sequence[AuditEntry]) -> None:
        self.audit.extend(entries)

    def list_audit(self, query: AuditQuery) -> list[AuditEntry]:
        newest_first = sorted(enumerate(self.audit), key=lambda n: (n[1].at, n[0]), reverse=True)
        return [entry for _, entry in newest_first if query.matches(entry)][: query.limit]

    def record_start(self, start: StepStart) -> StepStart:
        return self.starts.setdefault((start.order_id, start.key, start.attempt), start)

    def get_start(self, order_id: str, key: str, attempt: int) -> StepStart | None:
        return self.starts.get((order_id, key, attempt))

    def get_missing(self, key: str) -> MissingDefinition | None:
        return self.missing.get(key)

    def note_missing(self, missing: MissingDefinition) -> None:
        self.missing[missing.key] = missing

    def forget_missing(self, key: str) -> None:
        self.missing.pop(key, None)

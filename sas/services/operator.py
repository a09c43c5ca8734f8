"""What an operator can do with orders: submit, look at, find and count them, resubmit or close
Error orders (one, or every one a query matches), steer live ones (sas/services/steering.py),
purge finished orders past their retention.
Parked messages are sas/services/parked_messages.py's. The HTTP API, the dashboard and the
`sas` CLI all go through here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from sas.domain.clock import require_utc
from sas.domain.errors import (
    AlreadyExists,
    ConcurrencyConflict,
    DefinitionMissing,
    IllegalTransition,
    InvalidMessage,
    NotFound,
)
from sas.domain.messages import APP_SET_FIELDS, OrderSubmitted
from sas.domain.model import (
    AUDIT_ACTIONS,
    AuditEntry,
    AuditQuery,
    HistoryEntry,
    OrderRecord,
    OrderState,
    ProcessState,
    StepRecord,
    Versioned,
)
from sas.domain.recovery import close, resubmit
from sas.domain.transitions import look_again_at
from sas.domain.wire import Priority, submission_message_id
from sas.domain.workflow import Registry
from sas.services import audit, steering
from sas.services import consequences as then
from sas.services.context import Context
from sas.services.submission import check

log = logging.getLogger(__name__)

PURGEABLE_STATES = frozenset(
    {
        ProcessState.PROCESSED,
        ProcessState.COMPENSATED,
        ProcessState.CLOSED,
        ProcessState.CANCELLED,
        ProcessState.TERMINATED,
    }
)
"""Finished for good. Error orders wait for an operator and are never purged."""
MAX_QUERY_LIMIT = 1000
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""Instants a query takes: far enough either way, and with room left for arithmetic."""


@dataclass(frozen=True)
class OrderQuery:
    """Which orders to list; None means any. Ages are by submission time, by the operator's
    clock: ``older_than`` keeps orders submitted more than that long ago, ``newer_than`` those
    submitted at most that long ago (an order exactly that old is newer, not older)."""

    state: ProcessState | None = None
    priority: Priority | None = None
    workflow: str | None = None
    """The workflow's name: one this app deploys."""
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    step: str | None = None
    """The step the order is at (by name; its undo included)."""
    error: str | None = None
    """Text its last error contains, in any case."""
    submitted_from: datetime | None = None
    """Submitted at or after this instant."""
    submitted_until: datetime | None = None
    """Submitted before this instant."""
    limit: int = 100
    offset: int = 0
    """Skip this many matches first (the next page: offset + limit)."""

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_QUERY_LIMIT:
            raise ValueError(f"limit must be 1..{MAX_QUERY_LIMIT}")
        if self.offset < 0:
            raise ValueError("offset must not be negative")
        for name, age in (("older_than", self.older_than), ("newer_than", self.newer_than)):
            if age is not None and age < timedelta(0):
                raise ValueError(f"{name} must not be negative")
        for name, at in (("from", self.submitted_from), ("until", self.submitted_until)):
            if at is not None and not EARLIEST <= require_utc(at, f"submitted_{name}") <= LATEST:
                raise ValueError(f"submitted_{name} must be from {EARLIEST.year} to {LATEST.year}")

    def submitted_between(self, now: datetime) -> tuple[datetime | None, datetime | None]:
        """The submission times it keeps, ``[after, before)``, the ages and instants together."""
        after = [self.submitted_from] if self.submitted_from is not None else []
        if self.newer_than is not None:
            after.append(now - self.newer_than)
        before = [self.submitted_until] if self.submitted_until is not None else []
        if self.older_than is not None:
            before.append(now - self.older_than)
        return max(after, default=None), min(before, default=None)


@dataclass(frozen=True)
class BulkReport:
    """What a bulk action matched and, unless a dry run, what became of each order."""

    dry_run: bool
    matched: list[OrderState]
    """The orders acted on (or, in a dry run, that would be): at most the query's limit."""
    total: int
    """How many Error orders match in all."""
    outcomes: dict[str, str]
    """Per order id: ``done``, or why not (someone moved it meanwhile, ...)."""
    unmatched: list[str] = field(default_factory=list)
    """Ids it was told to act on only (``only``) that the query no longer matches: nothing
    was done to them."""


@dataclass(frozen=True)
class PurgeReport:
    cutoff: datetime
    """Orders that finished before this instant (now - retention) are purged."""
    dry_run: bool
    candidates: list[OrderState]
    purged: int
    """Orders whose rows were all deleted: 0 on a dry run."""
    unmatched: list[str] = field(default_factory=list)
    """Ids asked for that are not purged: no such order, not finished for good, not in the
    states asked for, too recent, or past the limit."""


@dataclass(frozen=True)
class OrderDetail:
    order: OrderRecord
    state: OrderState
    steps: list[StepRecord]
    history: list[HistoryEntry]


class Operator:
    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._store = ctx.store
        self._transport = ctx.transport
        self._routes = ctx.routes
        self._clock = ctx.clock

    def audit(
        self,
        limit: int = 100,
        *,
        action: str | None = None,
        actor: str | None = None,
        target: str | None = None,
    ) -> list[AuditEntry]:
        """Operators' actions, newest first; they outlive the orders they acted on."""
        if not 1 <= limit <= MAX_QUERY_LIMIT:
            raise InvalidMessage(f"limit must be 1..{MAX_QUERY_LIMIT}")
        if action is not None and action not in AUDIT_ACTIONS:
            raise InvalidMessage(f"no action {action!r}: one of {', '.join(AUDIT_ACTIONS)}")
        return self._store.list_audit(
            AuditQuery(
                limit,
                action=action,
                actor=None if actor is None else actor[: audit.MAX_ACTOR],
                target=None if target is None else target[: audit.MAX_TARGET],
            )
        )

    def _audited(self, *entries: AuditEntry) -> None:
        audit.record(self._store, *entries)

    def detail(self, order_id: str) -> OrderDetail:
        current, order = self._store.get_state(order_id), self._store.get_order(order_id)
        if current is None or order is None:
            raise NotFound(f"order {order_id} not found")
        return OrderDetail(
            order, current.value, self._store.get_steps(order_id), self._store.get_history(order_id)
        )

    def counts(self) -> dict[ProcessState, int]:
        return self._store.count_states()

    def find(self, query: OrderQuery) -> list[OrderState]:
        """Matching orders, most recently updated first (all matches are read to sort them)."""
        return self.find_page(query)[0]

    def find_page(self, query: OrderQuery) -> tuple[list[OrderState], int]:
        """``query.limit`` matching orders from ``query.offset`` on, and how many match in all.
        InvalidMessage for a workflow this app does not deploy (a typo would match nothing)."""
        known = self._ctx.workflows.names
        if query.workflow is not None and query.workflow not in known:
            raise InvalidMessage(
                f"no workflow {query.workflow!r} is deployed: one of {', '.join(sorted(known))}"
            )
        after, before = query.submitted_between(self._clock.now())
        found = [
            versioned.value
            for versioned in self._store.query_states(
                process_state=query.state,
                priority=query.priority,
                submitted_before=before,
                submitted_after=after,
            )
            if self._matches(versioned.value, query)
        ]
        found.sort(key=lambda state: (state.updated_at, state.order_id), reverse=True)
        return found[query.offset : query.offset + query.limit], len(found)

    def _step_name(self, state: OrderState) -> str | None:
        return step_name(self._ctx.workflows, state)

    def _matches(self, state: OrderState, query: OrderQuery) -> bool:
        """The filters the table cannot apply: the workflow, the step's name, the error's text."""
        if query.workflow is not None and state.workflow != query.workflow:
            return False
        if (
            query.error is not None
            and query.error.casefold() not in (state.last_error or "").casefold()
        ):
            return False
        return query.step is None or self._step_name(state) == query.step

    def purge(
        self,
        retention: timedelta | None,
        *,
        states: Collection[ProcessState] = PURGEABLE_STATES,
        order_ids: Collection[str] | None = None,
        actor: str = "operator",
        dry_run: bool = True,
        limit: int = MAX_QUERY_LIMIT,
    ) -> PurgeReport:
        """Delete orders finished more than ``retention`` ago (None: any time before now) in
        one of ``states`` (Processed, Compensated, Closed) and, given ``order_ids``, only
        those, oldest first, at most ``limit``; a dry run only lists them. Each purged order
        is audited. InvalidMessage for a state that is not finished for good (Error orders
        wait for an operator and are never purged).

        Once purged, an order's id is forgotten: a submission that arrives again with the same
        id runs as a new order, so the retention must outlast any redelivery of submissions."""
        if retention is not None and retention < timedelta(0):
            raise ValueError("retention must not be negative")
        if limit < 1:
            raise ValueError("limit must be positive")
        unfinished = sorted(state.value for state in set(states) - PURGEABLE_STATES)
        if unfinished or not states:
            raise InvalidMessage(
                f"only {', '.join(sorted(s.value for s in PURGEABLE_STATES))} orders are "
                f"purged, not {', '.join(unfinished) or 'none'}"
            )
        now = self._clock.now()
        cutoff = now - (retention or timedelta(0))
        candidates = self._purgeable(cutoff, states, order_ids)[:limit]
        unmatched = unlisted(order_ids or (), {v.value.order_id for v in candidates})
        purged = 0
        if not dry_run:
            done: list[AuditEntry] = []
            try:
                for versioned in candidates:
                    if self._store.purge_order(versioned):
                        purged += 1
                        state = versioned.value
                        detail = f"{state.process_state.value} {state.workflow} order"
                        done.append(AuditEntry(now, actor, "purge", state.order_id, None, detail))
            finally:  # a store failure midway: what was purged is audited all the same
                self._audited(*done)
                log.warning(
                    "sas.orders_purged count=%d",
                    purged,
                    extra={"purged": purged, "cutoff": cutoff.isoformat(), "actor": actor[:100]},
                )
        return PurgeReport(cutoff, dry_run, [v.value for v in candidates], purged, unmatched)

    def _purgeable(
        self,
        cutoff: datetime,
        states: Collection[ProcessState],
        order_ids: Collection[str] | None,
    ) -> list[Versioned[OrderState]]:
        """The orders of ``states`` (and ``order_ids``) finished before ``cutoff``, oldest
        first."""
        if order_ids is not None:
            read = (self._store.get_state(order_id) for order_id in dict.fromkeys(order_ids))
            found = [versioned for versioned in read if versioned is not None]
        else:
            found = [
                versioned
                for state in sorted(states)
                for versioned in self._store.query_states(
                    process_state=state, finished_before=cutoff
                )
            ]
        return sorted(
            (
                versioned
                for versioned in found
                if versioned.value.process_state in states
                and versioned.value.finished_at is not None
                and versioned.value.finished_at < cutoff
            ),
            key=lambda versioned: (versioned.value.finished_at or cutoff, versioned.value.order_id),
        )

    def submit(self, order: OrderSubmitted, *, actor: str = "operator") -> str:
        """Send an order to its lane's orders queue, exactly as an application would, after
        the checks the submission function makes (InvalidMessage, with the reason, and nothing
        sent). Returns the message id (the duplicate-detection key). AlreadyExists, nothing
        sent, if the id is taken by a different order (the submission function would park it;
        one still queued is not seen). The same order again is sent: the app absorbs it."""
        for name in APP_SET_FIELDS:
            if getattr(order, name) is not None:
                raise InvalidMessage(f"{name} is set by the app, not by you")
        try:
            check(self._ctx, order)
        except DefinitionMissing as missing:
            raise InvalidMessage(missing.reason) from None
        existing = self._store.get_order(order.order_id)
        if existing is not None and existing.fingerprint != order.fingerprint():
            raise AlreadyExists(f"order id {order.order_id} already used for a different order")
        message_id = submission_message_id(order.order_id)
        self._transport.send(
            self._routes.lane(self._routes.orders, order.priority),
            order,
            message_id=message_id,
            correlation_id=order.order_id,
        )
        detail = f"{order.workflow}, {order.priority} priority"
        self._audited(AuditEntry(self._clock.now(), actor, "submit", order.order_id, None, detail))
        return message_id

    def resubmit_matching(
        self,
        query: OrderQuery,
        *,
        actor: str,
        dry_run: bool = True,
        only: Collection[str] | None = None,
    ) -> BulkReport:
        """Resubmit every Error order the query matches (at most ``query.limit``, most
        recently updated first) and, given ``only`` (the ids a dry run showed), among those
        only these; a dry run only lists them. Each write is the conditional one ``resubmit``
        makes; an order that fails is reported and the others go on."""
        if query.state not in (None, ProcessState.ERROR):
            raise InvalidMessage("only Error orders are resubmitted")
        errors = replace(query, state=ProcessState.ERROR)
        if only is not None:  # chosen among every match: a newer one must not push them out
            errors = replace(errors, limit=MAX_QUERY_LIMIT, offset=0)
        matched, total = self.find_page(errors)
        unmatched: list[str] = []
        if only is not None:
            chosen = set(only)
            matched = [state for state in matched if state.order_id in chosen][: query.limit]
            unmatched = unlisted(only, {state.order_id for state in matched})
        outcomes: dict[str, str] = {}
        if not dry_run:
            for state in matched:
                outcomes[state.order_id] = self._resubmit_one(state.order_id, actor)
            log.warning(
                "sas.orders_resubmitted",
                extra={"matched": len(matched), "actor": actor[:100]},
            )
        return BulkReport(dry_run, matched, total, outcomes, unmatched)

    def _resubmit_one(self, order_id: str, actor: str) -> str:
        return outcome_of(lambda: self.resubmit(order_id, actor=actor), "resubmitted")

    def close(self, order_id: str, *, actor: str, reason: str) -> OrderState:
        """Error -> Closed: the operator settled it by hand; likewise an order waiting for a
        workflow version that is not deployed. Audited with the reason; the write is
        conditional, as a resubmit's is. IllegalTransition for any other order."""
        if not reason.strip():
            raise InvalidMessage("closing an order needs a reason")
        current = self._store.get_state(order_id)
        if current is None:
            raise NotFound(f"order {order_id} not found")
        now = self._clock.now()
        closed = close(current.value, now=now)
        entry = HistoryEntry(
            order_id=order_id,
            at=now,
            kind="closed",
            attempt=closed.attempt,
            step=self._step_name(closed),
            mode=closed.mode,
            actor=actor[:100],
            detail=reason.strip()[:500],
        )
        self._store.update_state(closed, current.etag, entry)
        self._audited(AuditEntry(now, actor, "close", order_id, reason.strip()[:500]))
        log.warning("sas.order_closed", extra={"order_id": order_id, "actor": actor[:100]})
        then.notify(self._ctx, closed, "closed", now)
        return closed

    def cancel(self, order_id: str, *, actor: str, reason: str) -> OrderState:
        """Undo what a live (or Error) order did and end it Cancelled (``steering.cancel``)."""
        return steering.cancel(self._ctx, order_id, actor=actor, reason=reason)

    def suspend(self, order_id: str, *, actor: str, reason: str | None = None) -> OrderState:
        return steering.suspend(self._ctx, order_id, actor=actor, reason=reason)

    def resume(self, order_id: str, *, actor: str, reason: str | None = None) -> OrderState:
        return steering.resume(self._ctx, order_id, actor=actor, reason=reason)

    def terminate(self, order_id: str, *, actor: str, reason: str) -> OrderState:
        """End a live order where it stands, undoing nothing (``steering.terminate``)."""
        return steering.terminate(self._ctx, order_id, actor=actor, reason=reason)

    def resubmit(self, order_id: str, *, actor: str) -> OrderState:
        """Error -> Pending (failure count reset), audited; IllegalTransition if not Error.

        The write is conditional: two operators pressing the button at once resubmit once."""
        current = self._store.get_state(order_id)
        if current is None:
            raise NotFound(f"order {order_id} not found")
        now = self._clock.now()
        try:
            workflow = self._ctx.definition(current.value)
        except DefinitionMissing as missing:
            raise IllegalTransition(f"order {order_id}: {missing.reason}") from None
        again = resubmit(current.value, now=now, workflow=workflow)
        due = look_again_at(again, now=now, workflow=workflow)
        self._store.touch_live(order_id, now, due, workflow.name)  # indexed before it is live again
        entry = HistoryEntry(
            order_id=order_id,
            at=now,
            kind="resubmitted",
            attempt=again.attempt,
            step=workflow.step(again.step_index).name,
            mode=again.mode,
            actor=actor[:100],
            detail=f"previous error: {current.value.last_error or '-'}",
        )
        self._store.update_state(again, current.etag, entry)
        self._audited(AuditEntry(now, actor, "resubmit", order_id, detail=entry.detail))
        # Again after the write: a sweep that listed the first touch and saw Error may have
        # dropped the marker in between; this re-creates it (or makes that drop fail).
        self._store.touch_live(order_id, now, due, workflow.name)
        log.warning("sas.order_resubmitted", extra={"order_id": order_id, "actor": actor[:100]})
        then.request_schedule(self._ctx, again)
        then.notify(self._ctx, again, "resubmitted", now)
        return again


def step_name(workflows: Registry, state: OrderState) -> str | None:
    """The name of the step the order is at; None for an order from before states named it
    whose workflow (or step) this app no longer declares."""
    if state.step:
        return state.step
    try:
        return workflows.named(state.workflow, state.version).step(state.step_index).name
    except (ValueError, IndexError):
        return None


def unlisted(asked: Collection[str], matched: Collection[str]) -> list[str]:
    """The ids asked for, in their order and once each, that are not among those matched."""
    return [name for name in dict.fromkeys(asked) if name not in matched]


def outcome_of(act: Callable[[], object], verb: str) -> str:
    """One item of a bulk action: ``done``, or why not."""
    try:
        act()
    except (NotFound, IllegalTransition, ConcurrencyConflict) as exc:
        return f"not {verb}: {exc}"
    except Exception as exc:  # one item's failure must not hide what became of the rest
        log.warning("sas.bulk_item_failed", extra={"verb": verb}, exc_info=True)
        return f"not {verb}: {type(exc).__name__}"
    return "done"

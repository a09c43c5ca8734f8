"""What an operator can do: look at orders and rejected messages, resubmit an Error order."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sas.domain.clock import Clock
from sas.domain.errors import ConfigurationError, NotFound
from sas.domain.model import HistoryEntry, OrderRecord, OrderState, ProcessState, StepRecord
from sas.domain.poison import PoisonedMessage
from sas.domain.transitions import resubmit
from sas.domain.workflow import workflow_named
from sas.services.consequences import Consequences
from sas.services.ports import PoisonStore, StateStore, Transport
from sas.services.routes import Routes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OrderDetail:
    order: OrderRecord
    state: OrderState
    steps: list[StepRecord]
    history: list[HistoryEntry]


class Operator:
    def __init__(
        self,
        store: StateStore,
        transport: Transport,
        routes: Routes,
        clock: Clock,
        poison: PoisonStore | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._poison = poison
        self._then = Consequences(store, transport, routes, clock, actor="operator")

    def detail(self, order_id: str) -> OrderDetail:
        current, order = self._store.get_state(order_id), self._store.get_order(order_id)
        if current is None or order is None:
            raise NotFound(f"order {order_id} not found")
        return OrderDetail(
            order, current.value, self._store.get_steps(order_id), self._store.get_history(order_id)
        )

    def in_state(self, process_state: ProcessState, limit: int = 100) -> list[OrderState]:
        return self._store.list_states(process_state, limit)

    def rejected(self, limit: int = 100) -> list[dict[str, Any]]:
        return self._store.list_parked(limit)

    def resubmit(self, order_id: str, *, actor: str) -> OrderState:
        """Error -> Pending (failure count reset), audited; IllegalTransition if not Error.

        The write is conditional: two operators pressing the button at once resubmit once."""
        current = self._store.get_state(order_id)
        if current is None:
            raise NotFound(f"order {order_id} not found")
        now = self._clock.now()
        workflow = workflow_named(current.value.workflow)
        again = resubmit(current.value, now=now, workflow=workflow)
        self._store.touch_live(order_id, now)  # indexed before it is live again
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
        # Again after the write: a sweep that listed the first touch and saw Error may have
        # dropped the marker in between; this re-creates it (or makes that drop fail).
        self._store.touch_live(order_id, now)
        log.warning("sas.order_resubmitted", extra={"order_id": order_id, "actor": actor[:100]})
        self._then.request_schedule(again)
        self._then.notify.status(again.reply_to, order_id, "resubmitted", now)
        return again

    # --- poison and dead-lettered messages ----------------------------------------------

    def poisoned(self, limit: int = 100) -> list[PoisonedMessage]:
        """Messages the Functions host gave up on, in every queue the app consumes."""
        return self._poison_store().list(limit)

    def poison_age_seconds(self, message: PoisonedMessage) -> float | None:
        age = message.age(self._clock.now())
        return None if age is None else age.total_seconds()

    def replay_poisoned(self, poison_id: str, *, actor: str = "operator") -> None:
        """Back to its source queue unchanged; NotFound if there is no such message (any more)."""
        if not self._poison_store().replay(poison_id):
            raise NotFound("no such poisoned message")
        log.warning("sas.poison_replayed", extra={"poison_id": poison_id, "actor": actor[:100]})

    def discard_poisoned(self, poison_id: str, *, actor: str = "operator") -> None:
        """Gone for good; NotFound if there is no such message (any more)."""
        if not self._poison_store().discard(poison_id):
            raise NotFound("no such poisoned message")
        log.warning("sas.poison_discarded", extra={"poison_id": poison_id, "actor": actor[:100]})

    def _poison_store(self) -> PoisonStore:
        if self._poison is None:
            raise ConfigurationError("no poison store is wired to the operator")
        return self._poison

"""What an operator can do: look at orders, resubmit an Error order; list, replay and discard
rejected (parked) and poisoned messages."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sas.domain.clock import Clock
from sas.domain.errors import ConfigurationError, IllegalTransition, NotFound
from sas.domain.messages import MAX_MESSAGE_BYTES
from sas.domain.model import HistoryEntry, OrderRecord, OrderState, ProcessState, StepRecord
from sas.domain.poison import PoisonedMessage, consumed_queues
from sas.domain.transitions import look_again_at, resubmit
from sas.domain.wire import is_rejected_row_key
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
        self._consumed = consumed_queues(
            orders=routes.orders,
            scheduler=routes.scheduler,
            replies=routes.replies,
            agents=routes.agents,
            lanes=routes.lanes,
        )
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

    def rejected_age_seconds(self, parked: Mapping[str, Any]) -> float:
        """How long a message has been parked, by the injected clock, never negative."""
        at: datetime = parked["at"]
        return max((self._clock.now() - at).total_seconds(), 0.0)

    def replay_rejected(self, parked_id: str, *, actor: str) -> None:
        """Send a parked message's original body back to the queue it came from, then forget it.

        NotFound if there is no such message (any more) or its queue is gone; IllegalTransition
        if only part of the body was kept, the body is over what the app accepts, or the queue
        is not one the app consumes. A message that is still bad is simply parked again."""
        parked = self._parked(parked_id)
        queue: str = parked["queue"]
        body: bytes = parked["body"]
        if queue not in self._consumed:
            raise IllegalTransition(f"{queue} is not a queue the app consumes: nothing to replay")
        if parked["body_truncated"]:
            raise IllegalTransition("only the start of the body was kept: it cannot be replayed")
        if len(body) > MAX_MESSAGE_BYTES:
            raise IllegalTransition(
                f"the body is over {MAX_MESSAGE_BYTES} bytes: the app would only park it again"
            )
        # Send first, then drop: a crash in between leaves it parked, and a second replay sends
        # it again, which the app handles idempotently (on Service Bus the same message id even
        # lets duplicate detection drop it). Dropping first could lose it.
        self._poison_store().requeue(queue, body, message_id=parked_id)
        if not self._store.drop_parked(parked_id):
            log.warning(
                "sas.rejected_drop_lost parked_id=%s queue=%s",
                parked_id,
                queue,
                extra={"parked_id": parked_id, "queue": queue},
            )
        log.warning(
            "sas.rejected_replayed parked_id=%s queue=%s",
            parked_id,
            queue,
            extra={"parked_id": parked_id, "queue": queue, "actor": actor[:100]},
        )

    def discard_rejected(self, parked_id: str, *, actor: str) -> None:
        """Gone for good; NotFound if there is no such message (any more)."""
        if not is_rejected_row_key(parked_id) or not self._store.drop_parked(parked_id):
            raise NotFound("no such rejected message")
        log.warning(
            "sas.rejected_discarded parked_id=%s",
            parked_id,
            extra={"parked_id": parked_id, "actor": actor[:100]},
        )

    def _parked(self, parked_id: str) -> dict[str, Any]:
        parked = self._store.get_parked(parked_id) if is_rejected_row_key(parked_id) else None
        if parked is None:
            raise NotFound("no such rejected message")
        return parked

    def resubmit(self, order_id: str, *, actor: str) -> OrderState:
        """Error -> Pending (failure count reset), audited; IllegalTransition if not Error.

        The write is conditional: two operators pressing the button at once resubmit once."""
        current = self._store.get_state(order_id)
        if current is None:
            raise NotFound(f"order {order_id} not found")
        now = self._clock.now()
        workflow = workflow_named(current.value.workflow)
        again = resubmit(current.value, now=now, workflow=workflow)
        due = look_again_at(again, now=now, workflow=workflow)
        self._store.touch_live(order_id, now, due)  # indexed before it is live again
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
        self._store.touch_live(order_id, now, due)
        log.warning("sas.order_resubmitted", extra={"order_id": order_id, "actor": actor[:100]})
        self._then.request_schedule(again)
        self._then.notify.about(again, "resubmitted", now)
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

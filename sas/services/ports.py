"""Small ports the services depend on; adapters implement them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from sas.domain.messages import Message
from sas.domain.model import OrderRecord, OrderState, StepRecord, Versioned


class StateStore(Protocol):
    def create_order(self, order: OrderRecord, state: OrderState) -> None:
        """Insert order and state together or not at all; AlreadyExists if the id is taken."""
        ...

    def get_order(self, order_id: str) -> OrderRecord | None: ...

    def get_state(self, order_id: str) -> Versioned[OrderState] | None: ...

    def update_state(self, state: OrderState, etag: str) -> str:
        """Write if unchanged since ``etag`` was read; ConcurrencyConflict otherwise.

        Returns the new ETag."""
        ...

    def record_step(self, step: StepRecord) -> None:
        """Record a completed step (idempotent for the same attempt)."""
        ...

    def get_steps(self, order_id: str) -> list[StepRecord]: ...

    def park_message(self, queue: str, reason: str, body: bytes, at: datetime) -> str:
        """Keep a rejected message (reason + original body) for an operator; returns its id."""
        ...


class Transport(Protocol):
    def send(
        self,
        queue: str,
        message: Message,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        """Send one message; NotFound if the queue does not exist."""
        ...


class RemoteService(Protocol):
    def perform(
        self,
        agent: str,
        action: str,
        *,
        idempotency_key: str,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        """Apply one effect at most once per key.

        Raises TransientRemoteError or PermanentRemoteError."""
        ...

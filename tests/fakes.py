"""Fakes that record, for pure unit tests of service logic (never a stand-in for Azurite).
The store and clock are sas.testing's own."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sas.domain.errors import NotFound
from sas.domain.messages import Message
from sas.domain.priority import Waiting
from sas.testing.memory import FakeClock, InMemoryStore

__all__ = ["FakeClock", "InMemoryStore", "RecordingTransport", "ScriptedRemote", "Sent"]


@dataclass
class Sent:
    queue: str
    message: Message
    message_id: str
    correlation_id: str
    delay_seconds: float


@dataclass
class RecordingTransport:
    sent: list[Sent] = field(default_factory=list)
    missing_queues: set[str] = field(default_factory=set)
    waiting_since: dict[str, datetime] = field(default_factory=dict)
    """When the oldest message a peek sees was enqueued, per queue (nothing waits by default)."""
    peeks: list[str] = field(default_factory=list)

    def waiting(self, queue: str) -> Waiting:
        self.peeks.append(queue)
        oldest = self.waiting_since.get(queue)
        return Waiting(oldest, 0 if oldest is None else 1)

    def send(
        self,
        queue: str,
        message: Message,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        if queue in self.missing_queues:
            raise NotFound(queue)
        self.sent.append(Sent(queue, message, message_id, correlation_id, delay_seconds))

    def to(self, queue: str) -> list[Message]:
        return [s.message for s in self.sent if s.queue == queue]


@dataclass
class ScriptedRemote:
    """Answers from a script: each entry is a result dict or an exception to raise."""

    script: list[Any] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    clock: FakeClock | None = None
    call_seconds: float = 0.0

    def perform(
        self,
        agent: str,
        action: str,
        *,
        idempotency_key: str,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        self.calls.append(
            {"agent": agent, "action": action, "key": idempotency_key, "timeout": timeout}
        )
        if self.clock is not None:
            self.clock.advance(self.call_seconds)
        outcome = self.script.pop(0) if self.script else {"ok": True}
        if isinstance(outcome, BaseException):
            raise outcome
        result: dict[str, Any] = outcome
        return result

"""The state records kept in the state store (pattern.md point 14, design.md section 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar


class ProcessState(StrEnum):
    PENDING = "Pending"
    PROCESSING = "Processing"
    PROCESSED = "Processed"
    ERROR = "Error"


TERMINAL_STATES = frozenset({ProcessState.PROCESSED, ProcessState.ERROR})


@dataclass(frozen=True)
class OrderState:
    """One order's progress: who holds it, until when, and which step/attempt is current.

    ``attempt`` is the fencing token: every claim increments it, it travels in the agent
    request and reply, and a reply for any other attempt is dropped.
    ``complete_by`` is also set while Pending (the pickup deadline), so no live record is
    ever without a deadline the Supervisor can act on.
    """

    order_id: str
    workflow: str
    process_state: ProcessState
    submitted_at: datetime
    updated_at: datetime
    locked_by: str | None = None
    complete_by: datetime | None = None
    failure_count: int = 0
    attempt: int = 0
    step_index: int = 0
    reply_to: str | None = None
    finished_at: datetime | None = None
    last_error: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.process_state in TERMINAL_STATES


@dataclass(frozen=True)
class OrderRecord:
    """The order as submitted; immutable once accepted."""

    order_id: str
    workflow: str
    details: dict[str, Any]
    fingerprint: str
    """Hash of the canonical submission, to tell a redelivery from a conflicting reuse of the id."""
    submitted_at: datetime
    reply_to: str | None = None


@dataclass(frozen=True)
class StepRecord:
    """A completed step and what its compensation will need (recorded durably)."""

    order_id: str
    index: int
    name: str
    attempt: int
    completed_at: datetime
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def row_key(self) -> str:
        return step_row_key(self.index, self.name)


def step_row_key(index: int, name: str) -> str:
    return f"step:{index:02d}:{name}"


T = TypeVar("T")


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A value read from the store with the ETag that guards the next write to it."""

    value: T
    etag: str

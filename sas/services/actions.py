"""Agent actions that are the application's own Python functions, run in the agent's function:
``action(context, data) -> result``, under the same deadline, retries, breaker and fencing as a
remote call. An action signals a fault that may clear by raising ``Transient`` and a refusal by
raising ``Refused`` (``sas/actions.py``); any other exception counts as transient."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sas.domain.clock import Clock
from sas.domain.errors import PermanentRemoteError, TransientRemoteError
from sas.domain.wire import Mode
from sas.domain.workflow import PythonAgent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActionContext:
    """What an action is told about the step it performs."""

    order_id: str
    step: str
    action: str
    mode: Mode
    """``undo``: the step's compensating action (``data`` then holds ``original_result``)."""
    attempt: int
    idempotency_key: str
    """What the effect must be de-duplicated on: the same for every attempt of the step (its
    undo has its own), so a retry or a duplicate delivery never applies it twice."""
    deadline: datetime
    """By when the action must have returned, by the store's clock; a later result is dropped
    and the step retried."""
    clock: Clock

    def time_left(self) -> float:
        """Seconds until ``deadline`` (negative once it has passed)."""
        return (self.deadline - self.clock.now()).total_seconds()


def run_action(agent: PythonAgent, context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    """The action's result (None: an empty one); TransientRemoteError or PermanentRemoteError."""
    where = f"{agent.name}.{context.action}"
    try:
        result = agent.actions[context.action](context, data)
    except (TransientRemoteError, PermanentRemoteError):
        raise
    except Exception as exc:  # the app's own bug or a library's fault: retried like a timeout
        log.warning(
            "sas.action_failed action=%s error=%s",
            where,
            type(exc).__name__,
            exc_info=True,
            extra={"order_id": context.order_id, "step": context.step, "attempt": context.attempt},
        )
        raise TransientRemoteError(f"{where}: {type(exc).__name__}") from None
    if result is None:
        return {}
    if not isinstance(result, dict):
        raise TransientRemoteError(f"{where}: result is not a dict")
    return result

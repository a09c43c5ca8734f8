"""Agent actions that are the application's own Python functions, run in the agent's function:
``action(context, data) -> result``, under the same deadline, retries, breaker and fencing as a
remote call. An action signals a fault that may clear by raising ``Transient`` (with
``order_scoped=True`` when it is the order's own, e.g. its address bounced: retried, but not
counted by the agent's circuit breaker) and a refusal by raising ``Refused``
(``sas/actions.py``). Any other exception counts as a transient fault of what the action calls;
a result that is not a JSON object of at most 8 KiB, as the order's own."""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sas.domain.clock import Clock
from sas.domain.errors import ConfigurationError, PermanentRemoteError, TransientRemoteError
from sas.domain.messages import result_problem
from sas.domain.wire import Mode
from sas.domain.workflow import PythonAgent

log = logging.getLogger(__name__)

TABLES: ContextVar[Callable[[str], Any] | None] = ContextVar("sas_app_tables", default=None)
"""Where ``sas.actions.app_table`` finds the tables while an action runs: None, the app's
storage account; set by a ``sas.testing.Harness`` to its in-memory tables."""


@dataclass(frozen=True)
class ActionContext:
    """What an action is told about the step it performs."""

    order_id: str
    agent: str
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
    settings: Mapping[str, str] = field(default_factory=dict)
    """The agent's own settings (``PythonAgent.settings``) as this run has them."""

    def time_left(self) -> float:
        """Seconds until ``deadline`` (negative once it has passed)."""
        return (self.deadline - self.clock.now()).total_seconds()

    def setting(self, key: str) -> str:
        """The value of a setting the agent declares: from the app settings in Azure, the
        declaration's local value in a local run or a ``sas.testing`` harness."""
        try:
            return self.settings[key]
        except KeyError:
            raise ConfigurationError(
                f"setting {key!r}: agent {self.agent!r} does not declare it"
            ) from None


def run_action(agent: PythonAgent, context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    """The action's result (None: an empty one); TransientRemoteError or PermanentRemoteError."""
    where = f"{agent.name}.{context.action}"
    try:
        result = agent.actions[context.action](context, data)
    except (TransientRemoteError, PermanentRemoteError):
        raise
    except Exception as exc:  # the app's own bug or a library's fault: retried like a timeout
        _failed(context, where, type(exc).__name__, exc)
        raise TransientRemoteError(f"{where}: {type(exc).__name__}") from None
    return _as_json(context, where, {} if result is None else result)


def _as_json(context: ActionContext, where: str, result: object) -> dict[str, Any]:
    """The result as a reply carries it (JSON: keys become strings). One that is not a JSON
    object of at most 8 KiB counts as a failed call: the step is retried, never completed with
    a result lost on the way."""
    try:
        if not isinstance(result, dict):
            raise TypeError("not a dict")
        data = json.loads(json.dumps(result, allow_nan=False))
        problem = result_problem(data)
    except (TypeError, ValueError, RecursionError) as exc:
        problem = f"not JSON data ({type(exc).__name__})"
    if problem is not None:
        _failed(context, where, f"result {problem}", None)
        raise TransientRemoteError(f"{where}: result {problem}", order_scoped=True)
    value: dict[str, Any] = data
    return value


def _failed(context: ActionContext, where: str, error: str, exc: BaseException | None) -> None:
    """Logged with where the app's code failed, never with what it was given."""
    frames = traceback.extract_tb(exc.__traceback__) if exc is not None else []
    at = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "-"
    log.warning(
        "sas.action_failed action=%s error=%s at=%s",
        where,
        error,
        at,
        extra={"order_id": context.order_id, "step": context.step, "attempt": context.attempt},
    )

"""A remote service in memory that behaves as an idempotent provider does, and the outcomes a
test scripts for its calls (``ok``, ``fault``, ``refuse``, ``too_slow``, ``crash_before_reply``).

It plays every HTTP agent's service in ``Harness`` and in sas's own tests of the agents, by the
rules the local simulator keeps (sas_local/simulator/books.py): an effect is applied once per
(agent, action, idempotency key), and a retry under the key gets the first result back; an undo
(``original_action`` and ``original_key`` in its data) marks the effect it names, and closes
that key: a do arriving after its undo is refused and applies nothing. A Python agent's action
scripted with a result is applied by the same rules (its function does not run, and a retry
gets that result back); one late or lost without a result runs its function, whose own record
decides what a retry gets.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sas.domain.errors import PermanentRemoteError, TransientRemoteError
from sas.testing.memory import FakeClock


class Call(NamedTuple):
    """One call of an action, as the agent made it."""

    agent: str
    action: str
    key: str
    """The idempotency key."""
    data: Mapping[str, Any]
    timeout: float | None = None
    """The HTTP call's timeout (None for a Python agent's action)."""


class Crash(BaseException):
    """The agent's process died mid-call: nothing after it runs, its message is not settled."""


@dataclass(frozen=True)
class Outcome:
    """What one call of an action does (see the module's functions that make them)."""

    result: Mapping[str, Any] | None = None
    """What the call answers; None: what the action itself answers (a Python agent's function
    runs; an HTTP service answers an empty result)."""
    error: Exception | None = None
    seconds: float = 0.0
    """How long the call takes, in fake time."""
    crash: bool = False


def ok(result: Mapping[str, Any] | None = None) -> Outcome:
    """The effect is applied; the call returns ``result``."""
    return Outcome(result=result or {})


def fault(reason: str = "unavailable", retry_after: float | None = None) -> Outcome:
    """A transient fault: nothing applied; the agent retries while the deadline allows."""
    return Outcome(error=TransientRemoteError(reason, retry_after))


def refuse(reason: str = "refused") -> Outcome:
    """A refusal for good: nothing applied; the workflow compensates (or stops in Error)."""
    return Outcome(error=PermanentRemoteError(reason))


def too_slow(seconds: float, result: Mapping[str, Any] | None = None) -> Outcome:
    """The effect is applied, but the call returns after ``seconds``: past the deadline, its
    reply is never sent and the Supervisor retries the step, under the same key. ``result``:
    what the call answered (None: what the action itself answers)."""
    return Outcome(result=result, seconds=seconds)


def crash_before_reply(result: Mapping[str, Any] | None = None) -> Outcome:
    """The effect is applied, then the agent's process dies before replying: its message comes
    back after the visibility timeout. ``result`` as for ``too_slow``."""
    return Outcome(result=result, crash=True)


Key = tuple[str, str, str]
"""(agent, action, idempotency key): what a provider de-duplicates on."""


@dataclass
class Effect:
    """An effect the provider applied."""

    agent: str
    action: str
    order_id: str | None
    result: dict[str, Any]
    undoes: Key | None = None
    """The effect this one undoes (None: not an undo)."""
    undone_by: str | None = None


@dataclass
class InMemoryRemote:
    """Every remote service: scripted outcomes first, else a success with an empty result."""

    clock: FakeClock | None = None
    """Advanced by a slow outcome's ``seconds`` (None: the outcome takes no time)."""
    calls: list[Call] = field(default_factory=list)
    effects: dict[Key, Effect] = field(default_factory=dict)
    """What was applied, by (agent, action, idempotency key)."""
    closed: set[Key] = field(default_factory=set)
    """Do-keys an undo named: a later do with one is refused."""
    undo_order: list[tuple[str, str]] = field(default_factory=list)
    """(agent, action) of each effect undone, in the order undone."""
    _script: dict[tuple[str, str], list[Outcome]] = field(default_factory=lambda: defaultdict(list))

    def script(self, agent: str, action: str, *outcomes: Outcome) -> None:
        """The next calls of ``agent``'s ``action`` answer these, in order."""
        self._script[(agent, action)].extend(outcomes)

    def unused(self) -> dict[tuple[str, str], list[Outcome]]:
        """Scripted outcomes no call took (a test may want none)."""
        return {key: list(left) for key, left in self._script.items() if left}

    def perform(
        self,
        agent: str,
        action: str,
        *,
        idempotency_key: str,
        payload: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        """An HTTP agent's call: unscripted, the service answers an empty result."""
        self.calls.append(Call(agent, action, idempotency_key, dict(payload), timeout))
        answer: dict[str, Any] = self._answer(agent, action, idempotency_key, payload, dict)
        return answer

    def call(
        self,
        agent: str,
        action: str,
        key: str,
        data: Mapping[str, Any],
        action_itself: Callable[[], Any],
    ) -> Any:
        """A Python agent's call: a scripted outcome first (see the module); a key a scripted
        result applied gets it again; else the action runs."""
        self.calls.append(Call(agent, action, key, dict(data)))
        return self._answer(agent, action, key, data, action_itself, own_record=True)

    def applied(self, order_id: str) -> dict[tuple[str, str], bool]:
        """(agent, action) -> undone?, for each effect (not an undo) applied for the order."""
        return {
            (e.agent, e.action): e.undone_by is not None
            for e in self.effects.values()
            if e.order_id == order_id and e.undoes is None
        }

    def _answer(
        self,
        agent: str,
        action: str,
        key: str,
        data: Mapping[str, Any],
        otherwise: Callable[[], Any],
        *,
        own_record: bool = False,
    ) -> Any:
        """The next scripted outcome played: its error raised, else its result applied, else
        (none scripted, or one without a result) what the action itself answers: ``otherwise``,
        applied by the provider's rule, or with ``own_record`` (a Python agent's function) run
        unless a scripted result applied the key; then the outcome's time and crash."""
        script = self._script.get((agent, action))
        outcome = script.pop(0) if script else None
        if outcome is not None and outcome.error is not None:
            raise outcome.error
        if outcome is not None and outcome.result is not None:
            given = dict(outcome.result)
            result = self._apply(agent, action, key, data, lambda: given)
        elif own_record:
            applied = self.effects.get((agent, action, key))
            result = otherwise() if applied is None else dict(applied.result)
        else:
            result = self._apply(agent, action, key, data, otherwise)
        if outcome is not None and self.clock is not None:
            self.clock.advance(outcome.seconds)
        if outcome is not None and outcome.crash:
            raise Crash
        return result

    def _apply(
        self,
        agent: str,
        action: str,
        key: str,
        data: Mapping[str, Any],
        result_of: Callable[[], dict[str, Any]],
    ) -> dict[str, Any]:
        if (agent, action, key) in self.effects:  # applied before: the first result again
            return dict(self.effects[(agent, action, key)].result)
        if (agent, action, key) in self.closed:
            raise PermanentRemoteError("HTTP 409: this key was undone")
        result = dict(result_of())
        undoes = None
        if "original_key" in data:
            undoes = (agent, str(data.get("original_action")), str(data["original_key"]))
            self.closed.add(undoes)
        self.effects[(agent, action, key)] = Effect(
            agent, action, data.get("order_id"), result, undoes
        )
        original = self.effects.get(undoes) if undoes is not None else None
        if original is not None and original.undone_by is None:
            original.undone_by = key
            self.undo_order.append((original.agent, original.action))
        return result

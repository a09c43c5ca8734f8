"""The app's workflows with every Python action behind seeded faults: what the simulator does in
front of the HTTP agents, for the in-process ones. A local run names this module in
``SAS_WORKFLOWS_MODULE`` and the faults (``PythonFaults``, JSON) in ``SAS_PYTHON_FAULTS``;
``SAS_APP_WORKFLOWS`` names the app's own module (default ``workflows``). Never deployed.

Each call, by dice fixed by the seed, the action, the idempotency key, the attempt and the
call's number for that attempt in this process (``sas_local/simulator/faults.py``): a retry is
a new call wherever it runs, as it is for the simulator's services.

- ``python_transient``: ``Transient`` before the action runs: nothing applied;
- ``python_lost_reply``: the action runs, then ``Transient``: applied, its answer lost, so the
  retry must find what the first call did;
- ``python_slow``: the action runs, then the call takes ``slow_seconds`` more: past the
  deadline, so its reply is dropped and the Supervisor retries the step;
- ``python_refusal`` (fixed per key, so every retry gets it): ``Refused`` before the action runs.

With ``events`` set, each injected fault is a line in ``<events>/events-python-<pid>.log``
(the chaos campaign counts them).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sas.actions import ActionContext, Refused, Transient
from sas.domain.wire import without_incarnation
from sas.domain.workflow import Registry
from sas_local.simulator.faults import chance

CONFIG_ENV = "SAS_PYTHON_FAULTS"
APP_ENV = "SAS_APP_WORKFLOWS"
MODULE = __name__


class PythonFaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    transient_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    lost_reply_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    slow_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    slow_seconds: float = Field(default=20.0, ge=0.0, le=600.0)
    permanent_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of do-keys refused for good; undos are never refused here."""
    events: str | None = None


class _Dice:
    def __init__(self, faults: PythonFaults) -> None:
        self.faults = faults
        self._calls: Counter[tuple[str, int]] = Counter()
        self._lock = threading.Lock()

    def roll(self, where: str, context: ActionContext) -> Callable[[str, float], bool]:
        """This call's dice: ``hit(kind, rate)``."""
        call = (context.idempotency_key, context.attempt)
        with self._lock:
            number = self._calls[call]
            self._calls[call] += 1
        # Fixed by the order, step and attempt, not the incarnation: reproducible from run to
        # run, and a retry rolls again on whichever host runs it.
        seed, key = self.faults.seed, without_incarnation(context.idempotency_key)

        def hit(kind: str, rate: float) -> bool:
            if kind == "python_refusal":
                parts: tuple[object, ...] = (kind, where, key)
            else:
                parts = (kind, where, key, context.attempt, number)
            if rate <= 0 or chance(seed, *parts) >= rate:
                return False
            self.record(kind)
            return True

        return hit

    def record(self, kind: str) -> None:
        if self.faults.events:
            path = Path(self.faults.events) / f"events-python-{os.getpid()}.log"
            with path.open("a") as log:
                log.write(f"{kind}\n")


def faulty(registry: Registry, faults: PythonFaults) -> Registry:
    """``registry`` with each Python action behind ``faults``."""
    dice = _Dice(faults)

    def wrap(where: str, action: Callable[..., Any]) -> Callable[..., Any]:
        def call(context: ActionContext, data: dict[str, Any]) -> Any:
            hit = dice.roll(where, context)
            if hit("python_transient", faults.transient_rate):
                raise Transient(f"{where}: injected transient fault")
            if context.mode == "do" and hit("python_refusal", faults.permanent_rate):
                raise Refused(f"{where}: injected refusal")
            result = action(context, data)
            if hit("python_lost_reply", faults.lost_reply_rate):
                raise Transient(f"{where}: injected lost reply")
            if hit("python_slow", faults.slow_rate):
                time.sleep(faults.slow_seconds)
            return result

        return call

    agents = tuple(
        replace(
            agent,
            actions={name: wrap(f"{agent.name}.{name}", fn) for name, fn in agent.actions.items()},
        )
        for agent in registry.python_agents
    )
    return replace(registry, python_agents=agents)


def _app_registry() -> Registry:
    found = importlib.import_module(os.environ.get(APP_ENV) or "workflows").REGISTRY
    if not isinstance(found, Registry):
        raise TypeError("the app's REGISTRY is not a sas Registry")
    return found


REGISTRY = faulty(
    _app_registry(), PythonFaults.model_validate_json(os.environ.get(CONFIG_ENV) or "{}")
)

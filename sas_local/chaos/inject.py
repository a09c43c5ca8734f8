"""In-process fault injection, preloaded by every dev host worker of a chaos campaign.

The campaign starts its dev hosts with ``SAS_DEVHOST_PRELOAD=sas_local.chaos.inject`` and the
JSON config in ``SAS_CHAOS_CONFIG``; the worker imports this module before it loads the app,
and ``install()`` (run at import) then, in that worker only:

- skews the host's clock by a per-process offset, within the clock-skew allowance and beyond
  it (``sas_local.host_clock``): the app reads the store's time whatever its host's says;
- wraps the transport (``bootstrap.transport``): a send may go out twice (the copy delayed, so
  copies also arrive out of order) or late; the alerts queue is left alone, since the checker
  counts raw alert copies against the alert claims;
- crashes the worker (``os._exit``) right before a send when the campaign armed a crash token
  for that kind of send: every send of the app follows a state write (or, in an agent, the
  remote's effect), so this is the "crash between write and send" point. Only a worker that
  has run ``MIN_WORKER_AGE`` takes a token, as only such a worker is killed;
- shortens the dev host's receive lease so messages held by a killed worker come back within
  the campaign (the Functions host's own lease is longer; only the delay changes);
- optionally breaks the product on purpose (``broken``), to prove the checker catches it.

Each injected fault is appended to ``<dir>/events-<pid>.log`` (one kind per line), which the
campaign counts. Once ``<dir>/calm`` exists no new message fault is injected (the drain).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from sas_local import host_clock
from sas_local.devhost.pool import STABLE_AFTER

CONFIG_ENV = "SAS_CHAOS_CONFIG"
CALM_FILE = "calm"
CRASH_DIR = "crash"
EVENTS_GLOB = "events-*.log"
CRASH_EXIT_CODE = 137
MIN_WORKER_AGE = 2 * STABLE_AFTER
"""Seconds a worker runs before a kill or a crash token may end it: the dev host's crash
back-off stays at its shortest, and each worker gets through its batches between faults.
Younger, the host doing most of the sends (the core one) took nearly every fault as soon as
its workers came of age: a crash loop in which the head of each of its queues (a surge's
submissions) was received by worker after worker until its dequeue limit."""


@dataclass(frozen=True)
class ChaosConfig:
    dir: str
    seed: int = 0
    skew_max: float = 0.0
    duplicate_rate: float = 0.0
    delay_rate: float = 0.0
    delay_max: float = 6.0
    lease_seconds: int = 45
    queues: dict[str, str] | None = None
    """Role -> queue name: ``alerts``, ``replies``, ``scheduler``, ``orders``; agent queues are
    recognised by the ``agent_prefix``."""
    agent_prefix: str = "sas-agent-"
    broken: tuple[str, ...] = ()

    @classmethod
    def from_env(cls) -> ChaosConfig | None:
        raw = os.environ.get(CONFIG_ENV)
        if not raw:
            return None
        data: dict[str, Any] = json.loads(raw)
        data["broken"] = tuple(data.get("broken") or ())
        return cls(**data)


class Events:
    """Append-only per-process log of injected faults (one ``kind`` per line)."""

    def __init__(self, directory: Path) -> None:
        path = directory / f"events-{os.getpid()}.log"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(self, kind: str) -> None:
        os.write(self._fd, f"{kind}\n".encode())


def count_events(directory: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in directory.glob(EVENTS_GLOB):
        for line in path.read_text().splitlines():
            kind = line.split(" ", 1)[0].strip()
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
    return counts


class _Flags:
    """The calm flag and the armed crash tokens, re-read at most every ``every`` seconds."""

    def __init__(self, directory: Path, every: float = 0.3) -> None:
        self._dir = directory
        self._every = every
        self._checked = 0.0
        self._calm = False
        self._tokens: list[str] = []
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < self._every:
            return
        with self._lock:
            self._checked = now
            self._calm = (self._dir / CALM_FILE).exists()
            try:
                found = (self._dir / CRASH_DIR).iterdir()
                self._tokens = sorted(path.name for path in found if "." not in path.name)
            except OSError:
                self._tokens = []

    @property
    def calm(self) -> bool:
        self._refresh()
        return self._calm

    def take_crash(self, target: str) -> str | None:
        """Claim an armed token for ``target`` (atomic rename: one worker wins it)."""
        self._refresh()
        for name in self._tokens:
            wanted = name.split("-", 1)[1] if "-" in name else "any"
            if wanted not in ("any", target):
                continue
            source = self._dir / CRASH_DIR / name
            try:
                source.rename(source.with_name(f"{name}.taken-{os.getpid()}"))
            except OSError:
                continue
            return wanted
        return None


class ChaosTransport:
    """Wraps the app's transport: duplicates, delays, and crashes right before a send."""

    def __init__(
        self,
        inner: Any,
        config: ChaosConfig,
        events: Events,
        rng: random.Random,
        *,
        started: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._started = started
        self._clock = clock
        self._config = config
        self._events = events
        self._rng = rng
        self._rng_lock = threading.Lock()
        self._flags = _Flags(Path(config.dir))
        queues = config.queues or {}
        self._roles = {name: role for role, name in queues.items()}

    def _target(self, queue: str) -> str:
        if queue.startswith(self._config.agent_prefix):
            return "agent"
        return self._roles.get(queue, "other")

    def send(
        self,
        queue: str,
        message: Any,
        *,
        message_id: str,
        correlation_id: str,
        delay_seconds: float = 0,
    ) -> None:
        target = self._target(queue)
        old_enough = self._clock() - self._started >= MIN_WORKER_AGE
        if old_enough and not self._flags.calm and self._flags.take_crash(target) is not None:
            self._events.record(f"crash_before_send {target}")
            os._exit(CRASH_EXIT_CODE)
        roll, extra = 1.0, 0.0
        if target != "alerts" and not self._flags.calm:
            with self._rng_lock:
                roll, extra = self._rng.random(), self._rng.random()
        config = self._config
        send: Callable[..., None] = self._inner.send
        ids = {"message_id": message_id, "correlation_id": correlation_id}
        if roll < config.duplicate_rate:
            send(queue, message, delay_seconds=delay_seconds, **ids)
            send(queue, message, delay_seconds=delay_seconds + extra * config.delay_max, **ids)
            self._events.record(f"duplicate_message {target}")
        elif roll < config.duplicate_rate + config.delay_rate:
            late = delay_seconds + 1 + extra * (config.delay_max - 1)
            send(queue, message, delay_seconds=late, **ids)
            self._events.record(f"delayed_message {target}")
        else:
            send(queue, message, delay_seconds=delay_seconds, **ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install(config: ChaosConfig) -> None:
    from sas import bootstrap
    from sas_local.devhost import queues as devhost_queues

    started = time.monotonic()
    directory = Path(config.dir)
    (directory / CRASH_DIR).mkdir(parents=True, exist_ok=True)
    events = Events(directory)
    rng = random.Random(f"{config.seed}:{os.getpid()}")  # noqa: S311
    setattr(devhost_queues, "LEASE_SECONDS", config.lease_seconds)  # noqa: B010
    offset = rng.uniform(-config.skew_max, config.skew_max) if config.skew_max else 0.0
    if offset:
        host_clock.skew(offset)
        events.record(f"clock_skew {offset:+.3f}")
    original_transport = bootstrap.transport
    wrapped: list[ChaosTransport] = []
    lock = threading.Lock()

    def transport() -> Any:
        with lock:
            if not wrapped:
                wrapped.append(
                    ChaosTransport(original_transport(), config, events, rng, started=started)
                )
            return wrapped[0]

    setattr(bootstrap, "transport", transport)  # noqa: B010
    for name in config.broken:
        BROKEN[name]()


# --- deliberately broken builds (checker tests only) ------------------------------------------


def _break_fence() -> None:
    """Every reply counts as current: stale and duplicate replies are applied."""
    from sas.domain import transitions
    from sas.services import scheduler

    def always_current(*args: Any, **kwargs: Any) -> transitions.Fence:
        return transitions.Fence.CURRENT

    def no_check(*args: Any, **kwargs: Any) -> None:
        return None

    setattr(scheduler, "fence", always_current)  # noqa: B010
    setattr(transitions, "check_reply", no_check)  # noqa: B010


def _break_alert_lease() -> None:
    """The alert claim's lease is zero and the sender is slow between send and clear, so every
    sweep meanwhile takes the claim over and sends the alert again."""
    from sas import bootstrap
    from sas.services import alerts

    original_context, original_alert = bootstrap.context, alerts.alert

    def context() -> Any:
        return replace(original_context(), alert_lease=timedelta(0))

    def slow_alert(*args: Any, **kwargs: Any) -> None:
        original_alert(*args, **kwargs)
        time.sleep(3)

    setattr(bootstrap, "context", context)  # noqa: B010
    setattr(alerts, "alert", slow_alert)  # noqa: B010


_attempt = threading.local()


def _break_key_attempt() -> None:
    """The idempotency key includes the attempt: a retried step is a new effect."""
    from sas.services import consequences

    original_dispatch = consequences.dispatch
    original_key: Callable[[str, str, str, Any], str] = getattr(consequences, "idempotency_key")  # noqa: B009

    def dispatch(ctx: Any, state: Any, workflow: Any) -> None:
        _attempt.value = state.attempt
        original_dispatch(ctx, state, workflow)

    def key(order_id: str, incarnation: str, step: str, mode: Any) -> str:
        # Still a well-formed key (the step request's schema checks it), one per attempt.
        return original_key(order_id, incarnation, f"{step}a{getattr(_attempt, 'value', 0)}", mode)

    setattr(consequences, "dispatch", dispatch)  # noqa: B010
    setattr(consequences, "idempotency_key", key)  # noqa: B010


def _picked(order_id: str, one_in: int = 3) -> bool:
    """A fixed share of the orders, the same in every process (no per-process dice)."""
    return zlib.crc32(order_id.encode()) % one_in == 0


def _break_lose_submission() -> None:
    """The submission acknowledges a share of the orders without writing anything."""
    from sas.services import submission

    original = submission.submit

    def submit(ctx: Any, message: Any) -> submission.SubmissionOutcome:
        if _picked(message.order_id, 4):
            return submission.SubmissionOutcome.ACCEPTED
        return original(ctx, message)

    setattr(submission, "submit", submit)  # noqa: B010


def _break_alert_on_processed() -> None:
    """A share of the Processed orders also raise an operator alert."""
    from sas.domain.model import ProcessState
    from sas.domain.wire import alert_message_id
    from sas.services import alerts, consequences

    original = consequences.finished

    def finished(ctx: Any, state: Any, etag: str) -> None:
        original(ctx, state, etag)
        if state.process_state is ProcessState.PROCESSED and _picked(state.order_id):
            alert_id = alert_message_id(state.order_id, state.attempt, state.updated_at)
            alerts.alert(ctx, state.order_id, "broken build", state.updated_at, alert_id=alert_id)

    setattr(consequences, "finished", finished)  # noqa: B010


def _skipping_remote(skip: Callable[[Any], bool]) -> None:
    """Agents answer the requests ``skip`` picks as done without calling the remote service."""
    from sas.services import agent

    original = agent._call_with_retries

    def call(ctx: Any, agents: Any, attempt: Any) -> dict[str, Any]:
        if skip(attempt.request):
            return {}
        return original(ctx, agents, attempt)

    setattr(agent, "_call_with_retries", call)  # noqa: B010


def _break_skip_undo() -> None:
    """Undos are answered as done without undoing anything."""
    _skipping_remote(lambda request: request.mode == "undo")


def _break_skip_ship() -> None:
    """For a share of the orders, the last step is answered as done without being applied."""
    _skipping_remote(
        lambda request: (
            request.mode == "do" and request.step == "ship" and _picked(request.order_id)
        )
    )


def _break_failure_threshold() -> None:
    """The Supervisor retries three times more than the configured threshold allows."""
    from sas import bootstrap

    original = bootstrap.settings

    def settings() -> Any:
        loaded = original()
        return replace(loaded, max_failures=loaded.max_failures + 3)

    setattr(bootstrap, "settings", settings)  # noqa: B010


def _break_no_expiry() -> None:
    """The Supervisor never finds a deadline passed: a step that got no reply waits forever."""
    from sas.domain import recovery

    setattr(recovery.RetryPolicy, "expired", lambda self, state, now: False)  # noqa: B010


def _break_poison_reply() -> None:
    """The Scheduler fails on every reply of a share of the orders: the host poisons them."""
    from sas.services import scheduler

    original = scheduler.on_reply

    def on_reply(ctx: Any, reply: Any) -> Any:
        if _picked(reply.order_id, 5):
            raise RuntimeError("broken build: this order always fails")
        return original(ctx, reply)

    setattr(scheduler, "on_reply", on_reply)  # noqa: B010


def _break_skip_to_processed() -> None:
    """A completed first step finishes a share of the orders, skipping the steps after it."""
    from sas.domain import transitions
    from sas.domain.model import ProcessState

    original = transitions.complete_step

    def complete_step(state: Any, **kwargs: Any) -> Any:
        if (
            kwargs["step_index"] == 0
            and kwargs.get("mode", "do") == "do"
            and _picked(state.order_id)
        ):
            transitions.check_reply(
                state, kwargs["workflow"], attempt=kwargs["attempt"], step_index=0
            )
            return transitions._finish(
                state, ProcessState.PROCESSED, kwargs["now"], last_error=None
            )
        return original(state, **kwargs)

    setattr(transitions, "complete_step", complete_step)  # noqa: B010


def _break_ignore_version() -> None:
    """Every host runs an order on the newest version of its workflow it has, not the one the
    order was bound to (as before versions): a deploy re-reads the orders in flight."""
    from sas.services.context import Context

    def definition(self: Context, state: Any) -> Any:
        return self.workflows.named(state.workflow)

    setattr(Context, "definition", definition)  # noqa: B010


BROKEN: dict[str, Callable[[], None]] = {
    "fence": _break_fence,
    "alert_lease": _break_alert_lease,
    "key_attempt": _break_key_attempt,
    "lose_submission": _break_lose_submission,
    "alert_on_processed": _break_alert_on_processed,
    "skip_undo": _break_skip_undo,
    "skip_ship": _break_skip_ship,
    "failure_threshold": _break_failure_threshold,
    "no_expiry": _break_no_expiry,
    "poison_reply": _break_poison_reply,
    "skip_to_processed": _break_skip_to_processed,
    "ignore_version": _break_ignore_version,
}

_config = ChaosConfig.from_env()
if _config is not None:
    install(_config)

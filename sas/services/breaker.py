"""A circuit breaker per remote target whose state every agent instance shares.

The state lives in the state store (one entity per breaker), so an outage seen by some agent
instances stops all of them from hammering the remote. To keep table traffic off the hot path,
each process caches what it read for ``cache_ttl`` seconds: a closed breaker costs at most one
read per ``cache_ttl`` per process (when the copy expires, one thread reads while the others go
on with the copy, for at most one more ``cache_ttl``). Every write is conditional on the ETag;
a lost race re-reads and re-applies (a bounded number of times), which is also how exactly one
instance takes the probe of an open breaker.

The ratio needs successes counted too, and a write per success would put one on every call.
So a failure is written at once, carrying the successes this process counted and has not
written yet; a success is only counted in the process, and written with its next failure or,
while the window (as this process last read it) holds failures, at most once per
``cache_ttl``. A healthy target costs no writes; a failing one at most one write per process
per ``cache_ttl`` beyond its failures. The trade-off: other processes' successes reach the
window up to a ``cache_ttl`` (their next read) after its first failure, so for that long the
ratio can read high (``minimum_calls`` still applies); and the successes a process counted
are lost if it stops.

The breaker is an optimisation, never a dependency: if the store fails, the call goes ahead
(fail open) and store access pauses for ``cache_ttl`` so a broken table does not slow every
call.
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from sas.domain.breaker import (
    Admission,
    BreakerPolicy,
    BreakerState,
    BreakerStatus,
    Tally,
    admit,
    bucket_of,
    closed_breaker,
    count,
    in_window,
    on_failure,
    on_success,
)
from sas.domain.clock import Clock
from sas.domain.errors import AlreadyExists, ConcurrencyConflict, TransientRemoteError
from sas.domain.model import Versioned

log = logging.getLogger(__name__)

R = TypeVar("R")


class BreakerStore(Protocol):
    def get(self, name: str) -> Versioned[BreakerState] | None:
        """The breaker's state with the ETag guarding the next write; None if never written."""
        ...

    def put(self, state: BreakerState, etag: str | None) -> str:
        """Create (``etag`` None; AlreadyExists if it is there) or replace if unchanged since
        ``etag`` was read (ConcurrencyConflict otherwise). Returns the new ETag."""
        ...


class _Contended(Exception):
    """Every bounded attempt to write lost a race."""


@dataclass(frozen=True)
class _Cached:
    versioned: Versioned[BreakerState] | None
    read_at: datetime


class CircuitBreaker:
    def __init__(
        self,
        store: BreakerStore,
        clock: Clock,
        name: str,
        policy: BreakerPolicy | None = None,
        cache_ttl: float = 1.0,
        *,
        instance_id: str | None = None,
        max_races: int = 3,
    ) -> None:
        if cache_ttl < 0:
            raise ValueError("cache_ttl must not be negative")
        if max_races < 1:
            raise ValueError("max_races must be at least 1")
        self.name = name
        self.policy = policy or BreakerPolicy()
        self._store = store
        self._clock = clock
        self._ttl = timedelta(seconds=cache_ttl)
        self._instance = instance_id or uuid.uuid4().hex[:12]
        self._calls = itertools.count(1)
        self._max_races = max_races
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._cached: _Cached | None = None
        self._paused_until: datetime | None = None
        self._unwritten: dict[datetime, int] = {}
        """Successes counted here and not written yet, by bucket."""
        self._written_at: datetime | None = None
        """When this process last wrote its successes."""

    # --- the three calls an agent makes ---------------------------------------------------

    def before_call(self) -> None:
        """Return if a call may go ahead now; raise TransientRemoteError if the circuit is open.

        The error's ``retry_after`` is the number of seconds until the breaker may let a call
        through again. Taking the probe of an open breaker is a conditional write, so across
        all instances exactly one caller probes."""
        if self._paused():
            return
        token = f"{self._instance}:{next(self._calls)}"
        try:
            admission = self._transact(
                lambda state, now: _admission_change(
                    admit(state, self.policy, now=now, caller=token)
                )
            )
        except _Contended:
            log.warning("sas.breaker_contended", extra={"breaker": self.name, "op": "before_call"})
            return
        except Exception as exc:
            log.warning(
                "sas.breaker_store_failed",
                extra={"breaker": self.name, "op": "before_call", "error": type(exc).__name__},
                exc_info=True,
            )
            self._pause()
            return
        if admission.allowed:
            return
        now = self._clock.now()
        retry_at = admission.retry_at or now + self.policy.open_for
        retry_after = max((retry_at - now).total_seconds(), 0.0)
        log.debug(
            "sas.breaker_refused",
            extra={
                "breaker": self.name,
                "status": str(admission.state.status),
                "retry_after": retry_after,
            },
        )
        raise TransientRemoteError(f"{self.name} circuit open", retry_after=retry_after)

    def last_status(self) -> str | None:
        """The status this process last read or wrote (``closed`` if the breaker was never
        written); None before its first read. Reads nothing: for the metrics gauge."""
        with self._lock:
            cached = self._cached
        if cached is None:
            return None
        state = cached.versioned
        return BreakerStatus.CLOSED.value if state is None else state.value.status.value

    def healthy(self) -> bool:
        """Whether a call would be let through now: closed, or open with its probe due and not
        yet taken (so an endpoint that recovered gets its probe even while others have room;
        the call that takes it fails over at once if it fails). For routing: it reads at most
        once per ``cache_ttl`` and writes nothing. Never raises: a store that fails counts as
        healthy (the breaker fails open)."""
        if self._paused():
            return True
        try:
            current = self._current(fresh=False)
        except Exception:
            log.warning("sas.breaker_store_failed", extra={"breaker": self.name, "op": "healthy"})
            self._pause()
            return True
        now = self._clock.now()
        state = current.value if current is not None else closed_breaker(self.name, now)
        return admit(state, self.policy, now=now, caller="routing").allowed

    def record_success(self) -> None:
        """The remote answered (a result, a refusal, or a fault the order owns). A probe's
        success is written at once (it closes the breaker); any other is counted here and
        written later (see the module's docstring). Never raises."""
        if self._paused():
            return
        now = self._clock.now()
        with self._lock:
            cached = self._cached
        state = None if cached is None or cached.versioned is None else cached.versioned.value
        if state is not None and state.status is BreakerStatus.HALF_OPEN:
            self._record(
                "record_success",
                lambda state, now: (on_success(state, self.policy, now=now), None),
            )
            return
        if state is not None and state.status is BreakerStatus.OPEN:
            return  # it started before the breaker opened: not counted
        bucket = bucket_of(now, self.policy)
        with self._lock:
            self._unwritten[bucket] = self._unwritten.get(bucket, 0) + 1
            due = self._written_at is None or now >= self._written_at + self._ttl
        if due and state is not None:
            self._write_successes(now, state)

    def record_failure(self) -> None:
        """The remote failed transiently: written at once, with the successes this process
        counted and has not written yet. Never raises."""
        successes = self._successes()
        written = self._record(
            "record_failure",
            lambda state, now: (on_failure(state, self.policy, now=now, also=successes), None),
        )
        if written:
            self._written(successes)

    # --- internals ------------------------------------------------------------------------

    def _write_successes(self, now: datetime, state: BreakerState) -> None:
        """Write the successes counted here, as the window (``state``, as last read) holds
        failures: the ratio is judged on every process's calls."""
        if not any(tally.failures for tally in in_window(state.window, self.policy, now)):
            return
        successes = self._successes()
        written = self._record(
            "record_success",
            lambda state, now: (count(state, self.policy, now=now, tallies=successes), None),
        )
        if written:
            self._written(successes)

    def _successes(self) -> tuple[Tally, ...]:
        """The successes counted here and not written yet, those aged out of the window
        dropped."""
        now = self._clock.now()
        with self._lock:
            counted = (Tally(start, n) for start, n in sorted(self._unwritten.items()))
            kept = in_window(counted, self.policy, now)
            self._unwritten = {tally.start: tally.calls for tally in kept}
        return kept

    def _written(self, successes: tuple[Tally, ...]) -> None:
        """``successes`` were written (or, the breaker not closed, need not be)."""
        now = self._clock.now()
        with self._lock:
            for tally in successes:
                left = self._unwritten.get(tally.start, 0) - tally.calls
                if left > 0:
                    self._unwritten[tally.start] = left
                else:
                    self._unwritten.pop(tally.start, None)
            self._written_at = now

    def _record(
        self, op: str, change: Callable[[BreakerState, datetime], tuple[BreakerState, None]]
    ) -> bool:
        """Apply ``change``; whether it is now in the store (or needed no write)."""
        if self._paused():
            return False
        try:
            self._transact(change)
        except _Contended:
            log.warning("sas.breaker_contended", extra={"breaker": self.name, "op": op})
        except Exception as exc:
            log.warning(
                "sas.breaker_store_failed",
                extra={"breaker": self.name, "op": op, "error": type(exc).__name__},
                exc_info=True,
            )
            self._pause()
        else:
            return True
        return False

    def _transact(self, change: Callable[[BreakerState, datetime], tuple[BreakerState, R]]) -> R:
        """Apply ``change`` to the current state and write it if it changed, conditionally.

        Starts from the cached state when fresh; a lost race re-reads from the store."""
        fresh = False
        for _ in range(self._max_races):
            current = self._current(fresh=fresh)
            now = self._clock.now()
            state = current.value if current is not None else closed_breaker(self.name, now)
            new, result = change(state, now)
            if new == state:
                return result
            try:
                etag = self._store.put(new, None if current is None else current.etag)
            except (ConcurrencyConflict, AlreadyExists):
                fresh = True
                continue
            self._remember(Versioned(new, etag), now)
            self._log_change(state, new)
            return result
        raise _Contended

    def _current(self, *, fresh: bool) -> Versioned[BreakerState] | None:
        now = self._clock.now()
        with self._lock:
            cached = self._cached
        if not fresh and cached is not None and now < cached.read_at + self._ttl:
            return cached.versioned
        if fresh or cached is None:
            return self._read(now)
        # Expired: one thread reads it again; the others keep the copy they have until that
        # read lands (it is at most one read older), rather than each reading the same row.
        if not self._refreshing.acquire(blocking=False):
            if now < cached.read_at + 2 * self._ttl:
                return cached.versioned
            return self._read(now)  # that read is slow: do not act on a copy this old
        try:
            return self._read(now)
        finally:
            self._refreshing.release()

    def _read(self, now: datetime) -> Versioned[BreakerState] | None:
        versioned = self._store.get(self.name)
        self._remember(versioned, now)
        return versioned

    def _remember(self, versioned: Versioned[BreakerState] | None, at: datetime) -> None:
        with self._lock:
            self._cached = _Cached(versioned, at)

    def _paused(self) -> bool:
        with self._lock:
            until = self._paused_until
        return until is not None and self._clock.now() < until

    def _pause(self) -> None:
        """After a store failure: allow every call without touching the store for a while."""
        now = self._clock.now()
        with self._lock:
            self._paused_until = now + self._ttl
            self._cached = None

    def _log_change(self, old: BreakerState, new: BreakerState) -> None:
        if old.status is new.status and old.probe_owner == new.probe_owner:
            return
        extra: dict[str, object] = {
            "breaker": self.name,
            "from_status": str(old.status),
            "calls": new.calls,
            "failures": new.failures,
        }
        if new.status is BreakerStatus.OPEN:
            event = (
                "sas.breaker_opened"
                if old.status is BreakerStatus.CLOSED
                else "sas.breaker_reopened"
            )
            log.warning(event, extra={**extra, "opened_until": new.opened_until})
        elif new.status is BreakerStatus.HALF_OPEN:
            log.info("sas.breaker_probe_taken", extra={**extra, "probe_until": new.probe_until})
        else:
            log.info("sas.breaker_closed", extra=extra)


def _admission_change(admission: Admission) -> tuple[BreakerState, Admission]:
    """An admission as a change: its state differs from the one read only for a probe taken."""
    return admission.state, admission

"""The simulator's HTTP API: provider actions with fault injection, the ledger, the faults.

Time and sleep are injected so tests drive outage windows and slow replies without waiting.
Every request's bookkeeping runs in one synchronous stretch (`_decide`, no await inside), so
it is atomic on the event loop without a lock; only the slow reply's wait happens after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from sas.domain.clock import Clock
from sas.domain.wire import STEP_NAME, without_incarnation
from sas.services.store_time import SystemClock
from sas_local.simulator.books import Books, Entry, Key, ServiceStats
from sas_local.simulator.faults import FaultConfig, chance, refusal

Name = Annotated[str, Path(pattern=STEP_NAME.end_of_text)]
Sleep = Callable[[float], Awaitable[None]]


class EndpointStats(BaseModel):
    calls: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    """The most calls it held at once (never above its capacity)."""
    saturated: int = 0
    """Calls answered 429 because it was at capacity."""
    down_rejections: int = 0


class LedgerView(BaseModel):
    effects: list[Entry]
    """Do- and undo-entries in the order they were first applied."""
    replays: int
    stats: dict[str, ServiceStats]
    faults: FaultConfig


@dataclass
class _Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0

    @classmethod
    def error(cls, status: int, detail: str, headers: dict[str, str] | None = None) -> _Reply:
        return cls(status, {"detail": detail}, headers or {})


@dataclass
class _Simulator:
    books: Books
    clock: Clock
    faults: FaultConfig
    faults_set_at: datetime
    endpoints: dict[str, EndpointStats] = field(default_factory=dict)

    def enter(self, endpoint: str) -> _Reply | None:
        """Take a place at ``endpoint``, or the refusal its faults give (nothing applied)."""
        stats = self.endpoints.setdefault(endpoint, EndpointStats())
        stats.calls += 1
        config = self.faults.endpoints.get(endpoint)
        if config is not None and config.down:
            stats.down_rejections += 1
            return _Reply.error(503, f"endpoint {endpoint} is down (simulated)")
        capacity = None if config is None else config.capacity
        if capacity is not None and stats.in_flight >= capacity:
            stats.saturated += 1
            return _Reply.error(429, f"endpoint {endpoint} is at capacity", {"Retry-After": "1"})
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        return None

    def leave(self, endpoint: str) -> None:
        self.endpoints[endpoint].in_flight -= 1

    def latency(self, endpoint: str) -> float:
        config = self.faults.endpoints.get(endpoint)
        return 0.0 if config is None else config.latency_seconds

    def set_faults(self, faults: FaultConfig) -> None:
        self.faults = faults
        self.faults_set_at = self.clock.now()  # the outage window is relative to this

    def decide(self, service: str, action: str, key: str | None, payload: dict[str, Any]) -> _Reply:
        stats = self.books.stats(service)
        stats.calls += 1
        if not key:
            stats.bad_requests += 1
            return _Reply.error(400, "Idempotency-Key header is required")
        try:
            undo = _undo_of(payload)
        except ValueError as exc:
            stats.bad_requests += 1
            return _Reply.error(400, str(exc))
        faults = self.faults.for_service(service)
        seed = faults.seed
        ident: Key = (service, action, key)
        call = self.books.next_call(ident, self.clock.now())
        # Dice fixed by the order and step, not the incarnation: the same orders meet the same
        # faults from run to run.
        dice = (service, action, without_incarnation(key))
        if faults.in_outage(service, self.faults_set_at, self.clock.now()):
            stats.outage_rejections += 1
            return _Reply.error(503, f"{service} is unavailable (simulated outage)")
        if chance(seed, "transient", *dice, call) < faults.transient_rate:
            stats.transient_failures += 1
            if chance(seed, "throttle", *dice, call) < faults.throttle_share:
                stats.throttled += 1
                return _Reply.error(429, "too many requests", {"Retry-After": "1"})
            return _Reply.error(503, "temporarily unavailable")
        if undo is None and (closer := self.books.closed_by(ident)) is not None:
            stats.refused_after_undo += 1
            return _Reply.error(409, f"{key} was already undone by {closer}; not applied")
        headers: dict[str, str] = {}
        entry = self.books.find(ident)
        if entry is not None:
            stats.replays += 1
            headers["Idempotent-Replayed"] = "true"
        else:
            # No call number here: every retry of this key gets the same business answer.
            rate = faults.permanent_rate if undo is None else faults.undo_permanent_rate
            if chance(seed, "permanent", *dice) < rate:
                stats.permanent_failures += 1
                return _Reply.error(*refusal(service, undo=undo is not None))
            entry = self._apply(ident, payload, undo)
        delay = 0.0
        if chance(seed, "slow", *dice, call) < faults.slow_rate:
            stats.slow += 1
            delay = faults.slow_seconds
        return _Reply(200, entry.response(), headers, delay)

    def _apply(self, ident: Key, payload: dict[str, Any], undo: tuple[str, str] | None) -> Entry:
        raw_order = payload.get("order_id")
        order_id = raw_order if isinstance(raw_order, str) else None
        now = self.clock.now()
        if undo is None:
            return self.books.record_do(ident, order_id, now)
        return self.books.record_undo(ident, order_id, *undo, now)


def _undo_of(payload: dict[str, Any]) -> tuple[str, str] | None:
    """(original_action, original_key) if the payload asks to undo an earlier do."""
    original_action = payload.get("original_action")
    original_key = payload.get("original_key")
    if original_action is None and original_key is None:
        return None
    if not (isinstance(original_action, str) and original_action):
        raise ValueError("an undo needs original_action (a non-empty string)")
    if not (isinstance(original_key, str) and original_key):
        raise ValueError("an undo needs original_key (a non-empty string)")
    return original_action, original_key


def create_app(
    faults: FaultConfig | None = None,
    *,
    clock: Clock | None = None,
    sleep: Sleep = asyncio.sleep,
    faults_fixed: str | None = None,
    docs: bool = True,
    services: Collection[str] | None = None,
) -> FastAPI:
    """The simulator's app. ``faults_fixed``: ``PUT /faults`` is refused (403) with this reason,
    where the faults are set only at start (the simulator deployed to Azure, open to anyone);
    ``docs``: serve its OpenAPI schema and reference pages; ``services``: the only services it
    plays (a call to another is answered 404 naming it, and applies nothing); None: any."""
    app = FastAPI(
        title="sas remote service simulator",
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    real_clock = clock or SystemClock()
    sim = _Simulator(Books(), real_clock, faults or FaultConfig(), real_clock.now())
    played = None if services is None else sorted(set(services))

    def not_played(service: str) -> JSONResponse | None:
        if played is None or service in played:
            return None
        detail = (
            f"this simulator does not play service {service!r}; it plays "
            f"{', '.join(played) or 'none'}: give {service!r} a URL of its own"
        )
        return JSONResponse({"detail": detail}, status_code=404)

    @app.get("/health")
    async def health() -> dict[str, str | list[str]]:
        return {"status": "ok"} if played is None else {"status": "ok", "services": played}

    @app.get("/faults", response_model=FaultConfig)
    async def get_faults() -> JSONResponse:
        return _faults_reply(sim)

    @app.put("/faults", response_model=FaultConfig)
    async def put_faults(config: FaultConfig) -> JSONResponse:
        if faults_fixed is not None:
            return JSONResponse({"detail": faults_fixed}, status_code=403)
        sim.set_faults(config)
        return _faults_reply(sim)

    @app.get("/ledger", response_model=LedgerView)
    async def ledger() -> LedgerView:
        stats = sim.books.all_stats()
        return LedgerView(
            effects=sim.books.entries(),
            replays=sum(s.replays for s in stats.values()),
            stats=stats,
            faults=sim.faults,
        )

    @app.get("/stats", response_model=dict[str, ServiceStats])
    async def stats() -> dict[str, ServiceStats]:
        return sim.books.all_stats()

    @app.get("/calls")
    async def calls() -> dict[str, list[datetime]]:
        """When each idempotency key was called."""
        return sim.books.called_at()

    @app.get("/endpoints", response_model=dict[str, EndpointStats])
    async def endpoints() -> dict[str, EndpointStats]:
        return sim.endpoints

    @app.post("/endpoints/{endpoint}/{service}/{action}")
    async def perform_at(
        endpoint: Name,
        service: Name,
        action: Name,
        payload: dict[str, Any],
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> JSONResponse:
        if (unknown := not_played(service)) is not None:
            return unknown
        refused = sim.enter(endpoint)
        if refused is not None:
            return JSONResponse(refused.body, status_code=refused.status, headers=refused.headers)
        try:
            reply = sim.decide(service, action, idempotency_key, payload)
            wait = reply.delay + sim.latency(endpoint)
            if wait > 0:
                await sleep(wait)
        finally:
            sim.leave(endpoint)
        return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)

    @app.post("/{service}/{action}")
    async def perform(
        service: Name,
        action: Name,
        payload: dict[str, Any],
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> JSONResponse:
        if (unknown := not_played(service)) is not None:
            return unknown
        reply = sim.decide(service, action, idempotency_key, payload)
        if reply.delay > 0:
            await sleep(reply.delay)  # the effect is already applied: only the answer is late
        return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)

    return app


def _faults_reply(sim: _Simulator) -> JSONResponse:
    # The set time is a header so the body stays exactly what PUT /faults accepts.
    return JSONResponse(
        sim.faults.model_dump(mode="json"),
        headers={"Faults-Set-At": sim.faults_set_at.isoformat()},
    )

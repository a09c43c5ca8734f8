"""A simulated remote provider (inventory, payment, shipping) for local runs and tests.

`POST /{service}/{action}` applies an effect at most once per Idempotency-Key and keeps a
ledger of applied effects that tests and the demo read back (`GET /ledger`). A repeated key
returns the original response, marked `Idempotent-Replayed: true`, and applies nothing.

Run: `python -m sas.simulator --port 7081`.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Path, Response
from pydantic import BaseModel, ConfigDict

Name = Annotated[str, Path(pattern=r"^[a-z][a-z0-9]{1,30}$")]


class Effect(BaseModel):
    model_config = ConfigDict(frozen=True)

    effect_id: str
    service: str
    action: str
    idempotency_key: str
    order_id: str | None
    applied_at: datetime


class Ledger(BaseModel):
    effects: list[Effect]
    replays: int


def create_app() -> FastAPI:
    app = FastAPI(title="sas remote service simulator")
    effects: dict[tuple[str, str, str], Effect] = {}
    replays = {"count": 0}
    lock = asyncio.Lock()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/{service}/{action}")
    async def perform(
        service: Name,
        action: Name,
        payload: dict[str, Any],
        response: Response,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        if not idempotency_key:
            raise HTTPException(400, "Idempotency-Key header is required")
        key = (service, action, idempotency_key)
        async with lock:
            effect = effects.get(key)
            if effect is not None:
                replays["count"] += 1
                response.headers["Idempotent-Replayed"] = "true"
            else:
                order_id = payload.get("order_id")
                effect = Effect(
                    effect_id=uuid.uuid4().hex,
                    service=service,
                    action=action,
                    idempotency_key=idempotency_key,
                    order_id=order_id if isinstance(order_id, str) else None,
                    applied_at=datetime.now(UTC),
                )
                effects[key] = effect
        return {"effect_id": effect.effect_id, "service": service, "action": action}

    @app.get("/ledger", response_model=Ledger)
    async def ledger() -> Ledger:
        return Ledger(effects=list(effects.values()), replays=replays["count"])

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Simulated remote service for sas")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7081)
    args = parser.parse_args()
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

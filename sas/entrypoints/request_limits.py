"""What every route of the HTTP API refuses before it reads anything: a query parameter it does
not take (a typo would otherwise be ignored and filter nothing) and a body over a size."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

FUNCTION_KEY_PARAMETER = "code"
"""Azure Functions reads the function key from ``?code=``: every route takes it."""

MAX_BODY_BYTES = 1024 * 1024
"""Far over any request the API takes (an order's message is at most 64 KiB): refused
unread, with 413."""


def known_query_only(request: Request) -> None:
    """422 for a query parameter the route does not declare (its OpenAPI entry)."""
    route = request.scope.get("route")
    declared = _declared(request.app, getattr(route, "path", ""), request.method.lower())
    unknown = sorted(set(request.query_params) - declared - {FUNCTION_KEY_PARAMETER})
    if unknown:
        takes = ", ".join(sorted(declared)) or "none"
        raise RequestValidationError(
            [
                {
                    "type": "extra_forbidden",
                    "loc": ("query", name),
                    "msg": f"unknown query parameter: this route takes {takes}",
                }
                for name in unknown
            ]
        )


@cache
def _declared(app: FastAPI, path: str, method: str) -> frozenset[str]:
    operation: dict[str, Any] = app.openapi().get("paths", {}).get(path, {}).get(method, {})
    return frozenset(
        parameter["name"]
        for parameter in operation.get("parameters", [])
        if parameter.get("in") == "query"
    )


class BodyLimit:
    """Reads a request's body up to MAX_BODY_BYTES before the app sees it; past that, 413."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _too_large(send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > MAX_BODY_BYTES:
                await _too_large(send)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _too_large(send: Send) -> None:
    body = json.dumps({"detail": f"the body is over {MAX_BODY_BYTES} bytes"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

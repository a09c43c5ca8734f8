"""HTTP triggers behind uvicorn: ASGI request -> ``func.HttpRequest`` -> function -> response.

Auth levels are not enforced (like ``func start``). ``GET /_devhost/health`` is the dev host's
own readiness route.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import azure.functions as func
import uvicorn

from sas_local.devhost.config import DevHostError
from sas_local.devhost.http_routes import Route
from sas_local.devhost.invoke import InvocationContext, arguments, call_async, call_sync

log = logging.getLogger(__name__)

HEALTH_PATH = "/_devhost/health"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class DevHostAsgi:
    """The ASGI app uvicorn serves: routes requests to the app's HTTP functions."""

    def __init__(
        self, routes: list[Route], function_app: Any, app_dir: Path, health: dict[str, Any]
    ) -> None:
        self._routes = routes
        self._function_app = function_app
        self._app_dir = app_dir
        self._health = health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._shutdown_function_app()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _shutdown_function_app(self) -> None:
        """Tell an AsgiFunctionApp's inner app it is shutting down, on the loop it started on."""
        app = self._function_app
        middleware = getattr(app, "middleware", None)
        if not getattr(app, "startup_task_done", False) or middleware is None:
            return
        try:
            await asyncio.wait_for(middleware.notify_shutdown(), timeout=5)
        except Exception as exc:
            log.warning("sas.devhost.asgi_shutdown_failed", extra={"error": type(exc).__name__})
        app.startup_task_done = False  # its __del__ would otherwise start a new loop at exit

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = str(scope["method"]).upper()
        path = str(scope["path"])
        if path == HEALTH_PATH and method in ("GET", "HEAD"):
            payload = json.dumps({**self._health, "pid": os.getpid()}).encode()
            await _respond(send, 200, [("content-type", "application/json")], payload)
            return
        body = await _read_body(receive)
        for route in self._routes:
            route_params = route.match(path)
            if route_params is None or method not in route.function.methods:
                continue
            response = await self._invoke(route, route_params, scope, method, body)
            await _respond(send, *response)
            return
        await _respond(send, 404, [("content-type", "text/plain")], b"Not Found")

    async def _invoke(
        self,
        route: Route,
        route_params: dict[str, str],
        scope: Scope,
        method: str,
        body: bytes,
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        function = route.function
        request = _to_request(scope, method, route_params, body)
        context = InvocationContext(function.name, self._app_dir)
        kwargs = arguments(function.fn, function.arg_name, request, context)
        fields = {"function": function.name, "invocation_id": context.invocation_id}
        started = time.monotonic()
        try:
            if inspect.iscoroutinefunction(function.fn):
                result = await call_async(function.fn(**kwargs), context.invocation_id)
            else:
                result = await asyncio.to_thread(
                    call_sync, function.fn, kwargs, context.invocation_id
                )
        except Exception:
            log.exception("sas.devhost.http_invocation_failed", extra=fields)
            return 500, [("content-type", "text/plain")], b"Internal Server Error"
        elapsed = round((time.monotonic() - started) * 1000, 1)
        log.debug("sas.devhost.http_invoked", extra={**fields, "duration_ms": elapsed})
        return _from_response(result, function.name)


def _to_request(
    scope: Scope, method: str, route_params: dict[str, str], body: bytes
) -> func.HttpRequest:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1")
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    host = headers.get("host") or "{}:{}".format(*(scope.get("server") or ("127.0.0.1", 80)))
    raw_path = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else str(scope["path"])
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    url = f"{scope.get('scheme', 'http')}://{host}{path}" + (f"?{query}" if query else "")
    params = dict(parse_qsl(query, keep_blank_values=True))
    return func.HttpRequest(
        method, url, headers=headers, params=params, route_params=route_params, body=body
    )


def _from_response(result: object, function: str) -> tuple[int, list[tuple[str, str]], bytes]:
    if isinstance(result, func.HttpResponse):
        headers = [
            (str(name), str(value))
            for name, value in result.headers.items()
            if str(name).lower() not in ("content-length", "transfer-encoding")
        ]
        if not any(name.lower() == "content-type" for name, _ in headers):
            mimetype = result.mimetype or "text/plain"
            charset = result.charset
            content_type = f"{mimetype}; charset={charset}" if charset else mimetype
            headers.append(("content-type", content_type))
        return int(result.status_code), headers, result.get_body() or b""
    if isinstance(result, str | bytes):
        data = result.encode() if isinstance(result, str) else result
        return 200, [("content-type", "text/plain; charset=utf-8")], data
    log.error(
        "sas.devhost.http_bad_return",
        extra={"function": function, "type": type(result).__name__},
    )
    return 500, [("content-type", "text/plain")], b"function returned no HttpResponse"


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _respond(send: Send, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
    raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class HttpServer:
    """uvicorn on 127.0.0.1 in a background thread (signals stay with the worker)."""

    def __init__(self, app: DevHostAsgi, port: int, grace: float) -> None:
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            lifespan="on",
            access_log=False,
            log_config=None,
            timeout_graceful_shutdown=max(1, int(grace)),
        )
        self.port = port
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="devhost-http", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise DevHostError(f"HTTP server could not listen on 127.0.0.1:{self.port}")
            if time.monotonic() > deadline:
                raise DevHostError(
                    f"HTTP server not listening on port {self.port} after {timeout}s"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True

    def wait_idle(self, deadline: float) -> bool:
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

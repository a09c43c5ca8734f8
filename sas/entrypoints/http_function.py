"""The HTTP API's one Azure Functions HTTP trigger, as ``func.AsgiFunctionApp`` registers it
(same name and route), with one guard: the worker decodes a request's path as UTF-8 before the
API sees it, so a path that is not valid UTF-8 (``/api/orders/%FF``) would fail the invocation
(500); it is answered 400 here."""

from __future__ import annotations

import json

import azure.functions as func

from sas.entrypoints.http_api import api

FUNCTION_NAME = "http_app_func"

blueprint = func.Blueprint(http_auth_level=func.AuthLevel.FUNCTION)  # type: ignore[no-untyped-call]
_middleware = func.AsgiMiddleware(api)  # type: ignore[no-untyped-call]  # no I/O at import
_BAD_URL = json.dumps({"detail": "the request's path or query is not valid UTF-8"})


@blueprint.function_name(name=FUNCTION_NAME)
@blueprint.http_type(http_type="asgi")
@blueprint.route(route="/{*route}", methods=list(func.HttpMethod))
async def http_app_func(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    try:
        response: func.HttpResponse = await _middleware.handle_async(req, context)
    except UnicodeDecodeError:
        return func.HttpResponse(_BAD_URL, status_code=400, mimetype="application/json")
    return response

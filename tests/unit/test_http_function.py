"""The app's HTTP trigger: a path the worker cannot decode as UTF-8 is a 400, not a failed
invocation; any other request reaches the API."""

from __future__ import annotations

import asyncio
import json

import azure.functions as func
import pytest

from sas.entrypoints.http_function import http_app_func

pytestmark = pytest.mark.unit


def call(method: str, url: str) -> func.HttpResponse:
    request = func.HttpRequest(method, url, headers={}, body=b"")
    response: func.HttpResponse = asyncio.run(http_app_func(request, None))
    return response


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/api/orders/%ED%A0%80"), ("DELETE", "/api/parked/%FF")]
)
def test_a_path_that_is_not_utf8_is_refused_with_400(method: str, path: str) -> None:
    response = call(method, f"http://localhost{path}")
    assert response.status_code == 400
    assert "not valid UTF-8" in json.loads(response.get_body())["detail"]


def test_any_other_request_reaches_the_api() -> None:
    response = call("GET", "http://localhost/api/health")
    assert response.status_code == 200 and json.loads(response.get_body()) == {"status": "ok"}

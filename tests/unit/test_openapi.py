"""docs/openapi.json is the schema the app serves, and documents what the dashboard uses."""

from __future__ import annotations

import json

import pytest

from sas_local.openapi import DOC, schema_text

pytestmark = pytest.mark.unit


def test_the_committed_schema_is_the_apps_own() -> None:
    assert DOC.read_text(encoding="utf-8") == schema_text(), "stale: run `make openapi`"


def test_every_route_the_dashboard_calls_is_documented_with_a_description() -> None:
    paths = json.loads(schema_text())["paths"]
    for path, method in [
        ("/api/stats", "get"),
        ("/api/orders", "get"),
        ("/api/orders/{order_id}", "get"),
        ("/api/orders/{order_id}/resubmit", "post"),
        ("/api/orders/{order_id}/close", "post"),
        ("/api/orders/resubmit", "post"),
        ("/api/parked", "get"),
        ("/api/parked/{parked_id}/replay", "post"),
        ("/api/parked/{parked_id}", "delete"),
        ("/api/parked/replay", "post"),
        ("/api/parked/discard", "post"),
        ("/api/health/report", "get"),
        ("/api/dashboard", "get"),
    ]:
        assert paths[path][method]["description"], f"{method.upper()} {path}"
    filters = {p["name"] for p in paths["/api/orders"]["get"]["parameters"]}
    assert filters == {
        "state", "priority", "workflow", "older_than_seconds", "newer_than_seconds",
        "submitted_from", "submitted_until", "step", "error", "limit", "offset",
    }  # fmt: skip
    parked = {p["name"] for p in paths["/api/parked"]["get"]["parameters"]}
    assert parked == {"parked_by", "queue", "reason", "older_than_seconds", "limit"}


def test_parked_messages_have_one_api_and_one_view() -> None:
    schema = json.loads(schema_text())
    paths = schema["paths"]
    assert not [path for path in paths if path.startswith(("/api/rejected", "/api/poison"))]
    view = schema["components"]["schemas"]["ParkedView"]["properties"]
    assert view["parked_by"]["enum"] == ["app", "host"]
    stats = schema["components"]["schemas"]["StatsView"]["properties"]
    assert {"parked", "parked_more"} <= set(stats)
    assert not {"rejected", "poisoned"} & set(stats)

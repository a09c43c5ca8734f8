"""The API's reference page (GET /api/docs), rendered on the server from its OpenAPI schema.

Nothing is fetched from elsewhere, and no script runs: the page reads with no network (an
interactive explorer would load its code from a CDN) and needs no second request for the
schema, which in Azure would need the function key again.
"""

from __future__ import annotations

from html import escape
from typing import Any

CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'"
_STYLE = (
    "body{font:14px/1.5 system-ui,sans-serif;margin:2rem auto;max-width:60rem;padding:0 1rem}"
    "code{background:#f3f3f3;padding:0 .2em}h2{margin-top:2rem;font-size:1.1rem}"
    "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.2em .5em;"
    "text-align:left;vertical-align:top}.method{font-weight:bold;text-transform:uppercase}"
)


def page(schema: dict[str, Any], schema_link: str, note: str) -> str:
    """The whole page: each route's method, path, summary, parameters, body and answers."""
    info = schema.get("info", {})
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{escape(info.get('title', 'API'))} API</title><style>{_STYLE}</style></head>",
        f"<body><h1>{escape(info.get('title', 'API'))} API {escape(info.get('version', ''))}</h1>",
        f"<p>{escape(info.get('description', ''))}</p>",
        f'<p>The schema: <a href="{escape(schema_link)}">openapi.json</a> ({escape(note)}).</p>',
    ]
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            parts += _operation(method, path, operation)
    parts.append("</body></html>")
    return "".join(parts)


def _operation(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    anchor = f"{method}-{path}".replace("/", "-").replace("{", "").replace("}", "")
    parts = [
        f'<h2 id="{escape(anchor)}"><span class=method>{escape(method)}</span> '
        f"<code>{escape(path)}</code> {escape(operation.get('summary', ''))}</h2>",
        f"<p>{escape(operation.get('description', ''))}</p>",
    ]
    parameters = operation.get("parameters", [])
    if parameters:
        parts.append("<table><tr><th>Parameter</th><th>In</th><th>Type</th><th>About</th></tr>")
        for parameter in parameters:
            required = " (required)" if parameter.get("required") else ""
            parts.append(
                f"<tr><td><code>{escape(parameter['name'])}</code>{required}</td>"
                f"<td>{escape(parameter.get('in', ''))}</td>"
                f"<td>{escape(_type(parameter.get('schema', {})))}</td>"
                f"<td>{escape(parameter.get('description', ''))}</td></tr>"
            )
        parts.append("</table>")
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if body:
        parts.append(f"<p>Body: <code>{escape(_type(body.get('schema', {})))}</code> (JSON)</p>")
    answers = ", ".join(
        f"{escape(code)} {escape(answer.get('description', ''))}"
        for code, answer in operation.get("responses", {}).items()
    )
    parts.append(f"<p>Answers: {answers}</p>")
    return parts


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_type(option) for option in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list of {_type(schema.get('items', {}))}"
    return str(schema.get("type", "any"))

"""The operator CLI, `sas`, over the HTTP API (so it works locally and against Azure).

  sas [--url URL] [--key KEY] orders list --state Error
  sas orders show ORDER_ID
  sas orders resubmit ORDER_ID [--actor NAME]
  sas rejected list | replay ID | discard ID
  sas poison list | replay ID | discard ID

--url defaults to $SAS_API_URL or http://127.0.0.1:7071; --key to $SAS_API_KEY (sent as the
x-functions-key header). --json prints the raw JSON instead of tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx
from rich.console import Console
from rich.table import Table

from sas.domain.model import ProcessState

console = Console()


def _client(url: str, key: str | None) -> httpx.Client:
    headers = {"x-functions-key": key} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    return table


def run(argv: Sequence[str] | None = None, client: httpx.Client | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sas", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("SAS_API_URL", "http://127.0.0.1:7071"))
    parser.add_argument("--key", default=os.environ.get("SAS_API_KEY"))
    parser.add_argument("--json", action="store_true", help="print raw JSON")
    nouns = parser.add_subparsers(dest="noun", required=True)
    orders = nouns.add_parser("orders").add_subparsers(dest="verb", required=True)
    listing = orders.add_parser("list", help="orders in one state")
    listing.add_argument("--state", required=True, choices=[s.value for s in ProcessState])
    listing.add_argument("--limit", type=int, default=100)
    orders.add_parser("show", help="one order: state, steps, history").add_argument("order_id")
    again = orders.add_parser("resubmit", help="run a failed (Error) order again")
    again.add_argument("order_id")
    again.add_argument("--actor", default=os.environ.get("USER", "operator"))
    for noun in MESSAGE_NOUNS:
        _add_message_noun(nouns, noun)
    args = parser.parse_args(argv)
    http = client or _client(args.url, args.key)
    try:
        response = _request(http, args)
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach {args.url}[/]: {type(exc).__name__}")
        return 1
    if response.status_code >= 400:
        detail = response.json().get("detail") if _is_json(response) else response.text
        console.print(f"[red]{response.status_code}[/]: {detail}")
        return 1
    body = response.json()
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        _render(args, body)
    return 0


def _request(http: httpx.Client, args: argparse.Namespace) -> httpx.Response:
    if args.noun in MESSAGE_NOUNS:
        return _message_request(http, args)
    if args.verb == "list":
        return http.get("/api/orders", params={"state": args.state, "limit": args.limit})
    # Quoted whole: an id with '#', '?' or '/' must never address another order or route.
    order = quote(args.order_id, safe="")
    if args.verb == "show":
        return http.get(f"/api/orders/{order}")
    return http.post(f"/api/orders/{order}/resubmit", json={"actor": args.actor})


def _render(args: argparse.Namespace, body: Any) -> None:
    if args.noun in MESSAGE_NOUNS:
        _render_messages(args, body)
    elif args.verb == "list":
        orders = [
            (o["order_id"], o["process_state"], o.get("priority", "normal"), o["step"],
             o["attempt"], o["failure_count"], o["last_error"])
            for o in body
        ]  # fmt: skip
        columns = ("order", "state", "priority", "step", "attempt", "failures", "last error")
        console.print(_table(f"orders in {args.state}", columns, orders))
    elif args.verb == "show":
        console.print(
            f"[bold]{body['order_id']}[/] {body['process_state']} at {body['step']} "
            f"({body['mode']}), attempt {body['attempt']}, failures {body['failure_count']}, "
            f"priority {body.get('priority', 'normal')}"
            + (f", endpoint {body['endpoint']}" if body.get("endpoint") else "")
        )
        if body["last_error"]:
            console.print(f"last error: {body['last_error']}")
        steps = [(s["index"], s["name"], s["attempt"], s["completed_at"]) for s in body["steps"]]
        console.print(_table("completed steps", ("#", "step", "attempt", "at"), steps))
        history = [
            (h["at"], h["kind"], h["step"], h["mode"], h["attempt"], h.get("endpoint"),
             h["actor"], h["detail"])
            for h in body["history"]
        ]  # fmt: skip
        events = ("at", "event", "step", "mode", "attempt", "endpoint", "by", "detail")
        console.print(_table("history", events, history))
    else:
        console.print(f"resubmitted {body['order_id']}: now {body['process_state']}")


# Parked (rejected) and poisoned messages are two stores with the same three verbs.
MESSAGE_NOUNS = {
    "rejected": (
        "/api/rejected",
        "messages the app parked",
        "send one back to its queue as it was",
    ),
    "poison": (
        "/api/poison",
        "messages the host gave up on",
        "send one back to its queue unchanged",
    ),
}


def _add_message_noun(nouns: Any, noun: str) -> None:
    _, about, replay = MESSAGE_NOUNS[noun]
    verbs = nouns.add_parser(noun, help=about).add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help=about).add_argument("--limit", type=int, default=100)
    verbs.add_parser("replay", help=replay).add_argument("message_id")
    verbs.add_parser("discard", help="delete one for good").add_argument("message_id")


def _message_request(http: httpx.Client, args: argparse.Namespace) -> httpx.Response:
    path = MESSAGE_NOUNS[args.noun][0]
    if args.verb == "list":
        return http.get(path, params={"limit": args.limit})
    # Quoted whole, like an order id: an id must never address another route.
    message = quote(args.message_id, safe="")
    if args.verb == "replay":
        return http.post(f"{path}/{message}/replay")
    return http.delete(f"{path}/{message}")


def _render_messages(args: argparse.Namespace, body: Any) -> None:
    if args.verb != "list":
        console.print(f"{body['status']} {body['id']}")
        return
    if args.noun == "rejected":
        title, columns = "rejected messages", ("#", "at", "queue", "age", "reason", "body")
        cells = [(m["at"], m["queue"], _age(m["age_seconds"]), m["reason"]) for m in body]
    else:
        title = "poison and dead-lettered messages"
        columns = ("#", "queue", "age", "deliveries", "reason", "body")
        cells = [
            (m["queue"], _age(m["age_seconds"]), m["delivery_count"], m["reason"]) for m in body
        ]
    rows = [
        (number, *cell, (m["body_text"] if m["body_text"] is not None else "<binary>")[:60])
        for number, (cell, m) in enumerate(zip(cells, body, strict=True), 1)
    ]
    console.print(_table(title, columns, rows))
    for number, m in enumerate(body, 1):  # ids in full, never wrapped: to copy into replay
        console.print(f"#{number} {m['id']}", soft_wrap=True, highlight=False)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m"
    if whole < 172800:
        return f"{whole // 3600}h"
    return f"{whole // 86400}d"


def _is_json(response: httpx.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.startswith("application/json")


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()

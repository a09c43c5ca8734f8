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
    _add_rejected(nouns)
    _add_poison(nouns)
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
    if args.noun == "rejected":
        return _rejected_request(http, args)
    if args.noun == "poison":
        return _poison_request(http, args)
    if args.verb == "list":
        return http.get("/api/orders", params={"state": args.state, "limit": args.limit})
    # Quoted whole: an id with '#', '?' or '/' must never address another order or route.
    order = quote(args.order_id, safe="")
    if args.verb == "show":
        return http.get(f"/api/orders/{order}")
    return http.post(f"/api/orders/{order}/resubmit", json={"actor": args.actor})


def _render(args: argparse.Namespace, body: Any) -> None:
    if args.noun == "rejected":
        _render_rejected(args, body)
    elif args.noun == "poison":
        _render_poison(args, body)
    elif args.verb == "list":
        orders = [
            (o["order_id"], o["process_state"], o["step"], o["attempt"], o["failure_count"],
             o["last_error"])
            for o in body
        ]  # fmt: skip
        columns = ("order", "state", "step", "attempt", "failures", "last error")
        console.print(_table(f"orders in {args.state}", columns, orders))
    elif args.verb == "show":
        console.print(
            f"[bold]{body['order_id']}[/] {body['process_state']} at {body['step']} "
            f"({body['mode']}), attempt {body['attempt']}, failures {body['failure_count']}"
        )
        if body["last_error"]:
            console.print(f"last error: {body['last_error']}")
        steps = [(s["index"], s["name"], s["attempt"], s["completed_at"]) for s in body["steps"]]
        console.print(_table("completed steps", ("#", "step", "attempt", "at"), steps))
        history = [
            (h["at"], h["kind"], h["step"], h["mode"], h["attempt"], h["actor"], h["detail"])
            for h in body["history"]
        ]
        events = ("at", "event", "step", "mode", "attempt", "by", "detail")
        console.print(_table("history", events, history))
    else:
        console.print(f"resubmitted {body['order_id']}: now {body['process_state']}")


def _add_rejected(nouns: Any) -> None:
    rejected = nouns.add_parser("rejected", help="messages the app parked").add_subparsers(
        dest="verb", required=True
    )
    rejected.add_parser("list", help="messages parked as unprocessable").add_argument(
        "--limit", type=int, default=100
    )
    rejected.add_parser("replay", help="send one back to its queue as it was").add_argument(
        "parked_id"
    )
    rejected.add_parser("discard", help="delete one for good").add_argument("parked_id")


def _rejected_request(http: httpx.Client, args: argparse.Namespace) -> httpx.Response:
    if args.verb == "list":
        return http.get("/api/rejected", params={"limit": args.limit})
    # Quoted whole, like an order id: an id must never address another route.
    parked = quote(args.parked_id, safe="")
    if args.verb == "replay":
        return http.post(f"/api/rejected/{parked}/replay")
    return http.delete(f"/api/rejected/{parked}")


def _render_rejected(args: argparse.Namespace, body: Any) -> None:
    if args.verb != "list":
        console.print(f"{body['status']} {body['id']}")
        return
    rows = [
        (
            number,
            r["at"],
            r["queue"],
            _age(r["age_seconds"]),
            r["reason"],
            (r["body_text"] if r["body_text"] is not None else "<binary>")[:60],
        )
        for number, r in enumerate(body, 1)
    ]
    columns = ("#", "at", "queue", "age", "reason", "body")
    console.print(_table("rejected messages", columns, rows))
    for number, r in enumerate(body, 1):  # ids in full, never wrapped: to copy into replay
        console.print(f"#{number} {r['id']}", soft_wrap=True, highlight=False)


def _add_poison(nouns: Any) -> None:
    poison = nouns.add_parser("poison", help="messages the host gave up on").add_subparsers(
        dest="verb", required=True
    )
    poison.add_parser("list", help="poison and dead-lettered messages").add_argument(
        "--limit", type=int, default=100
    )
    poison.add_parser("replay", help="send one back to its queue unchanged").add_argument(
        "poison_id"
    )
    poison.add_parser("discard", help="delete one for good").add_argument("poison_id")


def _poison_request(http: httpx.Client, args: argparse.Namespace) -> httpx.Response:
    if args.verb == "list":
        return http.get("/api/poison", params={"limit": args.limit})
    # Quoted whole, like an order id: an id must never address another route.
    poisoned = quote(args.poison_id, safe="")
    if args.verb == "replay":
        return http.post(f"/api/poison/{poisoned}/replay")
    return http.delete(f"/api/poison/{poisoned}")


def _render_poison(args: argparse.Namespace, body: Any) -> None:
    if args.verb != "list":
        console.print(f"{body['status']} {body['id']}")
        return
    rows = [
        (
            number,
            p["queue"],
            _age(p["age_seconds"]),
            p["delivery_count"],
            p["reason"],
            (p["body_text"] if p["body_text"] is not None else "<binary>")[:60],
        )
        for number, p in enumerate(body, 1)
    ]
    columns = ("#", "queue", "age", "deliveries", "reason", "body")
    console.print(_table("poison and dead-lettered messages", columns, rows))
    for number, p in enumerate(body, 1):  # ids in full, never wrapped: to copy into replay
        console.print(f"#{number} {p['id']}", soft_wrap=True, highlight=False)


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

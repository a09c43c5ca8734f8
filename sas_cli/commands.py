"""The operator CLI, `sas`: reads and changes the app's store and queues itself, through the
app's own services, with the app's settings (see sas_cli/appsettings.py).

  sas submit WORKFLOW DETAILS [--priority P] [--status-events steps] [--order-id ID]
  sas status ORDER_ID | history ORDER_ID
  sas list [--state S] [--priority P] [--step S] [--error TEXT] [--older-than 2h] [--limit N]
  sas resubmit ORDER_ID [--actor NAME]
  sas resubmit --all [--priority P] [--step S] [--error TEXT] [--older-than 2h] [--yes]
  sas close ORDER_ID --reason TEXT [--actor NAME]
  sas cancel|terminate ORDER_ID --reason TEXT [--actor NAME]
  sas suspend|resume ORDER_ID [--reason TEXT] [--actor NAME]
  sas parked list [--by app|host] [--queue Q] [--reason TEXT] [--older-than 1h] [--limit N]
  sas parked replay ID | discard ID
  sas parked replay|discard --all [the list's filters] [--yes]
  sas purge [ORDER_ID ...] [--older-than 30d] [--state S] [--yes]
  sas audit [--action A] [--actor NAME] [--target ID] [--limit N]
  sas watch [--interval S] [--iterations N]
  sas health [--minutes N] [--alerts N]
  sas alerts | acknowledge ALERT_ID ... [--note TEXT] [--actor NAME]

Exit codes: 0 done, 1 not found or refused, 2 bad input (nothing changed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from azure.core.exceptions import AzureError
from pydantic import ValidationError
from rich.console import Console

from sas import bootstrap
from sas.domain.errors import (
    AlreadyExists,
    ConcurrencyConflict,
    ConfigurationError,
    IllegalTransition,
    InvalidMessage,
    NotFound,
)
from sas.domain.messages import OrderSubmitted
from sas.domain.model import AUDIT_ACTIONS, OrderState, ProcessState
from sas.domain.wire import DEFAULT_PRIORITY, ORDER_ID, PRIORITIES
from sas.entrypoints.health_api import AlertGroupView
from sas.entrypoints.params import MAX_OFFSET
from sas.entrypoints.parked_api import bulk_parked_view
from sas.services import alert_book
from sas.services.health import MAX_WINDOW
from sas.services.operator import MAX_QUERY_LIMIT, PURGEABLE_STATES, Operator, OrderQuery
from sas.services.parked_messages import ParkedQuery
from sas_cli import appsettings, views
from sas_cli.parsing import UsageError, duration, instant, json_object
from sas_cli.watch import watch

# Piped output (a file, grep, less) has no width: wide enough that tables are not folded to 80.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)

Handler = Callable[[Operator, argparse.Namespace], int]
Command = Callable[..., Any]
"""``parser``'s ``command(name, handler, help, parent)``: a subcommand with the common options."""


class _Parser(argparse.ArgumentParser):
    """Bad usage is one line on stderr and exit code 2, from run() (never a SystemExit)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _arg(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return convert(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _state(text: str) -> ProcessState:
    for state in ProcessState:
        if state.value.lower() == text.lower():
            return state
    raise UsageError(f"unknown state {text!r}: one of {', '.join(s.value for s in ProcessState)}")


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_QUERY_LIMIT:
        raise UsageError(f"{text!r} is not a limit: a whole number from 1 to {MAX_QUERY_LIMIT}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise UsageError(f"{text!r} is not an interval: seconds from 0.1 to 3600")
    return value


def _offset(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_OFFSET:
        raise UsageError(f"{text!r} is not an offset: a whole number from 0 to {MAX_OFFSET}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{text!r} is not a count: a whole number, at least 1")
    return int(text)


def _between(low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise UsageError(f"{text!r} is not {what}: a whole number from {low} to {high}")
        return int(text)

    return parse


def _order_id(text: str) -> str:
    if not ORDER_ID.matches(text):
        raise UsageError(f"{text!r} is not an order id ({ORDER_ID.body})")
    return text


STATES = ", ".join(state.value for state in ProcessState)
LIMIT_HELP = f"at most this many, 1 to {MAX_QUERY_LIMIT}"
AGE_HELP = "a whole number and s, m, h or d, like 90s, 15m, 2h, 7d"


def _actor_name(text: str) -> str:
    name = text.strip()
    if not 1 <= len(name) <= 100:
        raise UsageError("an actor is a name of 1 to 100 characters")
    return name


def _actor_option(command: Any) -> None:
    command.add_argument(
        "--actor", type=_arg(_actor_name), default=_actor(), help="who, for the audit log"
    )


def _actor() -> str:
    return os.environ.get("USER") or os.environ.get("USERNAME") or "operator"


def parser() -> argparse.ArgumentParser:
    # The docstring's first paragraph, whole: its first line alone stops mid-sentence.
    about = " ".join((__doc__ or "").split("\n\n")[0].split())
    top = _Parser(prog="sas", description=about)
    top.add_argument(
        "--settings",
        type=Path,
        metavar="FILE",
        help="the app's settings: a local.settings.json, or what `az functionapp config "
        "appsettings list` prints (default: the environment, else .sas-run/local.settings.json, "
        "else Azurite on 127.0.0.1:10000-10002)",
    )
    top.add_argument("--json", action="store_true", help="print JSON instead of tables")
    # The same options after the command; SUPPRESS keeps them from undoing one given before it.
    common = _Parser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS,
        help="print JSON instead of tables",
    )  # fmt: skip
    common.add_argument(
        "--settings", type=Path, metavar="FILE", default=argparse.SUPPRESS,
        help="the app's settings (see sas --help)",
    )  # fmt: skip
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Handler, help: str, parent: Any = commands) -> Any:
        sub = parent.add_parser(name, help=help, description=help, parents=[common])
        sub.set_defaults(handler=handler)
        return sub

    submit = command("submit", _submit, "send an order to its lane, as an application would")
    submit.add_argument("workflow", help="the workflow's name, like 'order'")
    submit.add_argument("details", help="the order's details: JSON, or @file")
    submit.add_argument("--order-id", type=_arg(_order_id), help="default: a new random id")
    submit.add_argument("--priority", choices=PRIORITIES, default=DEFAULT_PRIORITY)
    submit.add_argument("--reply-to", metavar="QUEUE", help="your status queue")
    submit.add_argument("--status-events", choices=("outcome", "steps"), default="outcome")
    _actor_option(submit)

    command("status", _status, "one order's state").add_argument("order_id", type=_arg(_order_id))
    command("history", _history, "one order's timeline: history and completed steps").add_argument(
        "order_id", type=_arg(_order_id)
    )

    listing = command("list", _list, "orders, most recently updated first")
    listing.add_argument("--state", type=_arg(_state), help=f"in this state: {STATES}")
    _order_filters(listing)
    listing.add_argument("--limit", type=_arg(_limit), default=100, help=LIMIT_HELP)
    listing.add_argument("--offset", type=_arg(_offset), default=0, help="skip N (next page)")

    _resubmit_command(command)
    _steering_commands(command)

    _parked_commands(commands, command)

    _keeping_commands(command)
    _looking_commands(command)
    _alert_commands(command)
    _alias_commands(commands, command)
    return top


def _keeping_commands(command: Command) -> None:
    """``purge`` and ``audit``: what is kept, and the record of who changed what."""
    purge = command(
        "purge",
        _purge,
        "delete finished orders (Processed, Compensated, Closed): the ids given, or those "
        "finished longer ago than --older-than, of --state (each purge audited; a dry run "
        "unless --yes; Error orders are never purged)",
    )
    purge.add_argument("order_id", nargs="*", type=_arg(_order_id), help="only these orders")
    purge.add_argument(
        "--older-than", type=_arg(duration), metavar="AGE",
        help=f"finished more than AGE ago: {AGE_HELP}",
    )  # fmt: skip
    purge.add_argument(
        "--state", type=_arg(_state), action="append", metavar="STATE",
        help="only in this state: Processed, Compensated or Closed (again for more; default: "
        "all three)",
    )  # fmt: skip
    _actor_option(purge)
    purge.add_argument("--yes", action="store_true", help="delete them (default: only list)")
    purge.add_argument(
        "--limit", type=_arg(_limit), default=MAX_QUERY_LIMIT, help=f"{LIMIT_HELP} per run"
    )

    audit = command("audit", _audit, "operators' actions, newest first (kept after a purge)")
    audit.add_argument("--action", choices=AUDIT_ACTIONS, help="this action only")
    audit.add_argument("--actor", dest="by", metavar="NAME", help="by this actor only")
    audit.add_argument("--target", metavar="ID", help="on this order or parked message only")
    audit.add_argument("--limit", type=_arg(_limit), default=100, help=LIMIT_HELP)


def _alert_commands(command: Command) -> None:
    """Open alerts by cause, and acknowledging them."""
    command("alerts", _alerts, "open alerts, one group per workflow, step and reason")
    ack = command("acknowledge", _acknowledge, "acknowledge alerts: they are no longer open")
    ack.add_argument("alert_ids", nargs="+", metavar="ALERT_ID", help="as `sas alerts` lists")
    ack.add_argument("--note", help="what is being done about it (kept in the audit)")
    _actor_option(ack)


def _alerts(operator: Operator, args: argparse.Namespace) -> int:
    groups = alert_book.open_groups(bootstrap.store(), bootstrap.clock().now())
    if args.json:
        _print_json([AlertGroupView.of(group).model_dump(mode="json") for group in groups])
    else:
        console.print(views.alert_groups(groups))
    return 0


def _acknowledge(operator: Operator, args: argparse.Namespace) -> int:
    outcomes = alert_book.acknowledge(
        bootstrap.store(),
        bootstrap.clock().now(),
        args.alert_ids,
        actor=args.actor,
        note=args.note,
    )
    if args.json:
        _print_json(outcomes)
    else:
        for alert_id, outcome in outcomes.items():
            print(f"{alert_id}: {outcome}")
    return 0 if all(o == "acknowledged" for o in outcomes.values()) else 1


def _looking_commands(command: Command) -> None:
    """``watch`` and ``health``: how the app is doing, rather than one order."""
    live = command("watch", _watch, "counts by state and recent failures, refreshed in place")
    live.add_argument("--interval", type=_arg(_seconds), default=5.0, help="seconds")
    live.add_argument("--iterations", type=_arg(_count), help="stop after N refreshes")
    live.add_argument("--failures", type=_arg(_limit), default=10, help="how many to show")

    health = command(
        "health",
        _health,
        "orders finished per interval and the failure rate, each remote endpoint's breaker and "
        "load, and the alerts waiting in the alerts queue (exit 1 if a part cannot be read)",
    )
    longest = MAX_WINDOW // timedelta(minutes=1)
    minutes = _between(1, longest, "a window in minutes")
    health.add_argument(
        "--minutes", type=_arg(minutes), default=60, help=f"the window, 1 to {longest} (60)"
    )
    health.add_argument(
        "--alerts", type=_arg(_between(1, 100, "a count")), default=20,
        help="list at most this many waiting alerts, 1 to 100 (20)",
    )  # fmt: skip


def _resubmit_command(command: Any) -> None:
    """``resubmit`` (one order, or every one matching) and ``close``: what an operator does
    with an Error order."""
    again = command(
        "resubmit",
        _resubmit,
        "run an Error order's failed step again; with --all, every Error order matching the "
        "filters (a dry run unless --yes)",
    )
    again.add_argument("order_id", nargs="?", type=_arg(_order_id))
    _actor_option(again)
    again.add_argument("--all", action="store_true", help="every Error order the filters match")
    _order_filters(again)
    again.add_argument("--limit", type=_arg(_limit), help="with --all: at most (default 100)")
    again.add_argument("--yes", action="store_true", help="with --all: resubmit (default: list)")
    closing = command("close", _close, "close an Error order settled by hand, with the reason")
    closing.add_argument("order_id", type=_arg(_order_id))
    closing.add_argument("--reason", required=True, help="how it was settled (kept in history)")
    _actor_option(closing)


def _steering_commands(command: Any) -> None:
    """What an operator does with a live order."""
    for name, act, about, reason_help in (
        ("cancel", _cancel, "cancel a live (or Error) order: what it did is undone in reverse, "
         "a step still running first finishes; it ends Cancelled", "why (kept in history)"),
        ("terminate", _terminate, "end a live order now and undo nothing (what cancel cannot "
         "settle); a step still running is fenced off", "why (kept in history)"),
        ("suspend", _suspend, "suspend a live order: nothing new is dispatched and no deadline "
         "expires it until resumed", "why (optional, kept in history)"),
        ("resume", _resume, "resume a suspended order from where it stood",
         "why (optional, kept in history)"),
    ):  # fmt: skip
        steer = command(name, act, about)
        steer.add_argument("order_id", type=_arg(_order_id))
        required = name in ("cancel", "terminate")
        steer.add_argument("--reason", required=required, help=reason_help)
        _actor_option(steer)


def _cancel(operator: Operator, args: argparse.Namespace) -> int:
    state = operator.cancel(args.order_id, actor=args.actor, reason=args.reason)
    then = "being undone" if not state.is_terminal else state.process_state.value
    return _changed(args, state, f"cancelled {state.order_id}: {then}")


def _terminate(operator: Operator, args: argparse.Namespace) -> int:
    state = operator.terminate(args.order_id, actor=args.actor, reason=args.reason)
    return _changed(args, state, f"terminated {state.order_id}: nothing undone")


def _suspend(operator: Operator, args: argparse.Namespace) -> int:
    state = operator.suspend(args.order_id, actor=args.actor, reason=args.reason)
    return _changed(args, state, f"suspended {state.order_id} at step {state.step}")


def _resume(operator: Operator, args: argparse.Namespace) -> int:
    state = operator.resume(args.order_id, actor=args.actor, reason=args.reason)
    return _changed(args, state, f"resumed {state.order_id}: now {state.process_state.value}")


def _parked_commands(commands: Any, command: Command) -> None:
    about = (
        "parked messages: bad input the app refused (by app) and messages the host gave up on "
        "in poison / dead-letter queues (by host)"
    )
    verbs = commands.add_parser("parked", help=about, description=about).add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    listing = command("list", _parked_list, f"{about}, oldest first", verbs)
    _parked_filters(listing)
    listing.add_argument("--limit", type=_arg(_limit), default=100, help=LIMIT_HELP)
    for verb, handler, help in (
        ("replay", _parked_replay, "send one back to the queue it was meant for, as it was"),
        ("discard", _parked_discard, "delete one for good"),
    ):
        one = command(
            verb, handler, f"{help}; with --all, every one the filters match (a dry run "
            "unless --yes)", verbs,
        )  # fmt: skip
        one.add_argument(
            "message_id", nargs="?", metavar="ID", help="the id `sas parked list` shows, whole"
        )
        _actor_option(one)
        one.add_argument("--all", action="store_true", help="every one the filters match")
        _parked_filters(one)
        one.add_argument("--limit", type=_arg(_limit), help="with --all: at most (default 100)")
        one.add_argument("--yes", action="store_true", help="with --all: act (default: list)")


def _order_filters(command: Any) -> None:
    """What ``list`` and ``resubmit --all`` filter on alike (``_query`` reads them)."""
    command.add_argument("--priority", choices=PRIORITIES, help="of this priority")
    command.add_argument("--workflow", metavar="NAME", help="of this workflow (one deployed)")
    command.add_argument(
        "--older-than", type=_arg(duration), metavar="AGE",
        help=f"submitted more than AGE ago: {AGE_HELP}",
    )  # fmt: skip
    command.add_argument(
        "--newer-than", type=_arg(duration), metavar="AGE", help="submitted at most AGE ago"
    )
    command.add_argument(
        "--from", dest="since", type=_arg(instant), metavar="TIME",
        help="submitted at or after TIME (ISO 8601; UTC unless it says)",
    )  # fmt: skip
    command.add_argument(
        "--until", type=_arg(instant), metavar="TIME", help="submitted before TIME"
    )
    command.add_argument("--step", help="at this step (its undo included)")
    command.add_argument("--error", metavar="TEXT", help="the last error contains TEXT, any case")


def _parked_filters(command: Any) -> None:
    command.add_argument("--by", choices=("app", "host"), help="who parked it")
    command.add_argument("--queue", help="the queue it was meant for")
    command.add_argument("--reason", metavar="TEXT", help="its reason contains TEXT, any case")
    command.add_argument(
        "--older-than",
        type=_arg(duration),
        metavar="AGE",
        help=f"parked more than AGE ago: {AGE_HELP}",
    )


def _alias_commands(commands: Any, command: Command) -> None:
    """The first spellings, kept as aliases."""
    orders = commands.add_parser("orders", help="aliases: orders list | show | resubmit")
    old = orders.add_subparsers(dest="verb", required=True, metavar="VERB")
    by_state = command("list", _list, "= sas list --state", old)
    by_state.add_argument("--state", type=_arg(_state), required=True)
    by_state.add_argument("--limit", type=_arg(_limit), default=100, help=LIMIT_HELP)
    by_state.set_defaults(
        priority=None, workflow=None, older_than=None, newer_than=None, since=None, until=None,
        step=None, error=None, offset=0,
    )  # fmt: skip
    command("show", _history, "= sas history", old).add_argument("order_id", type=_arg(_order_id))
    old_resubmit = command("resubmit", _resubmit, "= sas resubmit", old)
    old_resubmit.add_argument("order_id", type=_arg(_order_id))
    _actor_option(old_resubmit)
    old_resubmit.set_defaults(
        all=False,
        yes=False,
        priority=None,
        workflow=None,
        older_than=None,
        newer_than=None,
        since=None,
        until=None,
        step=None,
        error=None,
        limit=None,
    )


def run(argv: Sequence[str] | None = None, *, cwd: Path | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        source = appsettings.choose(args.settings, os.environ, cwd or Path.cwd())
    except UsageError as exc:
        return _fail(2, str(exc))
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except appsettings.SettingsFileError as exc:
        return _fail(2, f"settings: {exc}")
    appsettings.apply(source)
    if source.values:  # the app may have read its settings already (tests, a second call)
        bootstrap.reset()
    args.source = source.description
    handler: Handler = args.handler
    try:
        return handler(bootstrap.operator(), args)
    except (UsageError, InvalidMessage, ConfigurationError) as exc:
        return _fail(2, str(exc))
    except (NotFound, IllegalTransition, ConcurrencyConflict, AlreadyExists) as exc:
        return _fail(1, str(exc))
    except AzureError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _fail(1, f"{type(exc).__name__} from {source.description}: {first[:300]}")
    except KeyboardInterrupt:
        return 0


def _fail(code: int, message: str) -> int:
    print(f"sas: error: {message}", file=sys.stderr)
    return code


def _print_json(document: Any) -> None:
    print(json.dumps(document, indent=2, default=str))


def _submit(operator: Operator, args: argparse.Namespace) -> int:
    document = {
        "order_id": args.order_id or uuid.uuid4().hex,
        "workflow": args.workflow,
        "details": json_object(args.details, "details"),
        "priority": args.priority,
        "status_events": args.status_events,
        "reply_to": args.reply_to,
    }
    try:
        order = OrderSubmitted.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise UsageError(f"the order is not valid: {where}: {first['msg']}") from None
    message_id = operator.submit(order, actor=args.actor)
    if args.json:
        _print_json({"order_id": order.order_id, "message_id": message_id})
    else:
        print(order.order_id)
    return 0


def _status(operator: Operator, args: argparse.Namespace) -> int:
    state = operator.detail(args.order_id).state
    if args.json:
        _print_json(views.state_document(state))
    else:
        console.print(views.status(state))
    return 0


def _history(operator: Operator, args: argparse.Namespace) -> int:
    detail = operator.detail(args.order_id)
    if args.json:
        _print_json(views.detail_document(detail))
    else:
        console.print(views.timeline(detail))
    return 0


def _query(args: argparse.Namespace, state: ProcessState | None, limit: int) -> OrderQuery:
    """The filters ``list`` and ``resubmit --all`` share."""
    if args.since and args.until and args.until <= args.since:
        raise UsageError("--until must be after --from: no order could match")
    return OrderQuery(
        state=state,
        priority=args.priority,
        workflow=args.workflow or None,
        older_than=args.older_than,
        newer_than=args.newer_than,
        step=args.step or None,
        error=args.error or None,
        submitted_from=args.since,
        submitted_until=args.until,
        limit=limit,
        offset=getattr(args, "offset", 0),
    )


def _list(operator: Operator, args: argparse.Namespace) -> int:
    query = _query(args, args.state, args.limit)
    found, total = operator.find_page(query)
    if args.json:
        _print_json([views.state_document(state) for state in found])
    else:
        console.print(views.states_table(_described(query), found))
        if query.offset == 0:
            print(f"{len(found)} of {total} matching order(s)")
        elif not found:
            print(f"none past the first {query.offset} of {total} matching order(s)")
        else:
            first = query.offset + 1
            print(f"{first}-{query.offset + len(found)} of {total} matching order(s)")
        if query.offset + len(found) < total:
            print(f"next page: --offset {query.offset + len(found)}")
    return 0


def _described(query: OrderQuery) -> str:
    said = [query.state.value if query.state else "all", "orders"]
    if query.priority:
        said.append(f"of priority {query.priority}")
    if query.workflow:
        said.append(f"of workflow {query.workflow}")
    if query.older_than is not None:
        said.append(f"submitted over {query.older_than} ago")
    if query.newer_than is not None:
        said.append(f"submitted within {query.newer_than}")
    if query.submitted_from is not None:
        said.append(f"submitted from {views.at(query.submitted_from)}")
    if query.submitted_until is not None:
        said.append(f"submitted before {views.at(query.submitted_until)}")
    if query.step is not None:
        said.append(f"at {query.step}")
    if query.error is not None:
        said.append(f"with an error containing {query.error!r}")
    return " ".join(said) + f" (at most {query.limit})"


def _resubmit(operator: Operator, args: argparse.Namespace) -> int:
    if args.all == (args.order_id is not None):
        raise UsageError("give an order id, or --all with filters: one of the two")
    if args.all:
        return _resubmit_all(operator, args)
    filters = (args.priority, args.older_than, args.newer_than, args.step, args.error, args.limit)
    if args.yes or any(value is not None for value in filters):
        raise UsageError("--yes and the filters go with --all")
    again = operator.resubmit(args.order_id, actor=args.actor)
    return _changed(args, again, f"resubmitted {again.order_id}: now {again.process_state.value}")


def _close(operator: Operator, args: argparse.Namespace) -> int:
    closed = operator.close(args.order_id, actor=args.actor, reason=args.reason)
    return _changed(args, closed, f"closed {closed.order_id}")


def _changed(args: argparse.Namespace, state: OrderState, line: str) -> int:
    """An order an operator changed: its state as JSON, or one line."""
    if args.json:
        _print_json(views.state_document(state))
    else:
        print(line)
    return 0


def _resubmit_all(operator: Operator, args: argparse.Namespace) -> int:
    query = _query(args, ProcessState.ERROR, args.limit or 100)
    report = operator.resubmit_matching(query, actor=args.actor, dry_run=not args.yes)
    outcomes = {
        s.order_id: report.outcomes.get(s.order_id, "would be resubmitted") for s in report.matched
    }
    if args.json:
        _print_json(
            {
                "dry_run": report.dry_run,
                "matched": len(outcomes),
                "total": report.total,
                "orders": outcomes,
            }
        )
    else:
        rows = [
            (s.order_id, s.priority, s.updated_at, s.last_error, outcomes[s.order_id])
            for s in report.matched
        ]
        columns = ("order", "priority", "updated", "last error", "outcome")
        console.print(views.table(_described(query), columns, rows))
        if report.dry_run:
            print(
                f"dry run: {len(rows)} of {report.total} matching order(s) would be resubmitted, "
                "nothing was changed; run again with --yes to resubmit them"
            )
        else:
            done = sum(1 for outcome in outcomes.values() if outcome == "done")
            print(f"resubmitted {done} of {len(rows)} order(s)")
    failed = [oid for oid, outcome in outcomes.items() if outcome.startswith("not ")]
    return _fail(1, f"{len(failed)} order(s) not resubmitted") if failed else 0


def _parked_list(operator: Operator, args: argparse.Namespace) -> int:
    page = bootstrap.parked_messages().find(_parked_query(args, args.limit))
    found, total = page.messages, page.total
    documents = [
        views.parked_document(m, bootstrap.parked_messages().age_seconds(m)) for m in found
    ]
    if args.json:
        _print_json(documents)
        return 0
    console.print(
        views.parked_table(f"parked messages, oldest first (at most {args.limit})", documents)
    )
    for number, m in enumerate(documents, 1):  # ids in full, never wrapped: to copy into replay
        console.print(f"#{number} {m['id']}", soft_wrap=True, highlight=False, markup=False)
    print(f"{len(found)} of {total} matching message(s)")
    if page.more_unlisted:
        print(_MORE_UNLISTED)
    return 0


_MORE_UNLISTED = (
    "more may be parked than were listed (a Storage poison queue shows its first 32): "
    "settle these, then list again"
)


def _parked_query(args: argparse.Namespace, limit: int) -> ParkedQuery:
    """The filters ``parked list`` and ``parked replay|discard --all`` share."""
    return ParkedQuery(
        parked_by=args.by,
        queue=args.queue or None,
        reason=args.reason or None,
        older_than=args.older_than,
        limit=limit,
    )


def _parked_replay(operator: Operator, args: argparse.Namespace) -> int:
    if _parked_all(args):
        return _parked_matching(operator, args, replay=True)
    with _row_number_hint(args.message_id):
        bootstrap.parked_messages().replay(args.message_id, actor=args.actor)
    return _done(args, "replayed")


def _parked_discard(operator: Operator, args: argparse.Namespace) -> int:
    if _parked_all(args):
        return _parked_matching(operator, args, replay=False)
    with _row_number_hint(args.message_id):
        bootstrap.parked_messages().discard(args.message_id, actor=args.actor)
    return _done(args, "discarded")


def _parked_all(args: argparse.Namespace) -> bool:
    """Whether to act on every match (--all), after checking one id xor --all was given."""
    if args.all == (args.message_id is not None):
        raise UsageError("give a parked message's id, or --all with filters: one of the two")
    filters = (args.by, args.queue, args.reason, args.older_than, args.limit)
    if not args.all and (args.yes or any(value is not None for value in filters)):
        raise UsageError("--yes and the filters go with --all")
    return bool(args.all)


def _parked_matching(operator: Operator, args: argparse.Namespace, *, replay: bool) -> int:
    query = _parked_query(args, args.limit or 100)
    report = bootstrap.parked_messages().settle_matching(
        query, replay=replay, actor=args.actor, dry_run=not args.yes
    )
    verb = "replayed" if replay else "discarded"
    view = bulk_parked_view(report, verb)
    if args.json:
        _print_json(view.model_dump(mode="json"))
    else:
        rows = [(m.id, m.queue, m.reason, m.outcome) for m in view.messages]
        console.print(views.table("parked messages", ("id", "queue", "reason", "outcome"), rows))
        if report.dry_run:
            print(
                f"dry run: {view.matched} of {view.total} matching message(s) would be {verb}, "
                f"nothing was changed; run again with --yes to act on them"
            )
        else:
            done = sum(1 for m in view.messages if m.outcome == "done")
            print(f"{verb} {done} of {view.matched} message(s)")
        if view.more_unlisted:
            print(_MORE_UNLISTED)
    failed = [m.id for m in view.messages if m.outcome.startswith("not ")]
    return _fail(1, f"{len(failed)} message(s) not {verb}") if failed else 0


@contextmanager
def _row_number_hint(message_id: str) -> Iterator[None]:
    """``sas parked list`` numbers its rows; replay and discard take ids, never row numbers
    (the rows move as messages come and go)."""
    try:
        yield
    except NotFound as exc:
        if re.fullmatch(r"#?\d{1,4}", message_id):
            number = message_id.lstrip("#")
            raise NotFound(
                f"{exc}: give the id `sas parked list` prints after #{number}, not the row number"
            ) from exc
        raise


def _done(args: argparse.Namespace, status: str) -> int:
    if args.json:
        _print_json({"id": args.message_id, "status": status})
    else:
        print(f"{status} {args.message_id}")
    return 0


def _purge(operator: Operator, args: argparse.Namespace) -> int:
    if not args.order_id and args.older_than is None:
        raise UsageError("give order ids, or --older-than: purge takes one of the two at least")
    report = operator.purge(
        args.older_than,
        states=set(args.state) if args.state else PURGEABLE_STATES,
        order_ids=args.order_id or None,
        actor=args.actor,
        dry_run=not args.yes,
        limit=args.limit,
    )
    missed = 0 if report.dry_run else len(report.candidates) - report.purged
    if args.json:
        _print_json(
            {
                "cutoff": report.cutoff.isoformat(),
                "dry_run": report.dry_run,
                "candidates": [views.state_document(state) for state in report.candidates],
                "purged": report.purged,
                "not_purged": report.unmatched,
            }
        )
    else:
        cutoff = views.at(report.cutoff)
        found = len(report.candidates)
        columns = ("order", "state", "finished", "workflow", "priority")
        rows = [
            (s.order_id, s.process_state.value, s.finished_at, s.workflow, s.priority)
            for s in report.candidates
        ]
        console.print(views.table(f"finished before {cutoff}", columns, rows))
        if report.dry_run:
            print(
                f"dry run: {found} order(s) would be purged, nothing was deleted; "
                "run again with --yes to delete them (Error orders are never purged)"
            )
        else:
            print(f"purged {report.purged} of {found} order(s) finished before {cutoff}")
        if report.unmatched:
            print(
                "not purged (no such order, not finished for good, another state, too recent, "
                f"or past --limit): {', '.join(report.unmatched)}"
            )
    if missed:
        return _fail(1, f"{missed} order(s) changed while being purged and were kept")
    return 1 if report.unmatched else 0


def _audit(operator: Operator, args: argparse.Namespace) -> int:
    found = operator.audit(args.limit, action=args.action, actor=args.by, target=args.target)
    if args.json:
        _print_json([views.audit_document(entry) for entry in found])
        return 0
    columns = ("at", "actor", "action", "target", "reason", "detail")
    rows = [(e.at, e.actor, e.action, e.target, e.reason, e.detail) for e in found]
    console.print(views.table("operators' actions, newest first", columns, rows))
    print(f"{len(found)} action(s)")
    return 0


def _health(operator: Operator, args: argparse.Namespace) -> int:
    report = bootstrap.health().report(timedelta(minutes=args.minutes), alerts=args.alerts)
    if args.json:
        _print_json(views.health_document(report))
    else:
        console.print(views.health(report, bootstrap.routes().alerts))
    for problem in report.problems:
        print(f"sas: not read: {problem}", file=sys.stderr)
    return 1 if report.problems else 0


def _watch(operator: Operator, args: argparse.Namespace) -> int:
    watch(
        operator,
        bootstrap.clock().now,
        console,
        interval=args.interval,
        iterations=args.iterations,
        failures=args.failures,
        as_json=args.json,
        heading=f"sas watch: {args.source}, every {args.interval:g}s",
    )
    return 0


def main() -> None:
    # The operator's commands are not the app's work: nothing to trace, and the exporter the
    # app's settings name signs in as the app's managed identity.
    os.environ["OTEL_SDK_DISABLED"] = "true"
    # The app's own warnings (a retried read, a clock estimate) are its logs, not the
    # command's output: the command reports its own outcome.
    logging.basicConfig(level=logging.ERROR, format="sas: %(levelname)s: %(message)s")
    sys.stdout = ReaderSafe(sys.stdout)
    code = run()
    sys.stdout.flush()
    sys.exit(code)


class ReaderSafe:
    """stdout that, once its reader has gone (`sas list --json | head`), drops the rest: no
    traceback, and the command ends with its own exit code and its own stderr lines."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.gone = True
        # What is still buffered would fail again when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


if __name__ == "__main__":
    main()

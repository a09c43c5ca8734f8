"""`make run`: the local demo. Starts Azurite, the simulated remote services and the dev host,
submits a batch of orders the way an application would (orders queue, private status queue),
shows progress from the status events, then summarises and proves from the ledgers that no
effect was applied twice and every compensated order's effects were undone.

Both example workflows run, half the batch each (`--workflow` picks one): the order, whose
agents are remote HTTP services (the simulator), and the workspace, whose agents are Python
functions keeping their effects in a table (workflows/workspace.py); a ninth of the workspaces
ask for what configure refuses, and stop in Error.

A tenth of the orders are high priority, sent last, into the backlog the others make, and a
twentieth are low priority: the summary shows each priority's latency. Payment has two
endpoints (west and north, sharing one ledger, 16 calls at once each).

By default the remote services misbehave (transient faults, an outage, business refusals, slow
answers past the deadline, the west payment endpoint down for the whole run), the Python
actions too (sas_local/python_faults.py), and one agent worker is killed mid-run;
`--no-faults` runs the happy path. Exits non-zero if an order is left unfinished or a ledger
check fails (and, with `--no-faults`, if any order is not Processed).

The app's settings are the user's where given (sas_local/user_settings.py: local.settings.json,
then the environment): an HTTP agent given a URL calls it, and a workflow calling one is left
out of the batch (its effects are not in the simulator's ledger). `--serve` runs no batch and
no faults: the stack serves your own workflows until Ctrl-C or SIGTERM; `--layout` spreads the
functions over dev hosts as `LocalStack` can (flex: each in processes of its own). SIGTERM or
SIGHUP stops everything it started, as Ctrl-C does.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from azure.storage.queue import QueueClient, TextBase64DecodePolicy
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sas.adapters.clients import queue_service_client
from sas.adapters.storage_queues import StorageQueueTransport
from sas.adapters.table_store import TableStateStore
from sas.domain.errors import InvalidMessage
from sas.domain.messages import OrderSubmitted, StatusEvent, decode
from sas.domain.model import TERMINAL_STATES, ProcessState
from sas.domain.wire import Priority, submission_message_id
from sas.settings import HTTP_AGENTS, QUEUE_ALERTS, QUEUE_ORDERS
from sas_cli.appsettings import LOCAL_RUN_SETTINGS
from sas_local import user_settings
from sas_local.chaos.inject import count_events
from sas_local.demo_report import DemoRun, describe_faults, render
from sas_local.devhost.config import DevHostError
from sas_local.devhost.worker import PRELOAD_ENV
from sas_local.ledger import (
    app_effects,
    check_effects,
    configure_faults,
    fetch_ledger,
)
from sas_local.processes import REPO_ROOT
from sas_local.python_faults import APP_ENV, CONFIG_ENV
from sas_local.span_capture import CAPTURE_DIR_ENV, read_spans
from sas_local.stack import Layout, LocalStack
from workflows import REGISTRY
from workflows.order import OrderDetails, OrderLine
from workflows.workspace import WorkspaceRequest

STATUS_QUEUE = "status-demo"
FINAL_STATUSES = frozenset({"completed", "compensated", "failed", "rejected"})
console = Console()

FAULTS = {
    "seed": 7,
    "transient_rate": 0.10,
    "permanent_rate": 0.04,
    "undo_permanent_rate": 0.3,  # some undos refused for good: Error + an operator alert
    "slow_rate": 0.02,
    "slow_seconds": 20.0,  # longer than a step's 15 s complete-by budget
    "outage_service": "payment",
    "outage_start": 4.0,
    "outage_seconds": 8.0,
    "endpoints": {"west": {"down": True}},  # payment's west endpoint: routing goes north
}
PYTHON_FAULTS = {
    "seed": 7,
    "transient_rate": 0.10,
    "lost_reply_rate": 0.05,
    "slow_rate": 0.02,
    "slow_seconds": 20.0,
    "permanent_rate": 0.02,
}
WORKFLOWS = ("order", "workspace")
PAYMENT_ENDPOINTS = {
    "payment": [{"name": "west", "capacity": 16}, {"name": "north", "capacity": 16}]
}


@dataclass
class Tracker:
    sent_at: dict[str, float] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    events: Counter[str] = field(default_factory=Counter)

    def finish(self, order_id: str, how: str) -> None:
        if order_id not in self.final:
            self.final[order_id] = how
            sent = self.sent_at.get(order_id)
            if sent is not None:
                self.latency[order_id] = time.monotonic() - sent


def demo_order(index: int, run_id: str, reply_to: str = STATUS_QUEUE) -> OrderSubmitted:
    return OrderSubmitted(
        order_id=f"demo-{run_id}-{index:05d}",
        details=OrderDetails(
            customer_id=f"customer-{index % 17}",
            currency="EUR",
            address=f"{index} Demo Street",
            lines=[
                OrderLine(sku=f"sku-{index % 5}", quantity=1 + index % 3, unit_price_cents=1999)
            ],
        ).model_dump(mode="json"),
        reply_to=reply_to,
    )


def demo_workspace(
    index: int, run_id: str, reply_to: str = STATUS_QUEUE, refusals: bool = True
) -> OrderSubmitted:
    """A workspace request; with ``refusals``, one in nine is for enterprise in australiaeast,
    which configure refuses."""
    regions = ("westeurope", "eastus", "australiaeast" if refusals else "westeurope")
    return OrderSubmitted(
        order_id=f"ws-{run_id}-{index:05d}",
        workflow="workspace",
        details=WorkspaceRequest.model_validate(
            {
                "team": f"team-{index}",
                "owner": f"owner{index}@example.com",
                "plan": ("free", "team", "enterprise")[index % 3],
                "region": regions[(index // 3) % 3],
            }
        ).model_dump(mode="json"),
        reply_to=reply_to,
    )


def demo_batch(
    orders: int, run_id: str, workflows: tuple[str, ...], faults: bool
) -> list[OrderSubmitted]:
    """``orders`` submissions, taking turns among ``workflows``, prioritised."""
    made = []
    for index in range(orders):
        if workflows[index % len(workflows)] == "order":
            made.append(demo_order(index, run_id))
        else:
            made.append(demo_workspace(index, run_id, refusals=faults))
    return prioritised(made)


def drain_status(queue: QueueClient, tracker: Tracker) -> None:
    for message in queue.receive_messages(messages_per_page=32, max_messages=32):
        queue.delete_message(message)
        try:
            event = decode(StatusEvent, message.content)
        except InvalidMessage:
            continue
        tracker.events[event.status] += 1
        if event.status in FINAL_STATUSES:
            tracker.finish(event.order_id, event.status)


class Stop(BaseException):
    """SIGTERM or SIGHUP: stop everything, as Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_on_signals() -> None:
    def stop(signum: int, frame: object) -> None:
        raise Stop(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    _term_when_parent_dies()


PR_SET_PDEATHSIG = 1


def _term_when_parent_dies() -> None:
    """SIGTERM this process when its parent dies: `make run` is what a user signals, and make
    exits on SIGTERM without passing it on, which would orphan the stack (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return  # not allowed here: Ctrl-C and signals to this process still stop it
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _ignore_signals() -> None:
    """While everything is being stopped: a second signal must not cut that short."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)


@dataclass(frozen=True)
class Options:
    """How a run is made, besides the batch."""

    workers: int = 2
    logs: Path = Path(".sas-run")
    faults: bool = True
    screenshot: Path | None = None
    keep_running: bool = False
    serve: bool = False
    """No batch, no faults: the stack runs until Ctrl-C or SIGTERM."""
    layout: Layout | None = None
    """None: the agents apart under faults (one of their workers is killed), else shared."""
    user: dict[str, str] = field(default_factory=dict)
    """The user's settings (``user_settings.read``)."""


def run(
    orders: int, timeout: float, options: Options, workflows: tuple[str, ...] = WORKFLOWS
) -> int:
    run_id = time.strftime("%H%M%S")
    faults = options.faults and not options.serve
    logs = options.logs
    spans = logs / "spans"
    overrides = _trace_capture(spans)
    if faults:
        overrides |= _python_faults(logs / "python-faults")
    own = user_settings.own_services(options.user, HTTP_AGENTS)
    runnable = () if options.serve else _runnable(workflows, own)
    if not options.serve and not runnable:
        console.print(
            f"[red]no workflow to run[/]: {', '.join(workflows)} call your own service(s) "
            f"({', '.join(sorted(own))}); --serve runs the stack for your own workflows"
        )
        return 2
    layout = options.layout or ("agents apart" if faults else "shared")
    with console.status("starting Azurite, the remote service simulator and the dev hosts"):
        stack = LocalStack.start(
            workers=options.workers,
            log_dir=logs,
            extra_queues=(STATUS_QUEUE,),
            layout=layout,
            endpoints=PAYMENT_ENDPOINTS,
            env_overrides=overrides,
            user=options.user,
        )
    try:
        return _run_on(stack, orders, timeout, options, runnable, run_id)
    finally:
        _ignore_signals()
        with console.status("stopping everything"):
            stack.stop()


def _runnable(workflows: tuple[str, ...], own: Mapping[str, str]) -> tuple[str, ...]:
    """The workflows the demo's batch may run: those calling no service of the user's own (the
    demo checks every effect in the simulator's ledger)."""
    runnable = []
    for name in workflows:
        theirs = sorted({s.agent for s in REGISTRY.named(name).steps} & set(own))
        if theirs:
            console.print(
                f"[yellow]{name}[/] left out of the batch: it calls your own "
                f"{', '.join(theirs)} ({', '.join(own[a] for a in theirs)})"
            )
        else:
            runnable.append(name)
    return tuple(runnable)


def _announce(stack: LocalStack, options: Options) -> str:
    hosts = len(stack.hosts)
    console.print(
        f"[green]ready[/]: {hosts} dev host(s), {options.workers} worker(s) each, "
        f"API {stack.api_url}, logs in {options.logs}"
    )
    console.print(
        f"simulator {stack.simulator_url} plays {', '.join(stack.played) or 'nothing'}"
        + "".join(f"; {agent} calls {stack.env[key]}" for agent, key in stack.own.items()),
        highlight=False,
    )
    dashboard = f"{stack.api_url}/api/dashboard"
    console.print(f"[bold]dashboard[/]: {dashboard} (live; API docs at {stack.api_url}/api/docs)")
    return dashboard


def _run_on(
    stack: LocalStack,
    orders: int,
    timeout: float,
    options: Options,
    workflows: tuple[str, ...],
    run_id: str,
) -> int:
    faults = options.faults and not options.serve
    if faults:
        configure_faults(stack.simulator_url, FAULTS)
    dashboard = _announce(stack, options)
    if options.serve:
        found = options.logs / "local.settings.json"
        here = " (from this directory, without it)" if found == LOCAL_RUN_SETTINGS else ""
        console.print(f"`sas` commands reach it with --settings {found}{here}", highlight=False)
        _wait_for_interrupt(dashboard)
        return 0
    if faults:
        for line in describe_faults(FAULTS, PYTHON_FAULTS if "workspace" in workflows else {}):
            console.print(line, highlight=False)
        if stack.agents is not None:
            console.print("one agent worker will be killed mid-run")
    batch = demo_batch(orders, run_id, workflows, faults)
    outcome = _drive(stack, batch, timeout, faults)
    _summarise_traces(options.logs / "spans")
    if options.screenshot is not None:
        from sas_local.screenshot import capture  # Chromium only when asked for

        console.print(f"dashboard screenshot: {capture(dashboard, options.screenshot)}")
    if options.keep_running:
        _wait_for_interrupt(dashboard)
    return outcome


def _trace_capture(spans: Path) -> dict[str, str]:
    """Every worker records its spans as JSON lines under ``spans`` (sas_local/span_capture.py),
    so each order has a trace (its id on the dashboard) to look at after the run; unless an OTLP
    endpoint is set, where the app's own exporter sends them instead."""
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return {}
    spans.mkdir(parents=True, exist_ok=True)
    for old in spans.glob("spans-*.jsonl"):
        old.unlink()
    return {PRELOAD_ENV: "sas_local.span_capture", CAPTURE_DIR_ENV: str(spans)}


def _python_faults(events: Path) -> dict[str, str]:
    """The dev hosts run the app's workflows with their Python actions behind PYTHON_FAULTS."""
    events.mkdir(parents=True, exist_ok=True)
    for old in events.glob("events-*.log"):
        old.unlink()
    return {
        "SAS_WORKFLOWS_MODULE": "sas_local.python_faults",
        APP_ENV: os.environ.get("SAS_WORKFLOWS_MODULE") or "workflows",
        CONFIG_ENV: json.dumps({**PYTHON_FAULTS, "events": str(events)}),
    }


def _summarise_traces(spans: Path) -> None:
    recorded = read_spans(spans) if spans.is_dir() else []
    if recorded:
        traces = len({span["trace_id"] for span in recorded})
        console.print(f"traces: {len(recorded)} spans in {traces} traces, in {spans}/*.jsonl")


def _wait_for_interrupt(dashboard: str) -> None:
    console.print(
        f"everything keeps running for the dashboard ({dashboard}): Ctrl-C or SIGTERM stops it"
    )
    try:
        while True:
            time.sleep(1)
    except (KeyboardInterrupt, Stop):
        pass


def _kill_an_agent_worker(stack: LocalStack) -> str:
    if stack.agents is None:
        return "no agents host"
    pids = stack.agents.worker_pids()
    if not pids:
        return "no agent worker found"
    os.kill(pids[0], signal.SIGKILL)
    return f"killed agent worker pid {pids[0]} (the dev host restarts it)"


def _drive(stack: LocalStack, batch: list[OrderSubmitted], timeout: float, faults: bool) -> int:
    settings = stack.settings
    transport = StorageQueueTransport(queue_service_client(settings.storage))
    status_queue = queue_service_client(settings.storage).get_queue_client(
        STATUS_QUEUE, message_decode_policy=TextBase64DecodePolicy()
    )
    store = TableStateStore.connect(settings.storage, settings.table_name)
    tracker = Tracker()
    orders = len(batch)
    crash = "none"
    started = time.monotonic()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        submitted = progress.add_task("submitted", total=orders)
        finished = progress.add_task("finished ", total=orders)
        for order in batch:
            tracker.sent_at[order.order_id] = time.monotonic()
            transport.send(
                settings.lane(QUEUE_ORDERS, order.priority),
                order,
                message_id=submission_message_id(order.order_id),
                correlation_id=order.order_id,
            )
            progress.advance(submitted)
        deadline = time.monotonic() + timeout
        last_check = time.monotonic()
        while len(tracker.final) < orders and time.monotonic() < deadline:
            drain_status(status_queue, tracker)
            if faults and crash == "none" and len(tracker.final) >= orders // 4:
                crash = _kill_an_agent_worker(stack)
                progress.console.print(f"[yellow]crash[/]: {crash}")
            if time.monotonic() - last_check > 5:  # status events are best effort: ask the store
                last_check = time.monotonic()
                for order in batch:
                    if order.order_id not in tracker.final:
                        found = store.get_state(order.order_id)
                        if found is not None and found.value.is_terminal:
                            tracker.finish(order.order_id, found.value.process_state.value)
            progress.update(finished, completed=len(tracker.final))
            time.sleep(0.1)
    elapsed = time.monotonic() - started

    outcomes: dict[str, ProcessState] = {}
    history: Counter[str] = Counter()
    for order in batch:
        found = store.get_state(order.order_id)
        outcomes[order.order_id] = found.value.process_state if found else ProcessState.PENDING
        history.update(entry.kind for entry in store.get_history(order.order_id))
    alerts_queue = queue_service_client(settings.storage).get_queue_client(
        settings.queue(QUEUE_ALERTS)
    )
    alerts = alerts_queue.get_queue_properties().approximate_message_count or 0
    ledger = fetch_ledger(stack.simulator_url)
    ledger["effects"] = [
        *ledger.get("effects", []),  # type: ignore[misc]
        *app_effects(settings.storage.connection_string or "", REGISTRY.tables),
    ]
    flows = {order.order_id: REGISTRY.named(order.workflow) for order in batch}
    report = check_effects(ledger, outcomes, flows)
    config = json.loads(stack.env.get(CONFIG_ENV) or "{}")
    try:
        endpoints = httpx.get(f"{stack.simulator_url}/endpoints", timeout=10).json()
    except httpx.HTTPError:
        endpoints = {}
    finished_run = DemoRun(
        batch=batch,
        outcomes=outcomes,
        latency=tracker.latency,
        elapsed=elapsed,
        history=history,
        ledger=report,
        alerts=alerts,
        crash=crash,
        status_events=sum(tracker.events.values()),
        python_injected=count_events(Path(config["events"])) if config.get("events") else {},
        endpoints=endpoints,
    )
    console.print(render(finished_run))

    unfinished = [oid for oid, state in outcomes.items() if state not in TERMINAL_STATES]
    not_processed = sum(state is not ProcessState.PROCESSED for state in outcomes.values())
    errors = sum(state is ProcessState.ERROR for state in outcomes.values())
    problems = list(report.problems)
    if unfinished:
        problems.append(f"{len(unfinished)} order(s) not finished, e.g. {unfinished[:3]}")
    if not faults and not_processed:
        problems.append(f"{not_processed} order(s) not Processed without any injected fault")
    if alerts != errors:
        problems.append(f"{alerts} operator alert(s) for {errors} order(s) in Error")
    if problems:
        console.print(f"[red]FAILED[/]: {len(problems)} problem(s)")
        for problem in problems[:20]:
            console.print(f"  - {problem}")
        return 1
    console.print(
        "[green]OK[/]: every order finished; no effect applied twice; every compensated "
        "order's effects undone; one alert per Error"
    )
    return 0


def prioritised(orders: Iterable[OrderSubmitted]) -> list[OrderSubmitted]:
    """A twentieth low and a tenth high priority (at least one each), in sending order: the
    normal ones first, then the low, then the high ones, into the backlog the others make."""
    batch = list(orders)
    high = max(1, len(batch) // 10) if len(batch) > 2 else 0
    low = max(1, len(batch) // 20) if len(batch) > 2 else 0
    counts: dict[Priority, int] = {"normal": len(batch) - high - low, "low": low, "high": high}
    levels = [priority for priority, count in counts.items() for _ in range(count)]
    return [
        order.model_copy(update={"priority": p}) for order, p in zip(batch, levels, strict=True)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the sas demo locally on Azurite.")
    parser.add_argument("--orders", type=int, default=100, help="orders to submit (default 100)")
    parser.add_argument(
        "--workers", type=int, default=2, help="dev host worker processes (default 2)"
    )
    parser.add_argument("--no-faults", action="store_true", help="well-behaved remotes, no crash")
    parser.add_argument(
        "--workflow",
        choices=("both", *WORKFLOWS),
        default="both",
        help="which example workflow the orders run (default both, taking turns)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait for all orders"
    )
    parser.add_argument("--logs", type=Path, default=Path(".sas-run"), help="where process logs go")
    parser.add_argument(
        "--screenshot",
        type=Path,
        default=None,
        help="save a screenshot of the dashboard here once the orders have finished",
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="keep the stack (and the dashboard) up after the summary, until Ctrl-C or SIGTERM",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="no batch, no faults: run the stack for your own workflows until Ctrl-C or SIGTERM",
    )
    parser.add_argument(
        "--layout",
        choices=("shared", "agents apart", "flex"),
        default=None,
        help="the functions in one dev host, the agents apart, or each in processes of its own "
        "as Flex Consumption runs them (default: the agents apart, shared with --no-faults)",
    )
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        help="the app's settings, over the stack's (default: local.settings.json beside "
        "function_app.py, if there is one); exported SAS_* settings win",
    )
    args = parser.parse_args(argv)
    if args.orders < 1 or args.workers < 1:
        parser.error("--orders and --workers must be at least 1")
    try:
        explicit = args.settings is not None
        path = args.settings if explicit else REPO_ROOT / user_settings.SETTINGS_FILE
        user = user_settings.read(path, os.environ, explicit=explicit)
    except DevHostError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    timeout = args.timeout if args.timeout is not None else 180 + args.orders * 1.0
    options = Options(
        workers=args.workers,
        logs=args.logs,
        faults=not args.no_faults,
        screenshot=args.screenshot,
        keep_running=args.keep_running,
        serve=args.serve,
        layout=args.layout,
        user=user,
    )
    _stop_on_signals()
    try:
        code = run(
            args.orders,
            timeout,
            options,
            workflows=WORKFLOWS if args.workflow == "both" else (args.workflow,),
        )
    except Stop as stopped:
        code = 128 + stopped.signum
    sys.exit(code)


if __name__ == "__main__":
    main()

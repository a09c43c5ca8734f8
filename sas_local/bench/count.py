"""Count the storage requests one order costs, exactly, by running the app in this process.

Run as a script (``python sas_local/bench/count.py --app-root DIR ...``), not as a module:
it imports ``sas`` and ``function_app`` from ``--app-root`` only, so the same counter measures
any commit of the app (the benchmark's side-by-side comparison runs it on a git worktree).
Azurite and the remote simulator are started by the caller and passed in.

Every HTTP request the Azure SDK sends is classified at the transport (one entity-group
transaction is one request, a retry is another). Orders run one at a time; queue functions
are invoked the way the host does (receive, call, delete), so each message costs one delete,
and one receive per message is reported (a host batch may share one). Empty polls are not
counted: they are the host's idle cost, not an order's.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

STATUS_QUEUE = "status-bench"


class RequestCounter:
    """Counts requests by kind while ``counting`` is set (thread-safe)."""

    def __init__(self, table_port: int, queue_port: int) -> None:
        self._ports = {table_port: "table", queue_port: "queue"}
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.counting = False
        self.live_partition: str | None = None
        """The in-flight index's partition key: its entities are counted apart (a partition's
        entity rate is a limit). Set from the measured commit's wire rules."""

    def record(
        self, method: str, url: str, headers: Any, response_text: str | None, body: Any = None
    ) -> None:
        if not self.counting:
            return
        parts = urlsplit(url)
        service = self._ports.get(parts.port or 0)
        if service is None:
            return
        kind = (
            _table_kind(method, unquote(parts.path), parts.query, headers)
            if service == "table"
            else _queue_kind(method, parts.path, parts.query, response_text)
        )
        if kind is None:
            return
        with self._lock:
            self.counts[kind] += 1
            if kind == "queue.peek":  # Service Bus bills a credit per message peeked
                self.counts["entity.peeked_message"] += (response_text or "").count(
                    "<QueueMessage>"
                )
            if kind.startswith("table."):
                where = unquote(parts.path) + unquote(parts.query) + _text(body)
                live = self.live_partition is not None and self.live_partition in where
                partition = "entity.live" if live else "entity.order"
                self.counts[partition] += _entities(kind, body, response_text)

    @contextmanager
    def window(self) -> Iterator[Counter[str]]:
        before = Counter(self.counts)
        self.counting = True
        measured: Counter[str] = Counter()
        try:
            yield measured
        finally:
            self.counting = False
            measured.update(self.counts)
            measured.subtract(before)


def _text(body: Any) -> str:
    if isinstance(body, bytes):
        return body.decode("utf-8", "replace")
    return body if isinstance(body, str) else ""


def _entities(kind: str, body: Any, response_text: str | None) -> int:
    """Entities a table request touches: each operation of a transaction, each entity a query
    returns, one otherwise (the scalability targets count entities per partition)."""
    if kind == "table.transaction":
        return len(re.findall(r"^[A-Z]+ \S+ HTTP/1\.1", _text(body), re.MULTILINE))
    if kind == "table.query":
        try:
            return len(json.loads(response_text or "{}").get("value", []))
        except ValueError:
            return 0
    return 1


def _table_kind(method: str, path: str, query: str, headers: Any) -> str | None:
    if path.endswith("/$batch"):
        return "table.transaction"
    if path.endswith("/Tables") or "Tables(" in path:
        return None  # provisioning
    if "PartitionKey='~breaker'" in path:
        # The circuit breaker's shared state: read at most once per cache period per process,
        # so its share per order depends on timing. Counted apart from the order's own rows.
        return "breaker.read" if method == "GET" else "breaker.write"
    if "PartitionKey='~clock'" in path:
        # The store clock's calibration read: once per process before its first response.
        return "clock.read"
    keyed = re.search(r"\(PartitionKey='.*',RowKey='.*'\)$", path) is not None
    if method == "GET":
        return "table.point_read" if keyed else "table.query"
    if method == "POST":
        return "table.insert"
    if method in ("PUT", "MERGE", "PATCH"):
        conditional = headers.get("If-Match", "*") != "*"
        return "table.update" if conditional else "table.upsert"
    if method == "DELETE":
        return "table.delete"
    return f"table.{method.lower()}"


def _queue_kind(method: str, path: str, query: str, response_text: str | None) -> str | None:
    if not path.endswith("/messages") and "/messages/" not in path:
        return None  # create/list queues: provisioning
    if method == "POST":
        return "queue.send"
    if method == "GET":
        if "peekonly=true" in query:
            return "queue.peek"
        if response_text is not None and "<QueueMessage>" not in response_text:
            return None  # an empty poll: the host's idle cost
        return "queue.receive"
    if method == "DELETE":
        return "queue.delete"
    if method == "PUT":
        return "queue.update"
    return f"queue.{method.lower()}"


def install(counter: RequestCounter) -> None:
    """Wrap azure-core's requests transport: every SDK request passes through ``send``."""
    from azure.core.pipeline.transport import RequestsTransport

    original = RequestsTransport.send

    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        response = original(self, request, **kwargs)
        text = None
        if request.method == "GET":
            try:
                text = response.text()
            except Exception:  # counting must never break the request
                text = None
        counter.record(request.method, request.url, request.headers, text, request.data)
        return response

    RequestsTransport.send = send


def load_functions(app_root: Path) -> dict[str, tuple[str, Callable[..., Any], str]]:
    """``{queue name: (function name, callable, argument name)}`` of every queue function."""
    sys.path.insert(0, str(app_root))
    spec = importlib.util.spec_from_file_location("function_app", app_root / "function_app.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"no function_app.py in {app_root}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["function_app"] = module
    spec.loader.exec_module(module)
    found = {}
    for function in module.app.get_functions():
        trigger = function.get_trigger()
        if trigger is None or str(trigger.type) != "queueTrigger":
            continue
        queue = str(trigger.queue_name)
        setting = re.fullmatch(r"%(.+)%", queue)
        if setting:
            queue = os.environ[setting.group(1)]
        found[queue] = (function.get_function_name(), function.get_user_function(), trigger.name)
    return found


def order_body(
    order_id: str, workflow: str, reply_to: str | None, status_events: str | None = None
) -> str:
    order: dict[str, Any] = {
        "type": "OrderSubmitted",
        "order_id": order_id,
        "workflow": workflow,
        "details": {
            "customer_id": "bench",
            "currency": "EUR",
            "address": "1 Bench Street",
            "lines": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 1999}],
        },
    }
    if reply_to is not None:
        order["reply_to"] = reply_to
    if status_events is not None:
        order["status_events"] = status_events
    return base64.b64encode(json.dumps(order).encode()).decode()


class InProcessHost:
    """Delivers every visible message of the app's queues to its function, like the host."""

    def __init__(self, connection_string: str, functions: dict[str, Any]) -> None:
        from azure.storage.queue import QueueClient

        self.before_each: Callable[[], None] | None = None
        """Called before each delivery (``forget`` makes every message land on a new instance)."""
        self.spent: dict[str, list[float]] = {}
        """Per function: [invocations, CPU seconds, wall seconds] of its own calls."""
        self._functions = functions
        self._clients = {
            queue: QueueClient.from_connection_string(connection_string, queue)
            for queue in functions
        }

    def deliver_once(self) -> int:
        from azure.functions.queue import QueueMessage

        delivered = 0
        for queue, (name, fn, arg) in self._functions.items():
            client = self._clients[queue]
            for message in client.receive_messages(max_messages=32, visibility_timeout=60):
                body = base64.b64decode(message.content)
                if self.before_each is not None:
                    self.before_each()
                trigger = QueueMessage(id=message.id, body=body, dequeue_count=1)  # type: ignore[no-untyped-call]
                # The function's own cost: its CPU (process-wide, so threads it starts count)
                # and its wall time, which waits on Azurite and the simulator too.
                cpu, wall = time.process_time(), time.perf_counter()
                fn(**{arg: trigger})
                spent = self.spent.setdefault(name, [0, 0.0, 0.0])
                spent[0] += 1
                spent[1] += time.process_time() - cpu
                spent[2] += time.perf_counter() - wall
                client.delete_message(message)
                delivered += 1
        return delivered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--app-root", type=Path, required=True)
    parser.add_argument("--connection-string", required=True)
    parser.add_argument("--env", type=Path, required=True, help="the app settings, as JSON")
    parser.add_argument("--orders", type=int, default=3, help="orders per variant (default 3)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    conn = args.connection_string
    ports = {
        name: int(re.search(rf"{name}Endpoint=http://127\.0\.0\.1:(\d+)", conn).group(1))  # type: ignore[union-attr]
        for name in ("Table", "Queue")
    }
    counter = RequestCounter(ports["Table"], ports["Queue"])
    install(counter)

    # The app reads its settings from the environment, as in the Functions host.
    os.environ.update(json.loads(args.env.read_text()))
    # A commit whose app declares its workflows runs this module's (order and single).
    os.environ["SAS_WORKFLOWS_MODULE"] = "sas_local.bench.workflows"
    functions = load_functions(args.app_root.resolve())
    try:
        from sas.domain import wire

        counter.live_partition = getattr(wire, "LIVE_PARTITION", None)
    except ImportError:  # a commit from before the wire rules had a module of their own
        pass

    from azure.data.tables import TableClient
    from azure.storage.queue import QueueClient

    from sas import bootstrap
    from sas.domain import workflow as workflow_module

    if hasattr(workflow_module, "WORKFLOWS"):  # a commit from before declared workflows
        old: Any = workflow_module  # its names are not this tree's
        single = old.Workflow(name="single", steps=old.ORDER_WORKFLOW.steps[:1])
        old.WORKFLOWS.setdefault(single.name, single)
    settings = bootstrap.settings()
    table = TableClient.from_connection_string(conn, settings.table_name)
    orders_queue = QueueClient.from_connection_string(conn, settings.queues["SAS_QUEUE_ORDERS"])
    status = QueueClient.from_connection_string(conn, STATUS_QUEUE)
    host = InProcessHost(conn, functions)
    supervisor = CommitApp(bootstrap)

    from sas.domain.messages import OrderSubmitted

    # A commit whose submitter chooses the events' granularity is counted at both levels.
    levels: tuple[str | None, ...] = (None,)
    if "status_events" in OrderSubmitted.model_fields:
        levels = (None, "steps")
    # A commit whose instances remember the states they wrote is also counted as if every
    # message landed on another instance (none remembered): the order path at scale out.
    recent_states = getattr(bootstrap, "recent_states", None)
    cases: list[tuple[str, int, bool, str | None, bool]] = [
        (workflow, steps, subscriber, level, False)
        for workflow, steps in (("single", 1), ("order", 3))
        for subscriber, level in ((False, None), *((True, level) for level in levels))
    ]
    if recent_states is not None:
        cases.append(("order", 3, False, None, True))
    # Once per process, not per order: the key that signs carried states (if the commit has one).
    carry_key = getattr(bootstrap.store(), "carry_key", None)
    if carry_key is not None:
        with counter_paused(counter):
            carry_key()
    _send_markers_at_once(bootstrap)
    _warm_up(host, table, orders_queue, supervisor, counter)
    variants = {}
    for workflow, steps, subscriber, level, elsewhere in cases:
        host.before_each = recent_states().clear if elsewhere and recent_states else None
        name = f"{steps}-step, {'with' if subscriber else 'no'} status subscriber"
        if level is not None:
            name += f" ({level} events)"
        if elsewhere:
            name += ", each message on another instance"
        on_path: Counter[str] = Counter()
        off_path: Counter[str] = Counter()
        host.spent = {}
        sweeps = [0.0, 0.0]  # CPU and wall seconds of the sweeps that end the orders
        for n in range(args.orders):
            elsewhere_tag = "-x" if elsewhere else ""
            order_id = f"bench-{workflow}-{int(subscriber)}{level or ''}{elsewhere_tag}-{n}"
            reply_to = STATUS_QUEUE if subscriber else None
            body = order_body(order_id, workflow, reply_to, level)
            with counter_paused(counter):
                orders_queue.send_message(body)  # the application's send: counted below
            with counter.window() as measured:
                while not _done(table, order_id, counter):
                    if host.deliver_once() == 0:
                        time.sleep(0.05)
            measured["queue.send"] += 1  # the submission the application sent
            on_path.update(measured)
            with counter.window() as swept, shifted_clock(supervisor, hours=1):
                # Ends the order's in-flight marker, off the order's path: a sweep once
                # the marker is due (an hour on, it is, whatever the commit's rule).
                cpu, wall = time.process_time(), time.perf_counter()
                supervisor.sweep()
                sweeps[0] += time.process_time() - cpu
                sweeps[1] += time.perf_counter() - wall
            off_path.update(swept)
            with counter_paused(counter):
                for message in status.receive_messages(max_messages=32):
                    status.delete_message(message)
        variants[name] = {
            "workflow": workflow,
            "steps": steps,
            "status_subscriber": subscriber,
            "status_events": level or "default",
            "per_order": _per(on_path, args.orders),
            "supervisor_at_end": _per(off_path, args.orders),
            "entities": _per(on_path, args.orders, entities=True),
            "entities_at_end": _per(off_path, args.orders, entities=True),
            "invocations": _invocations(host.spent, args.orders),
            "supervisor_at_end_ms": {
                "cpu_ms": round(1000 * sweeps[0] / args.orders, 2),
                "wall_ms": round(1000 * sweeps[1] / args.orders, 2),
            },
        }
    sweep, sweep_due, sweep_due_entities = _sweep_cost(counter, supervisor, bootstrap)
    for name in settings.queues.values():  # what the live orders sent: not for later runs
        QueueClient.from_connection_string(conn, name).clear_messages()
    args.out.write_text(
        json.dumps(
            {
                "variants": variants,
                "sweep_per_live_order": sweep,
                "sweep_per_due_live_order": sweep_due,
                "sweep_entities_per_due_live_order": sweep_due_entities,
            },
            indent=2,
        )
    )
    return 0


def _per(counts: Counter[str], orders: int, *, entities: bool = False) -> dict[str, float]:
    """Requests (or, with ``entities``, entities by partition) per order."""
    return {
        k: round(v / orders, 3)
        for k, v in sorted(counts.items())
        if v and k.startswith("entity.") == entities
    }


def _invocations(spent: dict[str, list[float]], orders: int) -> dict[str, dict[str, float]]:
    """Per function: invocations per order, and the CPU and wall milliseconds of one."""
    return {
        name: {
            "per_order": count / orders,
            "cpu_ms": round(1000 * cpu / count, 2),
            "wall_ms": round(1000 * wall / count, 2),
        }
        for name, (count, cpu, wall) in sorted(spent.items())
        if count
    }


def _warm_up(host: Any, table: Any, orders: Any, supervisor: CommitApp, counter: Any) -> None:
    """One 3-step order through every function, uncounted and untimed: the functions' first
    calls (imports, clients, connections) are a process's start, not an order's cost."""
    with counter_paused(counter):
        orders.send_message(order_body("bench-warm-up", "order", None))
        while not _done(table, "bench-warm-up", counter):
            if host.deliver_once() == 0:
                time.sleep(0.05)
        with shifted_clock(supervisor, hours=1):
            supervisor.sweep()  # its marker, which the first variant's sweep would count


def _send_markers_at_once(bootstrap: Any) -> None:
    """The app's Scheduler sends its marker moves and drops with each write, not at most once a
    window: one order at a time, a finished order's drop then goes with its own last write (as
    in a quiet system), not with a later order's (under load one transaction carries many).
    A commit without marker moves is left as it is."""
    from datetime import timedelta

    make = getattr(bootstrap, "scheduler", None)
    moves = getattr(make(), "_moves", None) if make is not None else None
    if moves is not None and hasattr(moves, "_window"):
        moves._window = timedelta(0)


def _done(table: Any, order_id: str, counter: RequestCounter) -> bool:
    from azure.core.exceptions import ResourceNotFoundError

    with counter_paused(counter):
        try:
            state = table.get_entity(order_id, "state")
        except ResourceNotFoundError:  # not inserted yet
            return False
    return state["ProcessState"] in ("Processed", "Compensated", "Error", "Closed")


@contextmanager
def counter_paused(counter: RequestCounter) -> Iterator[None]:
    was = counter.counting
    counter.counting = False
    try:
        yield
    finally:
        counter.counting = was


class _ShiftedClock:
    def __init__(self, inner: Any, seconds: float) -> None:
        self._inner, self._seconds = inner, seconds

    def now(self) -> Any:
        from datetime import timedelta

        return self._inner.now() + timedelta(seconds=self._seconds)


class CommitApp:
    """The measured commit's Supervisor and Submission, whichever way it wires them: services
    on a context (``sas.services.supervisor.sweep``) or objects (``bootstrap.supervisor()``)."""

    def __init__(self, bootstrap: Any) -> None:
        self._bootstrap = bootstrap
        self._shift = 0.0

    def sweep(self) -> Any:
        if hasattr(self._bootstrap, "supervisor"):
            supervisor = self._bootstrap.supervisor()
            real = supervisor._clock
            supervisor._clock = _ShiftedClock(real, self._shift)
            try:
                return supervisor.sweep()
            finally:
                supervisor._clock = real
        from dataclasses import replace

        from sas.services import supervisor as supervising

        ctx = self._bootstrap.context()
        return supervising.sweep(replace(ctx, clock=_ShiftedClock(ctx.clock, self._shift)))

    def submit(self, message: Any) -> Any:
        if hasattr(self._bootstrap, "submission"):
            return self._bootstrap.submission().submit(message)
        from sas.services import submission

        return submission.submit(self._bootstrap.context(), message)


@contextmanager
def shifted_clock(app: CommitApp, *, hours: float) -> Iterator[None]:
    """The Supervisor sees a later time."""
    app._shift = hours * 3600
    try:
        yield
    finally:
        app._shift = 0.0


def _sweep_cost(
    counter: RequestCounter, supervisor: CommitApp, bootstrap: Any
) -> tuple[dict[str, float], dict[str, float] | None, dict[str, float] | None]:
    """What one sweep costs per live order: orders submitted (not run further) and swept once
    as they are; then, where markers carry a due time, swept again with every marker due and
    every order healthy (the most a sweep reads without recovering anything)."""
    import inspect
    from datetime import UTC, datetime

    from sas.domain.messages import OrderSubmitted as Submitted
    from sas.domain.messages import decode

    store = bootstrap.store()
    live = 20
    ids = [f"bench-live-{n}" for n in range(live)]
    with counter_paused(counter):
        for order_id in ids:
            body = base64.b64decode(order_body(order_id, "order", None))
            supervisor.submit(decode(Submitted, body))
    with counter.window() as swept:
        supervisor.sweep()
    quiet = _per(swept, live)
    if "due_at" not in inspect.signature(store.touch_live).parameters:
        return quiet, None, None
    now = datetime.now(UTC)
    with counter_paused(counter):
        for order_id in ids:
            store.touch_live(order_id, now, now)
    with counter.window() as swept:
        supervisor.sweep()
    return quiet, _per(swept, live), _per(swept, live, entities=True)


if __name__ == "__main__":
    raise SystemExit(main())

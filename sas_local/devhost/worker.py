"""One worker process: load the app, poll its queues; worker 0 also runs timers and HTTP."""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn, Protocol

from sas.adapters.clients import http_session
from sas_local.devhost import logs
from sas_local.devhost.config import EXIT_CONFIG, DevHostError, load_host_config
from sas_local.devhost.http import DevHostAsgi, HttpServer
from sas_local.devhost.http_routes import compile_routes
from sas_local.devhost.loader import load_app, preflight, resolve, select
from sas_local.devhost.queues import QueuePoller
from sas_local.devhost.timers import TimerRunner
from sas_local.devhost.watcher import SharedQueueWatcher

log = logging.getLogger(__name__)

EXIT_STARTUP = 3  # the app failed to import, or storage/HTTP port unavailable at start
PRELOAD_ENV = "SAS_DEVHOST_PRELOAD"
"""Comma-separated modules each worker imports before it loads the app: a local test hook
(the chaos campaign's fault injection, sas_local/chaos/inject.py); unset in normal runs."""


@dataclass(frozen=True)
class WorkerOptions:
    app: Path
    index: int
    http_port: int
    functions: tuple[str, ...] | None
    timers: bool
    grace: float
    log_level: str
    ready_fd: int | None


class Component(Protocol):
    def stop(self) -> None: ...

    def wait_idle(self, deadline: float) -> bool: ...


@dataclass(frozen=True)
class Started:
    components: list[Component]
    functions: tuple[str, ...]
    http_port: int


def _start(options: WorkerOptions) -> Started:
    for module in filter(None, (m.strip() for m in os.environ.get(PRELOAD_ENV, "").split(","))):
        importlib.import_module(module)
    app_path = options.app.resolve()
    host = load_host_config(app_path.parent)
    loaded = load_app(app_path)
    plan = resolve(select(loaded.functions, options.functions), os.environ, timers=options.timers)
    preflight(plan, os.environ)
    lead = options.index == 0
    pollers = [QueuePoller(function, host.queues, app_path.parent) for function in plan.queues]
    for poller in pollers:
        poller.prepare()
    watcher = SharedQueueWatcher()  # the app's sends in this process wake its pollers
    for poller in pollers:
        watcher.register(poller.function.queue_name, poller)
    watcher.watch([http_session()])
    components: list[Component] = []
    http_port = 0
    if lead and options.http_port:
        health = {
            "status": "ok",
            "functions": list(plan.names),
            "worker": options.index,
            "instance_id": os.environ.get("SAS_INSTANCE_ID", ""),
        }
        asgi = DevHostAsgi(
            compile_routes(plan.http, host.route_prefix), loaded.app, app_path.parent, health
        )
        server = HttpServer(asgi, options.http_port, options.grace)
        server.start()
        components.append(server)
        http_port = options.http_port
    for poller in pollers:
        poller.start()
        components.append(poller)
    if lead:
        for timer in plan.timers:
            runner = TimerRunner(timer, app_path.parent)
            runner.start()
            components.append(runner)
    log.info(
        "sas.devhost.worker_started",
        extra={
            "worker": options.index,
            "queues": ",".join(f"{q.name}<-{q.queue_name}" for q in plan.queues) or "-",
            "timers": len(plan.timers) if lead else 0,
            "http_port": http_port or "off",
        },
    )
    return Started(components, plan.names, http_port)


def _report_ready(options: WorkerOptions, started: Started) -> None:
    if options.ready_fd is None:
        return
    logs.flush()  # ready means its start-up lines are on stderr (tests and users read them)
    line = json.dumps(
        {
            "worker": options.index,
            "pid": os.getpid(),
            "functions": list(started.functions),
            "http_port": started.http_port,
        }
    )
    try:
        os.write(options.ready_fd, f"ready {line}\n".encode())
        os.close(options.ready_fd)
    except OSError:
        pass  # the parent is gone; the parent-death check below ends this worker


def _shutdown(components: list[Component], grace: float) -> None:
    deadline = time.monotonic() + grace
    for component in components:
        component.stop()
    idle = [component.wait_idle(deadline) for component in components]
    if not all(idle):
        log.warning("sas.devhost.grace_expired", extra={"grace_s": grace})


def run_worker(options: WorkerOptions) -> int:
    instance = os.environ.setdefault(
        "SAS_INSTANCE_ID", f"devhost-{socket.gethostname()}-{os.getpid()}"
    )
    logs.configure(options.log_level, f"w{options.index} {os.getpid()}")
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    parent = os.getppid()
    try:
        started = _start(options)
    except DevHostError as exc:
        print(f"sas.devhost: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except Exception:
        log.exception("sas.devhost.startup_failed", extra={"worker": options.index})
        return EXIT_STARTUP
    _report_ready(options, started)
    log.debug("sas.devhost.worker_ready", extra={"worker": options.index, "instance": instance})
    while not stop.wait(0.25):
        if os.getppid() != parent:
            log.warning("sas.devhost.parent_gone", extra={"worker": options.index})
            break
    _shutdown(started.components, options.grace)
    log.info("sas.devhost.worker_stopped", extra={"worker": options.index})
    return 0


def worker_main(options: WorkerOptions) -> NoReturn:
    """Run and exit hard: an invocation still stuck after the grace must not keep us alive."""
    code = run_worker(options)
    logs.shutdown()  # write what is still queued: os._exit runs no atexit hook
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

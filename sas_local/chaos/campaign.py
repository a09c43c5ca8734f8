"""A chaos campaign: the whole system under a seeded schedule of every fault, then the checker.

``python -m sas_local.chaos --orders N --seed S [--workers 2] [--supervisors 2] [--report p]``

Starts Azurite, the simulator, a dev host for the core functions (``--workers`` workers, worker
0 also serves HTTP and sweeps), the agents in a dev host of their own and ``--supervisors - 1``
extra dev hosts that only run the ``supervise`` timer. Every worker preloads
``sas_local.chaos.inject`` and runs the app's workflows with their Python actions behind
``sas_local.python_faults``. Orders of both example workflows, by turns, are submitted to the
orders queue with a status queue, paced by the in-flight index, while a seeded schedule
injects faults. Then the faults stop, the system drains (every order terminal, the in-flight
index empty, no alert owed; bounded), and the independent checker (``checker.py``) judges what
is left. Fault kinds: docs/reliability.md.

Mid-storm the campaign deploys new code (``deploy``): it restarts a seeded part of the dev
hosts with ``sas_local/chaos/deployed_workflows.py`` (the app's workflows and a version 2 of
each), then, a seeded while later, the rest; meanwhile old and new hosts share the queues.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient

from sas.domain.wire import PRIORITIES, lane_function_name
from sas_local import python_faults
from sas_local.azurite import free_port
from sas_local.chaos import checker, deployed_workflows
from sas_local.chaos.inject import (
    CALM_FILE,
    CONFIG_ENV,
    CRASH_DIR,
    MIN_WORKER_AGE,
    count_events,
)
from sas_local.processes import REPO_ROOT, DevHost, pid_alive, start_devhost, start_process
from sas_local.stack import Layout, LocalStack

STATUS_QUEUE = "status-chaos"
PRELOAD = "sas_local.chaos.inject"
NEW_CODE = {python_faults.APP_ENV: deployed_workflows.__name__}
"""What a host the ``deploy`` fault restarts runs instead of the app's ``workflows``."""
SUBMIT_FUNCTIONS = frozenset(lane_function_name("submit", p) for p in PRIORITIES)
HELD_EVENT = b"sas.message_held"
"""The log event of a host that put a message back for a host with the order's version."""

FAULT_KINDS = (
    "worker_sigkill",
    "crash_before_send",
    "azurite_pause",
    "remote_transient",
    "remote_outage",
    "remote_slow",
    "remote_refusal",
    "undo_refused",
    "duplicate_message",
    "delayed_message",
    "clock_skew",
    "operator_resubmit",
    "python_transient",
    "python_lost_reply",
    "python_slow",
    "python_refusal",
    "deploy",
    "surge",
    "operator_cancel",
    "operator_suspend",
)


@dataclass(frozen=True)
class Profile:
    """How hard each fault hits. The defaults are the campaign's; tests tune them."""

    transient_rate: float = 0.08
    permanent_rate: float = 0.05
    undo_permanent_rate: float = 0.3
    slow_rate: float = 0.02
    slow_seconds: float = 20.0
    lost_reply_rate: float = 0.04
    """Python actions (the workspace workflow's agents) whose effect applies, then the call
    fails; their transient, refusal and slow rates are the remote services'."""
    duplicate_rate: float = 0.03
    delay_rate: float = 0.03
    delay_max: float = 6.0
    skew_share: float = 3.0
    """Each process's host clock is off by up to +-(share x SAS_CLOCK_SKEW_SECONDS), within
    the allowance and beyond it: every role reads the store's time, whatever its host's."""
    kill_every: float = 12.0
    crash_every: float = 15.0
    pause_every: float = 30.0
    pause_seconds: tuple[float, float] = (1.0, 4.0)
    outage_every: float = 40.0
    outage_seconds: tuple[float, float] = (3.0, 8.0)
    resubmit_share: float = 0.5
    resubmit_max: int = 2
    steer_every: float = 2.0
    """Every so many seconds of the storm an operator picks a recent order and, if it is still
    running forward, cancels it or suspends it (by turns, seeded)..."""
    steer_share: float = 0.05
    """...at most this share of the orders in all..."""
    suspend_seconds: tuple[float, float] = (2.0, 8.0)
    """...and resumes a suspended one after this long (at the latest when the storm ends)."""
    submit_duplicate_rate: float = 0.02
    window: int = 150
    """Most orders in flight (in-flight index + orders queue) while submitting."""
    surge_after: tuple[float, float] = (0.35, 0.5)
    """The surge comes once this share of the orders (seeded within) was submitted: then..."""
    surge_windows: int = 4
    """...this many windows of orders (or all that are left) are sent at once, past the
    window: a burst several times what the machine works off in the meanwhile."""
    min_storm: float = 45.0
    """Faults go on at least this long, even if every order is submitted sooner."""
    runner_faults: bool = True
    """Kills, crash tokens, Azurite pauses, outages and the surge (off: only the in-process
    and remote faults, as the broken-build tests want)."""
    deploy: bool = True
    """Restart every dev host on new code, in two waves, while the storm goes on."""
    deploy_after: tuple[float, float] = (0.3, 0.45)
    """The first wave comes once this share of the orders (seeded within) was submitted..."""
    deploy_not_before: float = 10.0
    """...and the storm ran this long: orders of the old version are in flight by then."""
    deploy_share: tuple[float, float] = (0.3, 0.7)
    """Share of the hosts that take no submission that get their new host in the first wave,
    with every host that does."""
    deploy_gap: tuple[float, float] = (15.0, 30.0)
    """Seconds from the first wave's hosts being up to the second wave: old and new hosts
    side by side, for longer than a step's budget (15 s)."""
    deploy_workers: int | None = None
    """Workers of each new host; None: as many as the host it replaces."""


@dataclass
class Options:
    orders: int
    seed: int
    workers: int = 2
    supervisors: int = 2
    report: Path | None = None
    log_dir: Path | None = None
    drain_timeout: float | None = None
    profile: Profile = field(default_factory=Profile)
    faults: bool = True
    broken: tuple[str, ...] = ()
    clock_skew_seconds: float = 2.0
    layout: Layout = "agents apart"
    """How the functions are spread over dev hosts (sas_local/stack.py): the core functions
    and the agents apart, or ``flex``, each function in processes of its own."""


@dataclass
class _Shared:
    faults: Counter[str] = field(default_factory=Counter)
    alerts: dict[str, str] = field(default_factory=dict)
    """Queue message id -> body: a copy whose delete failed comes back, and is one copy."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    resubmits_pending: int = 0
    notes: list[str] = field(default_factory=list)

    def count(self, kind: str, n: int = 1) -> None:
        with self.lock:
            self.faults[kind] += n


def order_body(order_id: str, index: int) -> str:
    """An OrderSubmitted as an application posts it (Base64 JSON on the orders queue): the
    example workflows by turns, an order (HTTP agents) then a workspace (Python agents)."""
    if index % 2:
        workflow = "workspace"
        details: dict[str, Any] = {
            "team": f"team-{index}",
            "owner": f"owner{index}@example.com",
            "plan": ("free", "team", "enterprise")[index % 3],
            "region": ("westeurope", "eastus", "australiaeast")[index // 2 % 3],
        }
    else:
        workflow = "order"
        details = {
            "customer_id": f"customer-{index % 17}",
            "currency": "EUR",
            "address": f"{index} Chaos Street",
            "lines": [
                {"sku": f"sku-{index % 5}", "quantity": 1 + index % 3, "unit_price_cents": 1999}
            ],
        }
    document = {
        "type": "OrderSubmitted",
        "v": 1,
        "order_id": order_id,
        "workflow": workflow,
        "details": details,
        "reply_to": STATUS_QUEUE,
    }
    return base64.b64encode(json.dumps(document).encode()).decode()


class Campaign:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.profile = options.profile
        self.rng = random.Random(options.seed)  # noqa: S311 - a seeded schedule
        self.design = checker.Design.load()
        self.logs = options.log_dir or Path(
            tempfile.mkdtemp(prefix=f"sas-chaos-{options.seed}-", dir="/tmp")
        )
        self.chaos_dir = self.logs / "chaos"
        self.shared = _Shared()
        self.storm_over = threading.Event()
        self.done = threading.Event()
        self.stack: LocalStack | None = None
        self.supervisors: list[DevHost] = []
        self.crash_tokens = 0
        self.submitted = 0
        self.started = time.monotonic()
        self.redeployed: list[DevHost] = []
        """Hosts the deploy started or replaced: stopped with the rest, whatever happened."""
        self.beside: list[tuple[DevHost, DevHost]] = []
        """(old, new): hosts on new code started beside the old ones, until the old ones go."""

    # --- the stack ---------------------------------------------------------------------

    def chaos_env(self) -> dict[str, str]:
        p, o = self.profile, self.options
        faults = o.faults
        config = {
            "dir": str(self.chaos_dir),
            "seed": o.seed,
            "skew_max": p.skew_share * o.clock_skew_seconds if faults else 0.0,
            "duplicate_rate": p.duplicate_rate if faults else 0.0,
            "delay_rate": p.delay_rate if faults else 0.0,
            "delay_max": p.delay_max,
            "queues": {
                "alerts": self.design.alerts_queue,
                "orders": self.design.orders_queue,
                "replies": "sas-replies",
                "scheduler": "sas-scheduler",
            },
            "broken": list(o.broken),
        }
        python = {
            "seed": o.seed,
            "events": str(self.chaos_dir),
            **(
                {
                    "transient_rate": p.transient_rate,
                    "lost_reply_rate": p.lost_reply_rate,
                    "permanent_rate": p.permanent_rate,
                    "slow_rate": p.slow_rate,
                    "slow_seconds": p.slow_seconds,
                }
                if faults
                else {}
            ),
        }
        return {
            "SAS_DEVHOST_PRELOAD": PRELOAD,
            CONFIG_ENV: json.dumps(config),
            "SAS_CLOCK_SKEW_SECONDS": f"{o.clock_skew_seconds:g}",
            "SAS_WORKFLOWS_MODULE": python_faults.MODULE,
            python_faults.CONFIG_ENV: json.dumps(python),
        }

    def start(self) -> LocalStack:
        (self.chaos_dir / CRASH_DIR).mkdir(parents=True, exist_ok=True)
        stack = LocalStack.start(
            workers=self.options.workers,
            log_dir=self.logs,
            extra_queues=(STATUS_QUEUE,),
            env_overrides=self.chaos_env(),
            layout=self.options.layout,
        )
        self.stack = stack
        try:
            for index in range(1, max(self.options.supervisors, 1)):
                self.supervisors.append(
                    start_devhost(
                        REPO_ROOT / "function_app.py",
                        env=stack.env,
                        workers=1,
                        http_port=0,
                        functions=("supervise",),
                        timers=True,
                        settings=self.logs / "local.settings.json",
                        log_dir=self.logs / f"supervisor{index}",
                        cwd=REPO_ROOT,
                        timeout=60,
                    )
                )
            self.set_faults(outage=None)
        except BaseException:
            self.stop()
            raise
        return stack

    def stop(self) -> None:
        self.resume_azurite()
        for host in [*self.supervisors, *self.redeployed]:
            host.stop()
        if self.stack is not None:
            self.stack.stop()

    def set_faults(self, outage: tuple[str, float] | None) -> None:
        stack = self.running
        p = self.profile
        config: dict[str, Any] = {"seed": self.options.seed}
        if self.options.faults:
            config |= {
                "transient_rate": p.transient_rate,
                "permanent_rate": p.permanent_rate,
                "undo_permanent_rate": p.undo_permanent_rate,
                "slow_rate": p.slow_rate,
                "slow_seconds": p.slow_seconds,
            }
        if outage is not None:
            config |= {
                "outage_service": outage[0],
                "outage_start": 0.0,
                "outage_seconds": outage[1],
            }
        httpx.put(f"{stack.simulator_url}/faults", json=config, timeout=30).raise_for_status()

    @property
    def running(self) -> LocalStack:
        if self.stack is None:
            raise RuntimeError("the stack is not running")
        return self.stack

    # --- faults ------------------------------------------------------------------------

    def workers(self) -> list[tuple[str, int]]:
        stack = self.running
        hosts = [(_role(host), host) for host in stack.hosts]
        hosts += [("supervisor", host) for host in self.supervisors]
        hosts += [(_role(new), new) for _, new in self.beside]
        return [(role, pid) for role, host in hosts for pid in host.worker_pids()]

    def kill_worker(self) -> None:
        eligible = [(r, p) for r, p in self.workers() if _age(p) >= MIN_WORKER_AGE]
        if not eligible:
            return
        role, pid = self.rng.choice(sorted(eligible))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            self.shared.count("worker_sigkill")
            self.shared.count(f"worker_sigkill.{role}")

    def arm_crash(self) -> None:
        """Arm a crash token, unless one for the same kind of send waits untaken: tokens armed
        while no worker may take them would go off together, a burst of crashes, not one."""
        target = self.rng.choice(("any", "any", "agent", "replies", "scheduler", "alerts"))
        waiting = (t.name for t in (self.chaos_dir / CRASH_DIR).iterdir() if "." not in t.name)
        if any(name.endswith(f"-{target}") for name in waiting):
            return
        self.crash_tokens += 1
        (self.chaos_dir / CRASH_DIR / f"{self.crash_tokens:04d}-{target}").touch()

    def pause_azurite(self) -> None:
        stack = self.running
        low, high = self.profile.pause_seconds
        seconds = self.rng.uniform(low, high)
        pid = stack.azurite.process.pid
        try:
            os.killpg(pid, signal.SIGSTOP)
            self.shared.count("azurite_pause")
            self.storm_over.wait(seconds)
        finally:
            self.resume_azurite()

    def resume_azurite(self) -> None:
        if self.stack is not None and pid_alive(self.stack.azurite.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.stack.azurite.process.pid, signal.SIGCONT)

    def outage(self) -> None:
        low, high = self.profile.outage_seconds
        service = self.rng.choice(("inventory", "payment", "shipping"))
        self.set_faults(outage=(service, self.rng.uniform(low, high)))
        self.shared.count("remote_outage")

    def storm(self) -> None:
        """Inject runner-side faults on a seeded schedule until the storm is over. The first
        of each kind comes early, so even a short campaign has every kind."""
        p = self.profile
        actions = {
            "kill": (self.kill_worker, p.kill_every),
            "crash": (self.arm_crash, p.crash_every),
            "pause": (self.pause_azurite, p.pause_every),
            "outage": (self.outage, p.outage_every),
        }
        start = time.monotonic()
        due = {name: start + self.rng.uniform(2, 12) for name in actions}
        while not self.storm_over.is_set():
            name = min(due, key=lambda n: due[n])
            if self.storm_over.wait(max(0.0, due[name] - time.monotonic())):
                break
            action, every = actions[name]
            try:
                action()
            except Exception as exc:  # a fault that could not be injected is only a note
                self.shared.notes.append(f"{name} failed: {type(exc).__name__}: {exc}")
            if name == "kill" and not self.shared.faults["worker_sigkill"]:
                due[name] = time.monotonic() + 2  # nobody old enough yet: try again soon
            else:
                due[name] = time.monotonic() + self.rng.expovariate(1 / every)

    # --- the deploy --------------------------------------------------------------------

    def deploy(self) -> None:
        """A rolling deploy of new code, once the storm is under way. First every host that
        takes submissions and a seeded part of the others get a new host beside them (old
        instances drain slowly): orders the new ones take are bound to v2 and meet old hosts,
        of their own function too. A seeded while later the rest get theirs, and every old
        host stops as a deploy stops it (SIGTERM: invocations under way may finish, within
        the grace)."""
        o, p = self.options, self.profile
        rng = random.Random(o.seed * 104_729 + 3)  # noqa: S311 - its own: the storm's is unchanged
        target = int(o.orders * rng.uniform(*p.deploy_after))
        while self.submitted < target or time.monotonic() - self.started < p.deploy_not_before:
            if self.done.wait(0.2):
                return
        hosts = self.hosts()
        submits = [h for h in hosts if SUBMIT_FUNCTIONS & set(h.functions)]
        others = [h for h in hosts if not SUBMIT_FUNCTIONS & set(h.functions)]
        rng.shuffle(others)
        more = round(len(others) * rng.uniform(*p.deploy_share))
        first, rest = [*submits, *others[:more]], others[more:]
        gap = rng.uniform(*p.deploy_gap)
        self.beside = self.start_new_code(first)
        self.shared.count("deploy.first_wave_hosts", len(first))
        self.progress(f"deploy: {len(first)} host(s) on new code beside the old", self.started)
        if self.done.wait(gap):
            return
        self.retire([*self.beside, *self.start_new_code(rest)])
        self.beside = []
        self.progress(f"deploy: all {len(hosts)} host(s) on new code", self.started)
        self.shared.count("deploy.hosts", len(hosts))
        self.shared.count("deploy")

    def hosts(self) -> list[DevHost]:
        """Every dev host, with those started beside an old one."""
        return [*self.running.hosts, *self.supervisors, *(new for _, new in self.beside)]

    def start_new_code(self, old: list[DevHost]) -> list[tuple[DevHost, DevHost]]:
        """A host on new code for each of ``old``, running the same functions: (old, new)."""
        stack = self.running
        pairs: list[tuple[DevHost, DevHost]] = []
        for host in old:
            args = list(host.args)
            if host.http_url is not None:  # beside the old one: a port of its own
                args[args.index("--http-port") + 1] = str(free_port())
            if self.profile.deploy_workers is not None:
                args[args.index("--workers") + 1] = str(self.profile.deploy_workers)
            started = start_process(
                args,
                env={**stack.env, **NEW_CODE},
                cwd=REPO_ROOT,
                log_dir=self.logs / "deployed" / host.log_dir.name,
            )
            new = DevHost(started.args, started.process, started.log_dir)
            self.redeployed.append(new)
            pairs.append((host, new))
        for _, new in pairs:
            new.wait_ready(60 + 2 * len(pairs))
        return pairs

    def retire(self, pairs: list[tuple[DevHost, DevHost]]) -> None:
        """Each new host takes its old one's place; then the old ones stop, all at once."""
        stack = self.running
        for old, new in pairs:
            self.redeployed.append(old)
            if stack.devhost is old:
                stack.devhost = new
                stack.api_url = new.http_url or stack.api_url
            elif stack.agents is old:
                stack.agents = new
            elif any(host is old for host in stack.others):
                stack.others = tuple(new if host is old else host for host in stack.others)
            else:
                self.supervisors = [new if host is old else host for host in self.supervisors]
        stopping = [threading.Thread(target=old.stop) for old, _ in pairs]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()

    # --- the operator ------------------------------------------------------------------

    def operator(self) -> None:
        """Reads alerts (keeping every raw copy for the checker) and resubmits a seeded share
        of the Error orders once their alert is out, racing the Supervisors' sweeps."""
        stack = self.running
        rng = random.Random(self.options.seed * 7919 + 1)  # noqa: S311
        conn = stack.azurite.connection_string
        alerts = QueueClient.from_connection_string(conn, self.design.alerts_queue)
        table = TableClient.from_connection_string(conn, self.design.table_name)
        status = QueueClient.from_connection_string(conn, STATUS_QUEUE)
        seen: set[str] = set()
        resubmits: Counter[str] = Counter()
        queue: list[str] = []
        cleared = time.monotonic()
        while not self.done.is_set():
            if time.monotonic() - cleared > 10:
                # Status events are best effort and not judged: one call keeps the queue small.
                with contextlib.suppress(Exception):
                    status.clear_messages()
                cleared = time.monotonic()
            try:
                batch = list(alerts.receive_messages(messages_per_page=32, max_messages=32))
            except Exception:
                batch = []
            for message in batch:
                body = checker.decode_body(message.content)
                with self.shared.lock:
                    self.shared.alerts[message.id] = body
                with contextlib.suppress(Exception):
                    alerts.delete_message(message)
                try:
                    alert_id, order_id = _alert_ids(body)
                except ValueError:
                    continue
                if alert_id in seen or self.options.faults is False:
                    continue
                seen.add(alert_id)
                if resubmits[order_id] < self.profile.resubmit_max and (
                    rng.random() < self.profile.resubmit_share
                ):
                    resubmits[order_id] += 1
                    queue.append(order_id)
            with self.shared.lock:
                self.shared.resubmits_pending = len(queue)
            for order_id in list(queue):
                if self._resubmit_when_alerted(table, order_id, rng):
                    queue.remove(order_id)
            with self.shared.lock:
                self.shared.resubmits_pending = len(queue)
            if not batch:
                self.done.wait(0.5)

    def _resubmit_when_alerted(self, table: TableClient, order_id: str, rng: random.Random) -> bool:
        stack = self.running
        try:
            state = table.get_entity(order_id, self.design.state_row)
        except ResourceNotFoundError:
            return True
        except Exception:
            return False
        if state.get("ProcessState") != "Error":
            return True
        if state.get("AlertPending"):
            return False  # an operator acts on an alert that has been sent
        url = f"{stack.api_url}/api/orders/{order_id}/resubmit"
        racers = 2 if rng.random() < 0.3 else 1
        results: list[int] = []

        def post() -> None:
            try:
                response = httpx.post(url, json={"actor": "chaos-operator"}, timeout=30)
                results.append(response.status_code)
            except httpx.HTTPError:
                results.append(0)

        threads = [threading.Thread(target=post) for _ in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if 200 in results:
            self.shared.count("operator_resubmit")
            if racers > 1:
                self.shared.count("operator_resubmit.raced")
            return True
        return all(code in (404, 409) for code in results)  # someone else moved it on

    def steer(self, ids: list[str]) -> None:
        """Cancels and suspends a seeded share of the orders while they run forward, through
        the HTTP API as an operator would; every suspended order is resumed, its time up or
        the storm over. A 409 (the order moved on: finished, undoing) is no fault of the app."""
        stack, p = self.running, self.profile
        rng = random.Random(self.options.seed * 104729 + 3)  # noqa: S311
        table = TableClient.from_connection_string(
            stack.azurite.connection_string, self.design.table_name
        )
        budget = max(2, int(len(ids) * p.steer_share))
        suspended: dict[str, float] = {}
        while not self.storm_over.wait(p.steer_every) and budget > 0:
            for order_id, due in list(suspended.items()):
                if time.monotonic() >= due and self._resumed(order_id):
                    del suspended[order_id]
            recent = ids[max(0, self.submitted - p.window) : self.submitted]
            if not recent:
                continue
            order_id = rng.choice(recent)
            state: Mapping[str, Any] = {}
            with contextlib.suppress(Exception):  # not inserted yet, or Azurite paused
                state = table.get_entity(order_id, self.design.state_row)
            running = state.get("ProcessState") in ("Pending", "Processing")
            if not running or state.get("Mode") == "undo" or order_id in suspended:
                continue
            cancel = self.shared.faults["operator_cancel"] <= self.shared.faults["operator_suspend"]
            if cancel and self._steer_call(order_id, "cancel", "chaos: the customer asked") == 200:
                self.shared.count("operator_cancel")
                budget -= 1
            elif not cancel and (code := self._steer_call(order_id, "suspend")) in (0, 200):
                # 0: no answer in time, but the app may have suspended it all the same
                self.shared.count("operator_suspend" if code else "operator_suspend.unanswered")
                suspended[order_id] = time.monotonic() + rng.uniform(*p.suspend_seconds)
                budget -= 1
        give_up = time.monotonic() + 180
        while suspended and time.monotonic() < give_up:
            for order_id in list(suspended):
                if self._resumed(order_id):
                    del suspended[order_id]
            time.sleep(1)
        if suspended:
            self.shared.notes.append(f"left suspended (resume unanswered): {sorted(suspended)}")

    def _resumed(self, order_id: str) -> bool:
        """Resumed now, or not suspended (409): never suspended, or finished meanwhile."""
        return self._steer_call(order_id, "resume") in (200, 404, 409)

    def _steer_call(self, order_id: str, verb: str, reason: str | None = None) -> int:
        """The answer's status; 0 when none came (the app may still have acted)."""
        body: dict[str, str] = {"actor": "chaos-operator"}
        if reason is not None:
            body["reason"] = reason
        url = f"{self.running.api_url}/api/orders/{order_id}/{verb}"
        try:
            return httpx.post(url, json=body, timeout=30).status_code
        except httpx.HTTPError:
            return 0

    # --- the run -----------------------------------------------------------------------

    def in_flight(self, table: TableClient, orders: QueueClient) -> int:
        """Orders still indexed as in flight (``table``: the in-flight table) or not taken."""
        live = sum(
            1
            for _ in table.query_entities(
                "PartitionKey eq @pk",
                parameters={"pk": self.design.live_partition},
                select=["RowKey"],
            )
        )
        queued = orders.get_queue_properties().approximate_message_count or 0
        return live + queued

    def run(self) -> dict[str, Any]:
        stack = self.start()
        try:
            return self._run(stack)
        finally:
            self.storm_over.set()
            self.done.set()
            self.stop()

    def _run(self, stack: LocalStack) -> dict[str, Any]:
        o, p = self.options, self.profile
        conn = stack.azurite.connection_string
        orders_queue = QueueClient.from_connection_string(conn, self.design.orders_queue)
        live = TableClient.from_connection_string(conn, self.design.live_table)
        ids = [f"c{o.seed}-{i:05d}" for i in range(o.orders)]
        threads = [threading.Thread(target=self.operator, name="chaos-operator", daemon=True)]
        if o.faults:
            steering = threading.Thread(
                target=self._noted(lambda: self.steer(ids)), name="chaos-steer", daemon=True
            )
            threads.append(steering)
        if o.faults and p.runner_faults:
            threads.append(threading.Thread(target=self.storm, name="chaos-storm", daemon=True))
        deploying = threading.Thread(
            target=self._noted(self.deploy), name="chaos-deploy", daemon=True
        )
        started = self.started = time.monotonic()
        for thread in threads:
            thread.start()
        if o.faults and p.deploy:
            deploying.start()
        submit_rng = random.Random(o.seed * 31 + 7)  # noqa: S311
        surge = self.surge_ids(ids) if o.faults and p.runner_faults else frozenset()
        for index, order_id in enumerate(ids):
            while (
                order_id not in surge
                and _safe(lambda: self.in_flight(live, orders_queue), 0) >= p.window
            ):
                time.sleep(0.5)
            if order_id in surge and not self.shared.faults["surge"]:
                self.progress(f"surge: {len(surge)} orders at once", started)
                self.shared.count("surge")
                self.shared.count("surge.orders", len(surge))
            if index % 250 == 0:
                self.progress(f"submitted {index}/{o.orders}", started)
            body = order_body(order_id, index)
            _retry(lambda body=body: orders_queue.send_message(body))
            self.submitted = index + 1
            if o.faults and submit_rng.random() < p.submit_duplicate_rate:
                _retry(lambda body=body: orders_queue.send_message(body))
                self.shared.count("duplicate_message")
                self.shared.count("duplicate_message.submission")
        submitted_in = time.monotonic() - started
        while o.faults and time.monotonic() - started < p.min_storm:
            time.sleep(0.5)
        if deploying.is_alive():
            self.progress("waiting for the deploy to finish", started)
            deploying.join()
        self.storm_over.set()
        (self.chaos_dir / CALM_FILE).touch()
        for token in (self.chaos_dir / CRASH_DIR).iterdir():
            if "." not in token.name:
                token.unlink(missing_ok=True)  # armed but never taken: not injected
        with contextlib.suppress(Exception):
            self.set_faults(outage=None)
        storm_seconds = time.monotonic() - started
        timeout = o.drain_timeout if o.drain_timeout is not None else 300 + o.orders * 0.05
        drained = self._drain(live, orders_queue, timeout)
        finished = time.monotonic()
        self.done.set()
        threads[0].join(timeout=30)
        evidence = checker.collect(
            conn,
            stack.simulator_url,
            ids,
            design=self.design,
            consumed_alerts=dict(self.shared.alerts),
        )
        verdict = checker.check(evidence, self.design)
        elapsed = finished - started
        faults = self._fault_counts(evidence)
        report: dict[str, Any] = {
            "seed": o.seed,
            "orders": o.orders,
            "workers": o.workers,
            "supervisors": o.supervisors,
            "broken": list(o.broken),
            "faults": faults,
            "recoveries": verdict.recoveries,
            "outcomes": verdict.outcomes,
            "alerts": {
                "raw_copies": verdict.alerts,
                "error_episodes": verdict.error_episodes,
                "missing_definition": verdict.missing_definition_alerts,
            },
            "bound_versions": _bound_versions(evidence, self.design),
            "surge": _ended(evidence, surge, ids),
            "ended_by_order": _states(evidence),
            "drained": drained,
            "seconds": {
                "submitting": round(submitted_in, 1),
                "storm": round(storm_seconds, 1),
                "total": round(elapsed, 1),
            },
            "throughput_orders_per_s": round(o.orders / elapsed, 2) if elapsed else None,
            "violations_by_kind": verdict.by_kind,
            "violations": [v.as_json() for v in verdict.violations[:200]],
            "violation_count": len(verdict.violations),
            "notes": self.shared.notes,
            "logs": str(self.logs),
            "command": (
                f"python -m sas_local.chaos --orders {o.orders} --seed {o.seed} "
                f"--workers {o.workers} --supervisors {o.supervisors} --layout {o.layout!r}"
                + "".join(f" --broken {b}" for b in o.broken)
            ),
        }
        return report

    def surge_ids(self, ids: list[str]) -> frozenset[str]:
        """The orders of the surge: sent one after another, none waiting for the window."""
        p = self.profile
        rng = random.Random(self.options.seed * 7_919 + 5)  # noqa: S311 - the storm's is unchanged
        first = int(len(ids) * rng.uniform(*p.surge_after))
        return frozenset(ids[first : first + p.window * p.surge_windows])

    def _noted(self, action: Callable[[], None]) -> Callable[[], None]:
        """``action`` whose failure is a note of the report (the storm goes on without it)."""

        def run() -> None:
            try:
                action()
            except Exception as exc:
                self.shared.notes.append(f"{action.__name__} failed: {type(exc).__name__}: {exc}")

        return run

    def progress(self, text: str, started: float) -> None:
        faults = dict(sorted(self.shared.faults.items()))
        print(f"chaos +{time.monotonic() - started:.0f}s {text} {faults}", file=sys.stderr)

    def _drain(self, table: TableClient, orders_queue: QueueClient, timeout: float) -> bool:
        start = time.monotonic()
        deadline = start + timeout
        while time.monotonic() < deadline:
            with self.shared.lock:
                pending = self.shared.resubmits_pending
            flying = _safe(lambda: self.in_flight(table, orders_queue), 1)
            if not pending and flying == 0:
                return True
            if int(time.monotonic() - start) % 30 < 2:
                self.progress(f"draining: in flight {flying}, resubmits owed {pending}", start)
            time.sleep(2)
        self.shared.notes.append(f"drain timed out after {timeout:.0f}s")
        return False

    def _fault_counts(self, evidence: checker.Evidence) -> dict[str, int]:
        counts: Counter[str] = Counter(self.shared.faults)
        counts.update(count_events(self.chaos_dir))
        stats = evidence.ledger.get("stats") or {}
        totals: Counter[str] = Counter()
        if isinstance(stats, Mapping):
            for service in stats.values():
                if isinstance(service, Mapping):
                    totals.update({k: v for k, v in service.items() if isinstance(v, int)})
        counts["remote_transient"] = totals["transient_failures"]
        counts["remote_slow"] = totals["slow"]
        counts["remote_outage.rejections"] = totals["outage_rejections"]
        for entity in evidence.entities:
            if entity.get("Kind") == "refused":
                counts["undo_refused" if entity.get("Mode") == "undo" else "remote_refusal"] += 1
        if counts["deploy"]:
            counts["deploy.held"] = _held_messages(self.logs)
        ordered = {kind: counts.get(kind, 0) for kind in FAULT_KINDS}
        ordered |= {k: v for k, v in sorted(counts.items()) if k not in ordered}
        return ordered


GAVE_UP = ("expired_compensate", "expired_compensated", "expired_error", "expired_skipped")
"""Expiries that give up on a step: the order is undone, stops in Error, or skips the step."""


def _states(evidence: checker.Evidence) -> dict[str, str]:
    """Each order's ProcessState at the end, by order id (``compare`` reads two runs')."""
    return dict(
        sorted(
            (str(entity.get("PartitionKey")), str(entity.get("ProcessState")))
            for entity in evidence.entities
            if entity.get("RowKey") == "state"
        )
    )


def _ended(evidence: checker.Evidence, surge: frozenset[str], ids: list[str]) -> dict[str, Any]:
    """How the surge's orders ended beside the others': by state, and how many were given up
    on after expiries (rather than refused): a surge that failed orders shows there."""
    states: dict[str, str] = {}
    gave_up: set[str] = set()
    for entity in evidence.entities:
        order_id = str(entity.get("PartitionKey"))
        if entity.get("RowKey") == "state":
            states[order_id] = str(entity.get("ProcessState"))
        elif entity.get("Kind") in GAVE_UP:
            gave_up.add(order_id)

    def of(group: list[str]) -> dict[str, Any]:
        return {
            "orders": len(group),
            "ended": dict(sorted(Counter(states.get(i, "lost") for i in group).items())),
            "gave_up_after_expiries": sum(i in gave_up for i in group),
        }

    return {
        "surge": of([i for i in ids if i in surge]),
        "rest": of([i for i in ids if i not in surge]),
    }


def _bound_versions(evidence: checker.Evidence, design: checker.Design) -> dict[str, int]:
    """Orders by the workflow version they were bound to: ``order v2`` came with the deploy."""
    found: Counter[str] = Counter(
        f"{entity.get('Workflow')} v{checker.bound_version(entity)}"
        for entity in evidence.entities
        if entity.get("RowKey") == design.state_row
    )
    return dict(sorted(found.items()))


def _held_messages(logs: Path) -> int:
    """Messages a host put back for one that has their order's version, from every log."""
    held = 0
    for path in logs.rglob("stderr.log"):
        with path.open("rb") as lines:
            held += sum(HELD_EVENT in line for line in lines)
    return held


def _role(host: DevHost) -> str:
    """What a dev host runs: the agents, the supervise timer alone, or core functions."""
    functions = host.functions
    if functions and all(name.startswith("agent_") for name in functions):
        return "agents"
    return "supervisor" if functions == ["supervise"] else "core"


def _alert_ids(body: str) -> tuple[str, str]:
    try:
        document = json.loads(body)
        return str(document["alert_id"]), str(document["order_id"])
    except (ValueError, KeyError, TypeError):
        raise ValueError("not an alert") from None


def _age(pid: int) -> float:
    """Seconds since process ``pid`` started (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return 0.0
    start_ticks = int(stat[stat.rfind(")") + 2 :].split()[19])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _safe(call: Any, default: int) -> int:
    try:
        value: int = call()
    except Exception:
        return default
    return value


def _retry(call: Any, attempts: int = 10) -> None:
    for attempt in range(attempts):
        try:
            call()
            return
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(1)


def run_campaign(options: Options) -> dict[str, Any]:
    report = Campaign(options).run()
    if options.report is not None:
        options.report.parent.mkdir(parents=True, exist_ok=True)
        options.report.write_text(json.dumps(report, indent=2) + "\n")
    return report

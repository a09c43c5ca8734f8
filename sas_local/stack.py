"""The whole local system in one object: Azurite, the remote simulator and the dev host.

Used by the demo (`make run`) and the end-to-end tests, so both run exactly the same stack.
The simulator plays the app's HTTP agents, but those a user gives a service of their own
(``user``: sas_local/user_settings.py), and answers any other service 404.
Its dev hosts are laid out one of three ways (``Layout``): every function in one host; the
agents in a host of their own; or as Flex Consumption runs them, every function in processes
of its own (only HTTP functions share an instance there), so nothing one function leaves in a
process can help another.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from sas import settings as settings_module
from sas.declared import registry
from sas.domain.wire import PRIORITIES, lane_function_name
from sas.settings import AGENTS, HTTP_AGENTS
from sas_local import user_settings
from sas_local.azurite import Azurite, free_port
from sas_local.processes import REPO_ROOT, DevHost, ManagedProcess, start_devhost, start_process
from sas_local.provision import provision


def app_env(
    connection_string: str,
    simulator_url: str,
    *,
    explicit_queues: bool = False,
    agents: Sequence[str] = HTTP_AGENTS,
) -> dict[str, str]:
    """App settings for a local run: Storage Queues on Azurite, remotes on the simulator.

    ``explicit_queues``: every queue also named by its own setting, for another commit of the
    app (the benchmark's comparison) whose triggers name a setting (``%SAS_QUEUE_…%``).
    ``agents``: those whose remote the simulator plays (another app's own)."""
    queues = settings_module.DEFAULT_QUEUES if explicit_queues else {}
    return {
        **queues,
        "SAS_TRANSPORT": "storage",
        settings_module.STORAGE_CONNECTION: connection_string,
        "AzureWebJobsStorage": connection_string,
        settings_module.TABLE_NAME: settings_module.DEFAULT_TABLE,
        # Locally the Supervisor sweeps every 2 s, so recoveries show within a demo run.
        settings_module.SUPERVISOR_SCHEDULE: "*/2 * * * * *",
        settings_module.MAX_FAILURES: "3",
        **{settings_module.remote_url_setting(a): f"{simulator_url}/{a}" for a in agents},
        **registry().settings,  # the Python agents' own, at their local values
    }


AGENT_FUNCTIONS = tuple(
    lane_function_name(f"agent_{agent}", p) for agent in AGENTS for p in PRIORITIES
)
QUEUE_FUNCTIONS = tuple(
    lane_function_name(f, p) for f in ("submit", "schedule", "on_reply") for p in PRIORITIES
)
CORE_FUNCTIONS = (*QUEUE_FUNCTIONS, "supervise", "http_app_func")
Layout = Literal["shared", "agents apart", "flex"]


@dataclass(frozen=True)
class HostPlan:
    name: str
    functions: tuple[str, ...] | None
    """None: every function of the app."""
    workers: int
    http: bool
    timers: bool


def host_plans(layout: Layout, workers: int) -> list[HostPlan]:
    """The dev hosts of a layout; the first serves HTTP."""
    if layout == "shared":
        return [HostPlan("devhost", None, workers, http=True, timers=True)]
    if layout == "agents apart":
        return [
            HostPlan("devhost", CORE_FUNCTIONS, workers, http=True, timers=True),
            HostPlan("agents", AGENT_FUNCTIONS, 1, http=False, timers=False),
        ]
    # Flex Consumption: one scaling group per non-HTTP function, the HTTP ones share one. Each
    # queue function scales out on its own: ``workers`` instances of it, competing for messages.
    return [
        HostPlan("devhost", ("http_app_func",), 1, http=True, timers=False),
        HostPlan("supervise", ("supervise",), 1, http=False, timers=True),
        *(
            HostPlan(name, (name,), workers, http=False, timers=False)
            for name in (*QUEUE_FUNCTIONS, *AGENT_FUNCTIONS)
        ),
    ]


def simulator_args(port: int, services: Sequence[str]) -> list[str]:
    """The command that serves the simulator on ``port``, playing ``services`` only."""
    return [
        sys.executable,
        "-m",
        "sas_local.simulator",
        "--port",
        str(port),
        "--services",
        ",".join(services),
    ]


def simulator_endpoints(
    simulator_url: str, endpoints: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, str]:
    """``SAS_REMOTE_<AGENT>_ENDPOINTS`` settings for named endpoints of the simulator: each
    entry is ``{"name": ..., "capacity": ...}``; its URL is the simulator's route for it."""
    return {
        settings_module.remote_endpoints_setting(agent): json.dumps(
            [
                {**entry, "url": f"{simulator_url}/endpoints/{entry['name']}/{agent}"}
                for entry in entries
            ]
        )
        for agent, entries in endpoints.items()
    }


@dataclass
class LocalStack:
    azurite: Azurite
    simulator: ManagedProcess
    devhost: DevHost
    """Runs every function, or all but the agents when ``agents`` is set."""
    agents: DevHost | None
    """The agents in a dev host of their own (so a test or the demo can crash one)."""
    env: dict[str, str]
    settings: settings_module.Settings
    simulator_url: str
    api_url: str
    others: tuple[DevHost, ...] = ()
    """The Flex layout's other hosts, one per function."""
    played: tuple[str, ...] = ()
    """The services the simulator plays."""
    own: Mapping[str, str] = field(default_factory=dict)
    """The HTTP agents the user gives a service of their own: agent -> the setting naming it."""

    @classmethod
    def start(
        cls,
        *,
        workers: int = 2,
        log_dir: Path | None = None,
        extra_queues: tuple[str, ...] = (),
        env_overrides: Mapping[str, str] | None = None,
        agents_apart: bool = False,
        layout: Layout | None = None,
        app_root: Path = REPO_ROOT,
        endpoints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        host_env: Mapping[str, Mapping[str, str]] | None = None,
        remote_agents: Sequence[str] = (),
        user: Mapping[str, str] | None = None,
    ) -> LocalStack:
        """``app_root``: the checkout whose function_app.py (and dev host) runs; another
        commit's worktree when the benchmark compares two commits. ``endpoints``: named
        endpoints of the simulator per agent (``simulator_endpoints``). ``host_env``: more
        environment for one dev host only (``devhost`` or ``agents``), such as a skewed clock.
        ``remote_agents``: more agents whose remote the simulator plays (another app's).
        ``layout``: how the functions are spread over dev hosts (default: the agents apart
        when ``agents_apart``, else shared). ``user``: the user's settings
        (``user_settings.read``), over the stack's own but under ``env_overrides``."""
        logs = log_dir or Path(tempfile.mkdtemp(prefix="sas-stack-"))
        logs.mkdir(parents=True, exist_ok=True)
        # The env below is the whole config: a settings file of our own (the same values; the
        # env wins anyway) keeps a developer's local.settings.json (pointing at some other
        # Azurite) out of it. The `sas` CLI reads it to reach this run (.sas-run for the demo).
        run_settings = logs / "local.settings.json"
        remotes = (*HTTP_AGENTS, *remote_agents)
        own = user_settings.own_services(user or {}, remotes)
        played = tuple(agent for agent in remotes if agent not in own)
        azurite = Azurite.start()
        simulator: ManagedProcess | None = None
        hosts: list[DevHost] = []
        try:
            port = free_port()
            simulator = start_process(simulator_args(port, played), log_dir=logs / "simulator")
            simulator_url = f"http://127.0.0.1:{port}"
            simulator.wait_for_http(f"{simulator_url}/health")
            simulated = {a: e for a, e in (endpoints or {}).items() if a in played}
            env = {
                **app_env(
                    azurite.connection_string,
                    simulator_url,
                    explicit_queues=app_root.resolve() != REPO_ROOT.resolve(),
                    agents=played,
                ),
                **simulator_endpoints(simulator_url, simulated),
                **user_settings.given(user or {}),
                **(env_overrides or {}),
            }
            settings = settings_module.load(env)
            provision(settings, extra_queues)
            run_settings.write_text(json.dumps({"IsEncrypted": False, "Values": env}, indent=2))
            chosen = layout or ("agents apart" if agents_apart else "shared")
            plans = host_plans(chosen, workers)
            for plan in plans:  # all started at once, then each waited for
                hosts.append(_start_host(plan, app_root, env, host_env, run_settings, logs))
            for host in hosts:
                # Seconds when idle; minutes while a suite's other stacks load 2 cores.
                host.wait_ready(180 + 2 * len(hosts))
        except BaseException:
            for host in hosts:
                host.stop()
            if simulator is not None:
                simulator.stop()
            azurite.stop()
            raise
        api_url = hosts[0].http_url or ""
        agents = hosts[1] if chosen == "agents apart" else None
        others = tuple(hosts[1:]) if chosen == "flex" else ()
        return cls(
            azurite,
            simulator,
            hosts[0],
            agents,
            env,
            settings,
            simulator_url,
            api_url,
            others,
            played,
            own,
        )

    @property
    def hosts(self) -> tuple[DevHost, ...]:
        return tuple(h for h in (self.devhost, self.agents, *self.others) if h is not None)

    def stderr(self) -> str:
        """Every dev host's log, one after another (in Flex, each function logs apart)."""
        return "".join(host.stderr() for host in self.hosts)

    def stop(self) -> None:
        try:
            for host in self.hosts:
                host.stop()
        finally:
            try:
                self.simulator.stop()
            finally:
                self.azurite.stop()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _start_host(
    plan: HostPlan,
    app_root: Path,
    env: Mapping[str, str],
    host_env: Mapping[str, Mapping[str, str]] | None,
    run_settings: Path,
    logs: Path,
) -> DevHost:
    return start_devhost(
        app_root / "function_app.py",
        env={**env, **(host_env or {}).get(plan.name, {})},
        workers=plan.workers,
        http_port=free_port() if plan.http else 0,
        functions=plan.functions,
        timers=plan.timers,
        settings=run_settings,
        log_dir=logs / plan.name,
        cwd=app_root,
        wait=False,
    )

"""Workflows are data: an ordered list of steps, each naming its agent and its budget.

The Scheduler drives a workflow definition; it knows nothing of the business operations. An
application declares its workflows in a ``Registry`` (the repository's ``workflows/`` package).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from sas.domain.errors import DefinitionMissing
from sas.domain.messages import problems
from sas.domain.wire import MAX_NAME_LENGTH, STEP_NAME, TABLE_NAME_RULE, Mode

MAX_STEPS = 16
"""Steps of one workflow. Every completed step's result rides in the order's state row: at most
8 KiB of UTF-8, at most 48 KiB stored (ASCII-escaped JSON, UTF-16), so 16 of them and the
details (``MAX_DETAILS_JSON``) stay well under Table Storage's 1 MiB per entity."""
MAX_BUDGET = timedelta(days=1)
"""The longest complete-by or pickup budget: a deadline must stay far from the calendar's end."""
DEPLOYABLE_BUDGETS = (timedelta(seconds=10), timedelta(minutes=5))
"""A deployed step's budget must be longer than the first and at most the second: an agent's
reply may take the Service Bus send timeout (10 s, retries included) to go out, so a shorter
budget expires steps that succeeded; and an agent holds its request's lock while it works, at
most the lock duration Service Bus allows (5 min), or a second agent takes the request."""
START_SLACK = timedelta(seconds=2)
"""Added to a claimed step's deadline: an agent that starts the request within it still has a
whole budget before the deadline, so it records no start (sas/services/agent.py)."""
MAX_DETAILS_JSON = 30_000
"""Characters of an order's details as stored (ASCII JSON in one Table property of 64 KiB)."""
MAX_FAILURES_LIMIT = 100
MAX_VERSION = 9999
MAX_IN_FLIGHT = 100_000
APP_SETTING = re.compile(r"(?=[A-Z0-9_]{3,64}\Z)[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*\Z")
"""A Python agent's own app setting: an environment variable name, without ``__`` (which the
Functions host reads as a section separator)."""
RESERVED_SETTING_PREFIXES = ("SAS_", "AZURE", "FUNCTIONS_", "WEBSITE", "APPLICATIONINSIGHTS_")

FailurePolicy = Literal["compensate", "error", "continue"]
"""What a step's final failure (refused for good, or out of attempts) does: ``compensate``
undoes the completed steps; ``error`` stops in Error for an operator; ``continue`` skips the
step and goes on without its result."""
FAILURE_POLICIES: tuple[FailurePolicy, ...] = ("compensate", "error", "continue")


def check_name(label: str, value: object) -> None:
    """ValueError unless ``value`` is a name sas can derive keys, settings and queues from."""
    if not isinstance(value, str) or not STEP_NAME.matches(value) or len(value) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{label} {value!r} must be snake_case: a lowercase letter, then lowercase letters "
            f"and digits with single underscores between them, 2 to {MAX_NAME_LENGTH} characters"
        )


@dataclass(frozen=True)
class StepDefinition:
    name: str
    agent: str
    action: str
    budget: timedelta
    """Complete-by budget: how long one attempt of this step may take, end to end."""
    undo: str | None = None
    """The compensating action (same agent), or None if the step needs no undoing."""
    input: (
        Callable[[Mapping[str, Any], Mapping[str, Mapping[str, Any]]], Mapping[str, Any]] | None
    ) = None
    """The step's data from the workflow's input and what the steps before it returned (by
    step name); None: the input as it is. Either way the data also holds ``order_id``. Called
    at each dispatch of the step (a retry's too): a pure function of its arguments."""
    max_failures: int | None = None
    """Expiries of one attempt after another before the step counts as failed for good
    (compensation or Error); None: the app's ``SAS_MAX_FAILURES``."""
    on_failure: FailurePolicy | None = None
    """What this step's final failure does (``FailurePolicy``); None: the workflow's."""

    def __post_init__(self) -> None:
        labelled = [("step name", self.name), ("agent", self.agent), ("action", self.action)]
        if self.undo is not None:
            labelled.append(("undo action", self.undo))
        for label, value in labelled:
            check_name(label, value)
        if not timedelta(0) < self.budget <= MAX_BUDGET:
            raise ValueError(f"step {self.name!r}: budget must be positive, at most a day")
        failures = self.max_failures
        if failures is not None and (
            type(failures) is not int or not 1 <= failures <= MAX_FAILURES_LIMIT
        ):
            raise ValueError(f"step {self.name!r}: max_failures must be an int from 1 to 100")
        if self.input is not None and not callable(self.input):
            raise ValueError(f"step {self.name!r}: input must be a function (details, results)")
        if self.on_failure is not None and self.on_failure not in FAILURE_POLICIES:
            raise ValueError(
                f"step {self.name!r}: on_failure must be one of {', '.join(FAILURE_POLICIES)}"
            )
        if self.on_failure == "continue" and self.undo is not None:
            raise ValueError(
                f"step {self.name!r}: a step that may be skipped (on_failure 'continue') has "
                "no undo: a skipped attempt may have been applied, and nothing would undo it"
            )


@dataclass(frozen=True)
class Workflow:
    name: str
    steps: tuple[StepDefinition, ...]
    pickup_budget: timedelta = timedelta(minutes=2)
    """How long a Pending record may wait for a Scheduler before the Supervisor acts."""
    on_failure: Literal["compensate", "error"] = "compensate"
    """When a step fails for good: undo the completed steps, or stop in Error for an operator;
    a step's own ``on_failure`` overrides it."""
    input: type[BaseModel] | None = None
    """The schema of the workflow's input (an order's ``details``); None: any JSON object."""
    version: int = 1
    """Orders are bound to the version they were submitted on and run on its steps to their
    end: a change to the steps (names, order, agents, actions, undo) is a new version, declared
    beside the old one until the old one's orders have drained (docs/your-workflow.md)."""
    max_in_flight: int | None = None
    """Orders of this workflow (every version) in flight at once; more wait in the waiting
    room until a sweep finds room (high priority excepted). None: no limit. An order holds its
    place from its submission until it finishes well, or until a sweep drops its marker after
    an Error (docs/architecture.md, "Bounded work in flight"), so it allows about
    max_in_flight / (latency + a sweep period) orders/s."""

    def __post_init__(self) -> None:
        check_name("workflow name", self.name)
        if type(self.version) is not int or not 1 <= self.version <= MAX_VERSION:
            raise ValueError(f"workflow {self.name!r}: version must be an int from 1 to 9999")
        if not isinstance(self.steps, tuple) or not self.steps:
            raise ValueError(f"workflow {self.name!r}: steps must be a non-empty tuple")
        if len(self.steps) > MAX_STEPS:
            raise ValueError(f"workflow {self.name!r} has more than {MAX_STEPS} steps")
        if not timedelta(0) < self.pickup_budget <= MAX_BUDGET:
            raise ValueError(
                f"workflow {self.name!r}: pickup_budget must be positive, at most a day"
            )
        limit = self.max_in_flight
        if limit is not None and (type(limit) is not int or not 1 <= limit <= MAX_IN_FLIGHT):
            raise ValueError(
                f"workflow {self.name!r}: max_in_flight must be an int from 1 to {MAX_IN_FLIGHT}"
            )
        if self.on_failure not in ("compensate", "error"):
            raise ValueError(f"workflow {self.name!r}: on_failure must be 'compensate' or 'error'")
        if self.input is not None and not (
            isinstance(self.input, type) and issubclass(self.input, BaseModel)
        ):
            raise ValueError(f"workflow {self.name!r}: input must be a pydantic model class")
        names = [step.name for step in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"workflow {self.name!r} repeats a step name")

    def parse_input(self, details: dict[str, Any]) -> dict[str, Any]:
        """``details`` as the input schema reads it (JSON data); ValueError naming what is wrong,
        never echoing a value."""
        try:  # NaN, a lone surrogate or absurd nesting: no JSON document can carry them
            text = json.dumps(details, allow_nan=False, ensure_ascii=False)
            text.encode("utf-8")
        except (TypeError, ValueError, RecursionError):
            raise ValueError("details are not JSON data") from None
        parsed = details
        if self.input is not None:
            try:
                parsed = self.input.model_validate_json(text).model_dump(mode="json")
            except ValidationError as exc:
                raise ValueError(f"invalid details: {problems(exc, '<details>')}") from None
        size = len(json.dumps(parsed, separators=(",", ":")))
        if size > MAX_DETAILS_JSON:
            raise ValueError(f"details too large to keep: {size} > {MAX_DETAILS_JSON} characters")
        return parsed

    @property
    def label(self) -> str:
        """``name v<version>``: how logs, alerts and the operator's views name it."""
        return f"{self.name} v{self.version}"

    @property
    def definition(self) -> dict[str, Any]:
        """What an order bound to this version relies on staying the same while it runs: the
        steps in order, each one's agent, action and undo, and what a failure does. Budgets,
        retries and input builders may change under running orders."""
        return {
            "workflow": self.name,
            "version": self.version,
            "on_failure": self.on_failure,
            "steps": [
                {"name": s.name, "agent": s.agent, "action": s.action, "undo": s.undo}
                | ({} if s.on_failure is None else {"on_failure": s.on_failure})
                for s in self.steps
            ],
        }

    @property
    def fingerprint(self) -> str:
        """A digest of ``definition``: kept with every order bound to this version."""
        text = json.dumps(self.definition, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def failure_policy(self, index: int) -> FailurePolicy:
        """What step ``index``'s final failure does: its own policy, else the workflow's."""
        return self.step(index).on_failure or self.on_failure

    def step(self, index: int) -> StepDefinition:
        if not 0 <= index < len(self.steps):
            raise IndexError(f"workflow {self.name!r} has no step {index}")
        return self.steps[index]

    def step_data(
        self,
        index: int,
        order_id: str,
        details: Mapping[str, Any],
        results: Mapping[str, Mapping[str, Any]],
        mode: Mode = "do",
    ) -> dict[str, Any]:
        """What step ``index`` is sent to do. Its undo gets the details (and, from the agent
        runner, what the step returned), never the builder's data: a builder that fails must not
        stop compensation. Raises what the builder raises, or TypeError or ValueError if what it
        built is no JSON object (a NaN, a datetime): whoever checks the data checks this."""
        build = self.step(index).input if mode == "do" else None
        data = {**(details if build is None else build(details, results)), "order_id": order_id}
        json.dumps(data, allow_nan=False)
        return data

    def next_undo(self, index: int) -> int | None:
        """The highest step at or below ``index`` that has an undo action."""
        for candidate in range(min(index, len(self.steps) - 1), -1, -1):
            if self.steps[candidate].undo is not None:
                return candidate
        return None

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(step.agent for step in self.steps))

    @property
    def longest_budget(self) -> timedelta:
        return max(step.budget for step in self.steps)

    @property
    def shortest_budget(self) -> timedelta:
        """No transition sets a deadline nearer than this to its own time."""
        return min(self.pickup_budget, *(step.budget + START_SLACK for step in self.steps))


@dataclass(frozen=True)
class PythonAgent:
    """An agent whose actions are functions of the app, run in the agent's own function:
    ``action(context, data) -> result`` (``sas/actions.py``). Every other agent is a remote
    HTTP service (``SAS_REMOTE_<AGENT>_URL``)."""

    name: str
    actions: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    tables: tuple[str, ...] = ()
    """Tables of the app's storage account where the actions keep what they did (``app_table``
    in sas/actions.py): provisioned with the app's own, by Bicep and locally."""
    settings: Mapping[str, str] = field(default_factory=dict)
    """App settings the actions read (``ActionContext.setting``), each with the value a
    local run uses; in Azure each is a required deployment parameter."""

    def __post_init__(self) -> None:
        for label, value in (("agent", self.name), *(("action", a) for a in self.actions)):
            check_name(label, value)
            if label == "action" and not callable(self.actions[value]):
                raise ValueError(f"agent {self.name!r}: action {value!r} is not a function")
        if not isinstance(self.tables, tuple):
            raise ValueError(f"agent {self.name!r}: tables must be a tuple of names")
        for key, value in dict(self.settings).items():
            if (
                not isinstance(key, str)
                or not APP_SETTING.match(key)
                or key.startswith(RESERVED_SETTING_PREFIXES)
            ):
                raise ValueError(
                    f"agent {self.name!r}: setting {key!r} must be 3-64 of A-Z, 0-9 and single "
                    f"underscores, not starting with {', '.join(RESERVED_SETTING_PREFIXES)}"
                )
            if not isinstance(value, str) or not 0 < len(value) <= 1000:
                raise ValueError(f"agent {self.name!r}: setting {key}'s local value must be text")
        for table in self.tables:
            if not isinstance(table, str) or not TABLE_NAME_RULE.matches(table):
                raise ValueError(
                    f"agent {self.name!r}: table {table!r} must match {TABLE_NAME_RULE.body}"
                )


@dataclass(frozen=True)
class Registry:
    """Every workflow an application runs, by name, and what follows from them."""

    workflows: tuple[Workflow, ...]
    python_agents: tuple[PythonAgent, ...] = ()
    """The agents whose actions are Python functions; the rest call remote HTTP services."""

    def __post_init__(self) -> None:
        if not isinstance(self.workflows, tuple) or not self.workflows:
            raise ValueError("workflows must be a non-empty tuple")
        if not isinstance(self.python_agents, tuple):
            raise ValueError("python_agents must be a tuple")
        versions = [(workflow.name, workflow.version) for workflow in self.workflows]
        for name, version in versions:
            if versions.count((name, version)) > 1:
                raise ValueError(f"two workflows share a name and version ({name} v{version})")
        self._check_python_agents()
        self.settings  # noqa: B018 - two local values for one setting fail here, at start
        self.tables  # noqa: B018 - and two names for one table

    def _check_python_agents(self) -> None:
        declared = [agent.name for agent in self.python_agents]
        if len(set(declared)) != len(declared):
            raise ValueError("two Python agents share a name")
        for agent in self.python_agents:
            if agent.name not in self.agents:
                raise ValueError(f"Python agent {agent.name!r}: no step names it")
        by_name = {agent.name: agent for agent in self.python_agents}
        for workflow in self.workflows:
            for step in workflow.steps:
                found = by_name.get(step.agent)
                for action in (step.action, step.undo):
                    if found is not None and action is not None and action not in found.actions:
                        raise ValueError(
                            f"workflow {workflow.name!r}, step {step.name!r}: agent "
                            f"{step.agent!r} has no action {action!r}"
                        )

    @property
    def settings(self) -> dict[str, str]:
        """The app settings the Python agents read, each with its local value."""
        found: dict[str, str] = {}
        for agent in self.python_agents:
            for key, value in agent.settings.items():
                if found.setdefault(key, value) != value:
                    raise ValueError(f"setting {key}: two Python agents give it two local values")
        return found

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables the Python agents keep their records in, each once."""
        found = tuple(dict.fromkeys(t for agent in self.python_agents for t in agent.tables))
        if len({table.lower() for table in found}) != len(found):
            raise ValueError("two Python agents' tables differ only in case (one table)")
        return found

    @property
    def http_agents(self) -> tuple[str, ...]:
        """The agents that call a remote HTTP service: each needs its URL setting."""
        python = {agent.name for agent in self.python_agents}
        return tuple(agent for agent in self.agents if agent not in python)

    def named(self, name: str, version: int | None = None) -> Workflow:
        """The newest version of workflow ``name``, or the one ``version`` names; ValueError
        if there is none."""
        found = [w for w in self.workflows if w.name == name]
        if not found:
            raise ValueError(f"unknown workflow {name!r}")
        if version is None:
            return max(found, key=lambda w: w.version)
        for workflow in found:
            if workflow.version == version:
                return workflow
        raise ValueError(f"workflow {name!r} has no version {version}")

    def versions(self, name: str) -> tuple[int, ...]:
        return tuple(sorted(w.version for w in self.workflows if w.name == name))

    def bound(self, name: str, version: int, fingerprint: str = "") -> Workflow:
        """The definition an order was bound to: ``name`` at ``version``, unchanged since the
        order began (``fingerprint``; empty: an order older than fingerprints). An order is
        never run on another: DefinitionMissing says why there is none here."""
        deployed = self.versions(name)
        if version not in deployed:
            newer = not deployed or version > deployed[-1]
            raise DefinitionMissing(f"{name} v{version} is not deployed", newer=newer)
        workflow = self.named(name, version)
        if fingerprint and fingerprint != workflow.fingerprint:
            raise DefinitionMissing(
                f"{name} v{version} changed since the order began (a change of steps must be "
                "a new version)"
            )
        return workflow

    def undeployable(self) -> list[str]:
        """What in these declarations a deployment cannot run, each saying why; the app's
        registry is checked at start (sas/declared.py) and by the test harness."""
        shortest, longest = DEPLOYABLE_BUDGETS
        return [
            f"workflow {workflow.name!r} v{workflow.version}, step {step.name!r}: budget "
            f"{step.budget.total_seconds():g} s must be longer than {shortest.seconds} s (an "
            f"agent's reply may take the {shortest.seconds} s Service Bus send timeout to go "
            f"out) and at most {longest.seconds // 60} min (the longest Service Bus lock, held "
            "while the agent works)"
            for workflow in self.workflows
            for step in workflow.steps
            if not shortest < step.budget <= longest
        ]

    @property
    def names(self) -> tuple[str, ...]:
        """Each workflow's name, once."""
        return tuple(dict.fromkeys(w.name for w in self.workflows))

    def __contains__(self, name: object) -> bool:
        return any(workflow.name == name for workflow in self.workflows)

    @property
    def agents(self) -> tuple[str, ...]:
        """Every agent a step names, in the order first named."""
        return tuple(dict.fromkeys(a for workflow in self.workflows for a in workflow.agents))

    @property
    def longest_step_budget(self) -> timedelta:
        """No attempt of any step may take longer: an agent never works past it, whatever
        deadline a (forged or corrupted) request names."""
        return max(workflow.longest_budget for workflow in self.workflows)

    @property
    def shortest_budget(self) -> timedelta:
        """No transition of any workflow sets a deadline nearer than this to its own time."""
        return min(workflow.shortest_budget for workflow in self.workflows)

"""Load ``function_app.py``, index its functions, resolve ``%Setting%`` references and run
the functions' own settings checks."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

from sas.domain.wire import QUEUE_NAME
from sas_local.devhost.config import DevHostError
from sas_local.devhost.schedule import Schedule, parse_schedule

QUEUE_TRIGGER = "queueTrigger"
TIMER_TRIGGER = "timerTrigger"
HTTP_TRIGGER = "httpTrigger"
SERVICE_BUS_TRIGGER = "serviceBusTrigger"
DEFAULT_CONNECTION = "AzureWebJobsStorage"
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")

_SETTING_REF = re.compile(r"%([^%]+)%")


@dataclass(frozen=True)
class IndexedFunction:
    """One function as the app declares it (nothing resolved yet)."""

    name: str
    trigger_type: str
    arg_name: str
    fn: Callable[..., Any]
    trigger: Any
    other_bindings: tuple[str, ...]
    http_type: str


@dataclass(frozen=True)
class LoadedApp:
    path: Path
    module: ModuleType
    app: Any
    functions: tuple[IndexedFunction, ...]


@dataclass(frozen=True)
class QueueFunction:
    name: str
    arg_name: str
    fn: Callable[..., Any]
    queue_name: str
    connection_setting: str
    connection_string: str = field(repr=False)


@dataclass(frozen=True)
class TimerFunction:
    name: str
    arg_name: str
    fn: Callable[..., Any]
    schedule_expression: str
    schedule: Schedule
    run_on_startup: bool


@dataclass(frozen=True)
class HttpFunction:
    name: str
    arg_name: str
    fn: Callable[..., Any]
    route: str
    methods: frozenset[str]
    http_type: str


@dataclass(frozen=True)
class Plan:
    queues: tuple[QueueFunction, ...]
    timers: tuple[TimerFunction, ...]
    http: tuple[HttpFunction, ...]

    @property
    def names(self) -> tuple[str, ...]:
        every: list[QueueFunction | TimerFunction | HttpFunction] = [
            *self.queues,
            *self.timers,
            *self.http,
        ]
        return tuple(sorted(function.name for function in every))


def load_app(path: Path) -> LoadedApp:
    """Import the app module from its path and index ``app.get_functions()`` (called once)."""
    path = path.resolve()
    if not path.is_file():
        raise DevHostError(f"function app {path} does not exist (use --app PATH)")
    app_dir = str(path.parent)
    if app_dir not in sys.path:
        sys.path.insert(0, app_dir)
    module_name = path.stem
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise DevHostError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    app = getattr(module, "app", None)
    if app is None or not callable(getattr(app, "get_functions", None)):
        raise DevHostError(f"{path} has no module-level `app` (a FunctionApp or AsgiFunctionApp)")
    functions = tuple(_index(function) for function in app.get_functions())
    return LoadedApp(path=path, module=module, app=app, functions=functions)


def _index(function: Any) -> IndexedFunction:
    name = str(function.get_function_name())
    trigger = function.get_trigger()
    if trigger is None:
        raise DevHostError(f"function {name!r} has no trigger")
    others = tuple(
        str(binding.type)
        for binding in function.get_bindings()
        if binding is not trigger and not _is_http_return(binding)
    )
    return IndexedFunction(
        name=name,
        trigger_type=str(trigger.type),
        arg_name=str(trigger.name),
        fn=function.get_user_function(),
        trigger=trigger,
        other_bindings=others,
        http_type=str(getattr(function, "http_type", "function")),
    )


def _is_http_return(binding: Any) -> bool:
    return str(binding.type) == "http" and str(binding.name) == "$return"


def expand(value: str, settings: Mapping[str, str], function: str, what: str) -> str:
    """Replace every ``%Name%`` in ``value`` by the setting ``Name``; name a missing one."""

    def lookup(match: re.Match[str]) -> str:
        key = match.group(1)
        resolved = settings.get(key)
        if resolved is None or resolved == "":
            raise DevHostError(
                f"setting {key!r} is not set (function {function!r} uses %{key}% as its {what}); "
                "set it in the environment or in local.settings.json Values"
            )
        return resolved

    return _SETTING_REF.sub(lookup, value)


def queue_name(name: str, function: str) -> str:
    """Lower-cased and validated, as the Functions host normalises queue trigger names."""
    normalised = name.lower()
    if not QUEUE_NAME.matches(normalised):
        raise DevHostError(
            f"function {function!r}: {name!r} is not a valid queue name (3-63 characters: "
            "lowercase letters, digits and single hyphens, starting and ending alphanumeric)"
        )
    return normalised


def connection_string(setting: str | None, settings: Mapping[str, str], function: str) -> str:
    """The connection string a binding's ``connection`` names (only connection strings)."""
    name = setting or DEFAULT_CONNECTION
    for key in (name, f"AzureWebJobs{name}"):
        value = settings.get(key)
        if value:
            return value
    if any(key.startswith(f"{name}__") for key in settings):
        raise DevHostError(
            f"connection {name!r} of function {function!r} is identity-based ({name}__...); "
            f"the dev host needs a connection string in setting {name!r}"
        )
    raise DevHostError(
        f"connection setting {name!r} (function {function!r}) is not set; set it to a storage "
        "connection string in the environment or in local.settings.json Values"
    )


def select(
    functions: Sequence[IndexedFunction], only: Sequence[str] | None
) -> list[IndexedFunction]:
    if not only:
        return list(functions)
    known = {function.name for function in functions}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise DevHostError(
            f"--functions names unknown function(s) {', '.join(unknown)}; "
            f"the app has: {', '.join(sorted(known))}"
        )
    wanted = set(only)
    return [function for function in functions if function.name in wanted]


def resolve(
    functions: Iterable[IndexedFunction], settings: Mapping[str, str], *, timers: bool = True
) -> Plan:
    """Check each selected function is runnable here and resolve its settings."""
    queues: list[QueueFunction] = []
    timer_functions: list[TimerFunction] = []
    http: list[HttpFunction] = []
    for function in functions:
        _check_supported(function)
        _check_signature(function)
        trigger = function.trigger
        if function.trigger_type == QUEUE_TRIGGER:
            queue = queue_name(
                expand(str(trigger.queue_name), settings, function.name, "queue name"),
                function.name,
            )
            setting = expand(str(trigger.connection or ""), settings, function.name, "connection")
            queues.append(
                QueueFunction(
                    name=function.name,
                    arg_name=function.arg_name,
                    fn=function.fn,
                    queue_name=queue,
                    connection_setting=setting or DEFAULT_CONNECTION,
                    connection_string=connection_string(setting, settings, function.name),
                )
            )
        elif function.trigger_type == TIMER_TRIGGER:
            if not timers:
                continue
            expression = expand(str(trigger.schedule), settings, function.name, "schedule")
            timer_functions.append(
                TimerFunction(
                    name=function.name,
                    arg_name=function.arg_name,
                    fn=function.fn,
                    schedule_expression=expression,
                    schedule=parse_schedule(expression, function.name),
                    run_on_startup=bool(trigger.run_on_startup),
                )
            )
        else:
            http.append(
                HttpFunction(
                    name=function.name,
                    arg_name=function.arg_name,
                    fn=function.fn,
                    route=str(trigger.route if trigger.route is not None else function.name),
                    methods=_methods(trigger.methods),
                    http_type=function.http_type,
                )
            )
    return Plan(queues=tuple(queues), timers=tuple(timer_functions), http=tuple(http))


def preflight(plan: Plan, settings: Mapping[str, str]) -> None:
    """Run each function's own settings check, where it carries one (a ``preflight`` attribute:
    called with the settings, it raises naming what is missing), before the host starts it:
    DevHostError naming the function and the problem."""
    functions: list[QueueFunction | TimerFunction | HttpFunction] = [
        *plan.queues,
        *plan.timers,
        *plan.http,
    ]
    for function in functions:
        check = getattr(function.fn, "preflight", None)
        if not callable(check):
            continue
        try:
            check(settings)
        except Exception as exc:  # the app's own check: whatever it raises is the reason
            raise DevHostError(f"function {function.name!r} cannot run: {exc}") from None


def _check_supported(function: IndexedFunction) -> None:
    if function.trigger_type == SERVICE_BUS_TRIGGER:
        raise DevHostError(
            f"function {function.name!r} has a serviceBusTrigger, but the dev host runs Storage "
            "Queue triggers only: set SAS_TRANSPORT=storage (and point the queue settings at "
            "Azurite), then start the dev host again"
        )
    if function.trigger_type not in (QUEUE_TRIGGER, TIMER_TRIGGER, HTTP_TRIGGER):
        raise DevHostError(
            f"function {function.name!r} has a {function.trigger_type} trigger, which the dev "
            "host does not support (queueTrigger, timerTrigger, httpTrigger); "
            "leave it out with --functions"
        )
    if function.other_bindings:
        raise DevHostError(
            f"function {function.name!r} declares binding(s) {', '.join(function.other_bindings)}; "
            "the dev host supports trigger bindings only (use SDK clients in the function)"
        )


def _check_signature(function: IndexedFunction) -> None:
    parameters = inspect.signature(function.fn).parameters
    if function.arg_name not in parameters:
        raise DevHostError(
            f"function {function.name!r} has no parameter {function.arg_name!r} for its trigger"
        )
    for parameter in parameters.values():
        unbound = parameter.name not in (function.arg_name, "context")
        if unbound and parameter.default is inspect.Parameter.empty:
            raise DevHostError(
                f"function {function.name!r}: parameter {parameter.name!r} has no binding"
            )


def _methods(methods: Any) -> frozenset[str]:
    if methods is None:
        return frozenset(HTTP_METHODS)
    names = frozenset(
        str(method.value if isinstance(method, Enum) else method).upper() for method in methods
    )
    return names or frozenset(HTTP_METHODS)

"""Queue-triggered roles: submit, schedule, on_reply and one agent per remote service.

Each role below is one plain function: decode the message, call the role's handler with this
process's context. A malformed or hostile message is recorded with its reason and original
body, and the function returns normally so the message is settled: no retry storm, no partial
write. Infrastructure failures (store or queue unavailable) still raise, so the host retries.

Every role is registered once per priority lane (``submit``, ``submit_high``, ``submit_low``,
...), each triggered by its own queue, so a lane's backlog never delays another lane's
messages; the priority that matters travels in the order's state and messages.
"""

# No `from __future__ import annotations` here: the Functions worker reads the parameter
# annotations at index time and needs the real message class of the chosen transport.

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

import azure.functions as func

from sas import bootstrap, settings
from sas.domain.errors import InvalidMessage
from sas.domain.messages import (
    Message,
    OrderSubmitted,
    ScheduleRequest,
    StepReply,
    StepRequest,
    decode,
)
from sas.domain.wire import PRIORITIES, lane_function_name, lane_setting
from sas.entrypoints.triggers import TRANSPORT_IN_USE, queue_trigger
from sas.services import agent, scheduler, submission, telemetry
from sas.settings import AGENTS

if TYPE_CHECKING:
    QueueMessage = func.QueueMessage | func.ServiceBusMessage
else:
    QueueMessage = func.ServiceBusMessage if TRANSPORT_IN_USE == "servicebus" else func.QueueMessage

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)
blueprint = func.Blueprint()  # type: ignore[no-untyped-call]


def submit(msg: QueueMessage, function: str, queue_setting: str) -> None:
    """Submission: an application's order (sas/services/submission.py)."""
    handle(
        msg,
        function=function,
        queue_setting=queue_setting,
        model=OrderSubmitted,
        handler=_with_context(submission.submit),
    )


def schedule(msg: QueueMessage, function: str, queue_setting: str) -> None:
    """The Scheduler claims a Pending order (a retry, compensation, a resubmit)."""
    handle(
        msg,
        function=function,
        queue_setting=queue_setting,
        model=ScheduleRequest,
        handler=_with_context(scheduler.schedule),
    )


def on_reply(msg: QueueMessage, function: str, queue_setting: str) -> None:
    """The Scheduler applies an agent's reply and dispatches what follows."""
    handle(
        msg,
        function=function,
        queue_setting=queue_setting,
        model=StepReply,
        handler=_with_context(scheduler.on_reply),
    )


def run_step(name: str) -> Callable[[QueueMessage, str, str], None]:
    """The agent ``name``: one step request, one remote service (sas/services/agent.py). An
    agent missing a setting it needs (its service's URL) fails, naming it, and takes nothing."""

    def run(msg: QueueMessage, function: str, queue_setting: str) -> None:
        bootstrap.check_agent(name)

        def step(request: StepRequest) -> object:
            return agent.run_step(bootstrap.agent_context(), name, request)

        handle(msg, function=function, queue_setting=queue_setting, model=StepRequest, handler=step)

    return run


class InboundMessage(Protocol):
    """What Storage Queue and Service Bus trigger messages have in common."""

    def get_body(self) -> bytes: ...


def _properties(message: InboundMessage) -> Mapping[str | bytes, object] | None:
    """A Service Bus message's application properties (None for a Storage Queue message)."""
    found = getattr(message, "application_properties", None) or getattr(
        message, "user_properties", None
    )
    return found if isinstance(found, Mapping) else None


def handle(
    message: InboundMessage,
    *,
    function: str,
    queue_setting: str,
    model: type[M],
    handler: Callable[[M], object],
) -> object:
    body = message.get_body()
    try:
        decoded = decode(model, body)
        with telemetry.continued(telemetry.carrier_from(decoded, _properties(message))):
            return handler(decoded)
    except InvalidMessage as exc:
        queue = bootstrap.settings().queues.get(queue_setting, queue_setting)
        parked_id = bootstrap.store().park_message(queue, exc.reason, body, bootstrap.clock().now())
        log.warning(
            "sas.message_parked function=%s reason=%s",
            function,
            exc.reason,
            extra={"function": function, "queue": queue, "parked_id": parked_id},
        )
        return None


def _with_context(handler: Callable[..., object]) -> Callable[..., object]:
    return lambda message: handler(bootstrap.context(), message)


Preflight = Callable[[Mapping[str, str]], None]


def _register(
    role: Callable[[QueueMessage, str, str], None],
    name: str,
    setting: str,
    preflight: Preflight | None = None,
) -> None:
    """``role`` as one function per priority lane of the queue ``setting`` names."""
    for priority in PRIORITIES:
        function, lane = lane_function_name(name, priority), lane_setting(setting, priority)
        blueprint.function_name(function)(
            queue_trigger(blueprint, lane)(_lane(role, function, lane, preflight))
        )


def _lane(
    role: Callable[[QueueMessage, str, str], None],
    function: str,
    lane: str,
    preflight: Preflight | None,
) -> Callable[[QueueMessage], None]:
    # A function of its own per lane: the worker binds every parameter, so `msg` is the only one.
    def run(msg: QueueMessage) -> None:
        role(msg, function, lane)

    run.__name__ = run.__qualname__ = function
    if preflight is not None:
        # The settings check the local dev host runs before it starts the function (Azure has
        # no such hook: there the function fails at its first message, naming the setting).
        run.preflight = preflight  # type: ignore[attr-defined]
    return run


def _agent_preflight(name: str) -> Preflight:
    return lambda env: bootstrap.check_agent(name, env)


_register(submit, "submit", settings.QUEUE_ORDERS)
_register(schedule, "schedule", settings.QUEUE_SCHEDULER)
_register(on_reply, "on_reply", settings.QUEUE_REPLIES)
for _agent in AGENTS:
    _register(
        run_step(_agent),
        f"agent_{_agent}",
        settings.agent_queue_setting(_agent),
        _agent_preflight(_agent),
    )

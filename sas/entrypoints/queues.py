"""Queue-triggered roles: submit, schedule, on_reply and one agent per remote service.

Each is registered once per priority lane (sas/domain/wire.py, ``Priority``): ``submit``,
``submit_high``, ``submit_low`` and so on, each triggered by its own queue, so a lane's backlog
never delays another lane's messages. A lane's function does exactly what the normal one does:
the priority that matters travels in the order's state and messages.
"""

# No `from __future__ import annotations` here: the Functions worker reads the parameter
# annotations at index time and needs the real message class of the chosen transport.

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import azure.functions as func

from sas import bootstrap, settings
from sas.domain.messages import (
    Message,
    OrderSubmitted,
    ScheduleRequest,
    StepReply,
    StepRequest,
)
from sas.domain.wire import PRIORITIES, lane_function_name, lane_setting
from sas.domain.workflow import AGENTS
from sas.entrypoints.inbound import handle
from sas.entrypoints.triggers import TRANSPORT_IN_USE, queue_trigger

if TYPE_CHECKING:
    QueueMessage = func.QueueMessage | func.ServiceBusMessage
else:
    QueueMessage = func.ServiceBusMessage if TRANSPORT_IN_USE == "servicebus" else func.QueueMessage

blueprint = func.Blueprint()  # type: ignore[no-untyped-call]


def _register(
    function: str,
    queue_setting: str,
    model: type[Message],
    handler: Callable[[Any], object],
) -> None:
    """One function per priority lane of ``queue_setting``, all with the same handler."""
    for priority in PRIORITIES:
        name = lane_function_name(function, priority)
        lane = lane_setting(queue_setting, priority)
        run = _trigger_body(name, lane, model, handler)
        blueprint.function_name(name)(queue_trigger(blueprint, lane)(run))


def _trigger_body(
    name: str, lane: str, model: type[Message], handler: Callable[[Any], object]
) -> Callable[[QueueMessage], None]:
    # A function of its own per lane: the worker binds every parameter, so `msg` is the only one.
    def run(msg: QueueMessage) -> None:
        handle(msg, function=name, queue_setting=lane, model=model, handler=handler)

    run.__name__ = run.__qualname__ = name
    return run


_register(
    "submit",
    settings.QUEUE_ORDERS,
    OrderSubmitted,
    lambda message: bootstrap.submission().submit(message),
)
_register(
    "schedule",
    settings.QUEUE_SCHEDULER,
    ScheduleRequest,
    lambda message: bootstrap.scheduler().schedule(message),
)
_register(
    "on_reply",
    settings.QUEUE_REPLIES,
    StepReply,
    lambda message: bootstrap.scheduler().on_reply(message),
)


def _agent_handler(agent: str) -> Callable[[StepRequest], object]:
    return lambda message: bootstrap.agent(agent).handle(message)


for _agent in AGENTS:
    _register(
        f"agent_{_agent}", settings.agent_queue_setting(_agent), StepRequest, _agent_handler(_agent)
    )
